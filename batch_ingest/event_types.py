"""The event types of the bus that ingestion applies (docs/data_contracts.md, "Bus events"),
and the subjects they travel on."""

import base64
import re
from typing import NamedTuple

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
# ``<prefix>rag.team.<team>.<type>.<producer>``: the team is in the subject, so the bus's own
# subject permissions bind a publisher to its teams (docs/operations.md, "The event bus"), and
# the consumer refuses an event whose ``meta.team_id`` is another team's. The last token names
# the producer credential (``python -m batch_ingest.bus_auth issue NAME``), whose permissions
# allow that name only: the bus itself vouches for who published, and the audit log records
# it. ``<prefix>rag.team.<team>.<type>`` (no producer) stays readable for the service users
# (the consumer, operators) and for a bus without authentication; its events are audited as
# unattributed. A team id that is not one plain subject token (letters, digits, ``_``, ``-``)
# is written ``=`` + its UTF-8 in unpadded base64url, which no plain token starts with.

TEAM_SUBJECTS = "rag.team"
_PLAIN_TOKEN = re.compile(r"[A-Za-z0-9_-]+")
# A producer credential's name, which is also its subject token.
PRODUCER_NAME = re.compile(r"[a-z][a-z0-9_-]{0,63}")


class SubjectParts(NamedTuple):
    """What an event subject says: its team (``None``: none, or not a team token), its type
    (canonical) and the producer it names (``""``: none)."""

    team: str | None
    type: str
    producer: str = ""


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


def event_subject(team_id: str, event_type: str, prefix: str = "", producer: str = "") -> str:
    """Where ``producer`` (a credential's name; ``""``: a service user) publishes an event of
    ``team_id``."""
    subject = f"{prefix}{TEAM_SUBJECTS}.{team_token(team_id)}.{event_type}"
    return f"{subject}.{producer}" if producer else subject


def stream_subjects(prefix: str = "") -> list[str]:
    """The subjects of the event stream: every type and alias, any team, with and without
    a producer."""
    plain = [f"{prefix}{TEAM_SUBJECTS}.*.{t}" for t in SUBJECT_TYPES]
    return plain + [f"{s}.*" for s in plain]


def notice_subject(team_id: str, kind: str, prefix: str = "") -> str:
    """The team's notices: ``kind`` is ``indexed`` or ``deleted``."""
    return f"{prefix}{TEAM_SUBJECTS}.{team_token(team_id)}.document.{kind}"


def parse_subject(subject: str, prefix: str = "") -> SubjectParts:
    """The parts of an event subject: the team ``None`` on a subject without one (the
    type-only subjects before issue 34), the type canonical (an alias names its type), the
    producer the token after the type (types have dots, but each is a fixed token sequence,
    so the split is unambiguous)."""
    name = subject[len(prefix) :] if prefix and subject.startswith(prefix) else subject
    head = TEAM_SUBJECTS + "."
    if not name.startswith(head):
        return SubjectParts(None, canonical_type(name))
    token, _, rest = name[len(head) :].partition(".")
    for known in SUBJECT_TYPES:
        if rest.startswith(known + ".") and "." not in rest[len(known) + 1 :]:
            return SubjectParts(token_team(token), canonical_type(known), rest[len(known) + 1 :])
    return SubjectParts(token_team(token), canonical_type(rest))
