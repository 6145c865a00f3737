"""The event types of the bus that ingestion applies (docs/data_contracts.md, "Bus events")."""

CHAT_MESSAGE_CREATED = "chat.message.created"
DOC_UPSERTED = "doc.upserted"
FILE_UPLOADED = "file.uploaded"
DOC_DELETED = "doc.deleted"
UPSERT_TYPES = (CHAT_MESSAGE_CREATED, DOC_UPSERTED, FILE_UPLOADED)
EVENT_TYPES = (*UPSERT_TYPES, DOC_DELETED)
# The specification's own spellings, accepted as types and as bus subjects.
TYPE_ALIASES = {"doc.upsert": DOC_UPSERTED, "message.created": CHAT_MESSAGE_CREATED}
# Every subject the consumer reads: the types and their aliases.
SUBJECT_TYPES = (*EVENT_TYPES, *TYPE_ALIASES)


def canonical_type(event_type: str) -> str:
    """The event type an alias stands for (any other name unchanged)."""
    return TYPE_ALIASES.get(event_type, event_type)
