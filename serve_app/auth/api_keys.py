"""API keys of service agents, stored hashed in a YAML/JSON file.

A key looks like ``rgk_<id>_<secret>``: ``id`` is public (it names the file entry, so
verification is one lookup), ``secret`` is 256 random bits. The file stores only
``hmac-sha256:<hex>`` of the whole key, keyed with a pepper (``AUTH__API_KEY_PEPPER``) that
lives outside the file. A fast keyed hash is enough because the keys are random, not
passwords: nothing can be guessed faster than 2^256 tries, and a slow KDF (bcrypt, argon2)
would add tens of milliseconds to every request. The pepper means a leaked key file alone
cannot even confirm a guess. Digests are compared in constant time.

    python -m serve_app.auth new-api-key --team dao_greenfood=service --agent-id ag_ingest
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
)

from batch_ingest.documents import parse_timestamp
from deployments.errors import Unauthorized
from serve_app.auth.principal import Principal

logger = logging.getLogger(__name__)

PREFIX = "rgk_"
HASH_PREFIX = "hmac-sha256:"
_KEY = re.compile(r"^rgk_([A-Za-z0-9]{4,64})_([A-Za-z0-9_-]{16,256})$")
Name = Annotated[str, StringConstraints(min_length=1, max_length=256, pattern=r"^[^\x00-\x1f]+$")]
_HINT = "send a valid key as 'X-API-Key: rgk_...' or 'Authorization: Bearer rgk_...'"


def hash_key(key: str, pepper: str) -> str:
    digest = hmac.new(pepper.encode(), key.encode(), hashlib.sha256).hexdigest()
    return HASH_PREFIX + digest


def new_key() -> tuple[str, str]:
    """A fresh ``(key_id, key)``."""
    key_id = secrets.token_hex(6)
    return key_id, f"{PREFIX}{key_id}_{secrets.token_urlsafe(32)}"


class ApiKeyEntry(BaseModel):
    """One key in the file. ``teams`` maps each team the key may act in to its roles there."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=r"^[A-Za-z0-9]{4,64}$")
    hash: str = Field(pattern=r"^hmac-sha256:[0-9a-f]{64}$")
    name: str = ""
    # The subject recorded for calls with this key; default "apikey:<id>".
    sub: str = ""
    agent_id: str = ""
    teams: dict[Name, list[Name]] = Field(min_length=1)
    groups: list[Name] = Field(default_factory=list)
    permissions: list[Name] = Field(default_factory=list)
    revoked: bool = False
    expires_at: int | None = None

    @field_validator("expires_at", mode="before")
    @classmethod
    def _timestamp(cls, value: Any) -> Any:
        return None if value in (None, "") else parse_timestamp(value)

    @field_validator("teams")
    @classmethod
    def _roles_given(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        empty = [team for team, roles in value.items() if not roles]
        if empty:
            raise ValueError(f"teams {empty} have no roles")
        return value

    def principal(self) -> Principal:
        return Principal(
            sub=self.sub or f"apikey:{self.id}",
            method="api_key",
            teams={team: tuple(roles) for team, roles in self.teams.items()},
            groups=frozenset(self.groups),
            permissions=frozenset(self.permissions),
            agent_id=self.agent_id,
            key_id=self.id,
        )


class ApiKeyFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    keys: list[ApiKeyEntry] = Field(default_factory=list)


class ApiKeyStore:
    """The keys of one file, re-read when it changes (checked at most every ``reload_s``), so
    revoking a key is editing the file."""

    def __init__(self, path: str, pepper: str, *, reload_s: float = 5.0) -> None:
        self.path = Path(path)
        self.pepper = pepper
        self.reload_s = reload_s
        self._lock = threading.Lock()
        self._checked = 0.0
        self._mtime = 0.0
        self._entries: dict[str, ApiKeyEntry] = {}
        self._entries = self._read()

    def _read(self) -> dict[str, ApiKeyEntry]:
        try:
            self._mtime = os.stat(self.path).st_mtime
            raw = yaml.safe_load(self.path.read_text(encoding="utf-8"))
            parsed = ApiKeyFile.model_validate(raw or {})
        except (OSError, yaml.YAMLError, ValidationError) as exc:
            raise ValueError(f"auth.api_keys_file {self.path}: {exc}") from exc
        entries: dict[str, ApiKeyEntry] = {}
        for entry in parsed.keys:
            if entry.id in entries:
                raise ValueError(f"auth.api_keys_file {self.path}: key id {entry.id} twice")
            entries[entry.id] = entry
        return entries

    def _maybe_reload(self) -> None:
        now = time.monotonic()
        if now - self._checked < self.reload_s:
            return
        with self._lock:
            self._checked = now
            try:
                if os.stat(self.path).st_mtime != self._mtime:
                    self._entries = self._read()
                    logger.info("API key file %s reloaded: %d keys", self.path, len(self._entries))
            except (OSError, ValueError) as exc:
                logger.error("API key file reload failed, keeping the previous keys: %s", exc)

    def verify(self, key: str) -> Principal:
        """The principal of a valid key.

        Raises:
            Unauthorized: malformed, unknown, wrong, revoked or expired key; one message for
                all, so a caller learns nothing about which keys exist.
        """
        self._maybe_reload()
        match = _KEY.match(key)
        entry = self._entries.get(match.group(1)) if match else None
        presented = hash_key(key, self.pepper)
        # Compare even when no entry matched, so timing says nothing about which ids exist.
        expected = entry.hash if entry is not None else HASH_PREFIX + "0" * 64
        same = hmac.compare_digest(presented.encode(), expected.encode())
        problem = None
        if entry is None or not same:
            problem = "malformed" if match is None else "unknown or wrong"
        elif entry.revoked:
            problem = "revoked"
        elif entry.expires_at is not None and entry.expires_at <= time.time():
            problem = "expired"
        if entry is None or problem is not None:
            logger.info("API key refused (%s), id %r", problem, match.group(1) if match else "")
            raise Unauthorized("invalid, revoked or expired API key", hint=_HINT)
        return entry.principal()
