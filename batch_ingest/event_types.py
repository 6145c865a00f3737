"""The event types of the bus that ingestion applies (docs/data_contracts.md, "Bus events"),
and the subjects they travel on."""

import base64
import re

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


# --- subjects: every event on its team's subject ------------------------------------------
#
# ``<prefix>rag.team.<team>.<type>``: the team is in the subject, so the bus's own subject
# permissions bind a publisher to its teams (docs/operations.md, "The event bus"), and the
# consumer refuses an event whose ``meta.team_id`` is another team's. A team id that is not
# one plain subject token (letters, digits, ``_``, ``-``) is written ``=`` + its UTF-8 in
# unpadded base64url, which no plain token starts with.

TEAM_SUBJECTS = "rag.team"
_PLAIN_TOKEN = re.compile(r"[A-Za-z0-9_-]+")


def team_token(team_id: str) -> str:
    """The subject token of ``team_id``."""
    if _PLAIN_TOKEN.fullmatch(team_id):
        return team_id
    return "=" + base64.urlsafe_b64encode(team_id.encode()).decode().rstrip("=")


def token_team(token: str) -> str | None:
    """The team id a subject token names (``None``: not a team token)."""
    if _PLAIN_TOKEN.fullmatch(token):
        return token
    if not token.startswith("=") or len(token) < 2:
        return None
    body = token[1:]
    try:
        team = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()
    except (ValueError, UnicodeDecodeError):
        return None
    return team if team_token(team) == token else None


def event_subject(team_id: str, event_type: str, prefix: str = "") -> str:
    """Where a producer publishes an event of ``team_id``."""
    return f"{prefix}{TEAM_SUBJECTS}.{team_token(team_id)}.{event_type}"


def stream_subjects(prefix: str = "") -> list[str]:
    """The subjects of the event stream: every type and alias, any team."""
    return [f"{prefix}{TEAM_SUBJECTS}.*.{t}" for t in SUBJECT_TYPES]


def notice_subject(team_id: str, kind: str, prefix: str = "") -> str:
    """The team's notices: ``kind`` is ``indexed`` or ``deleted``."""
    return f"{prefix}{TEAM_SUBJECTS}.{team_token(team_id)}.document.{kind}"


def parse_subject(subject: str, prefix: str = "") -> tuple[str | None, str]:
    """``(team, type)`` of an event subject: the team ``None`` on a subject without one (the
    type-only subjects before issue 34), the type canonical (an alias names its type)."""
    name = subject[len(prefix) :] if prefix and subject.startswith(prefix) else subject
    head = TEAM_SUBJECTS + "."
    if name.startswith(head):
        token, _, event_type = name[len(head) :].partition(".")
        return token_team(token), canonical_type(event_type)
    return None, canonical_type(name)
