"""The event types of the bus that ingestion applies (docs/data_contracts.md, "Bus events")."""

CHAT_MESSAGE_CREATED = "chat.message.created"
DOC_UPSERTED = "doc.upserted"
FILE_UPLOADED = "file.uploaded"
DOC_DELETED = "doc.deleted"
UPSERT_TYPES = (CHAT_MESSAGE_CREATED, DOC_UPSERTED, FILE_UPLOADED)
EVENT_TYPES = (*UPSERT_TYPES, DOC_DELETED)
