"""Bearer JWTs verified recently, so that a token sent on many requests is verified once.

The key is the exact token string (header, payload and signature): nothing but the same
bytes can hit, and a token differing anywhere is verified in full. A hit is served only while

- the token would still pass PyJWT's expiry check, mirrored exactly (PyJWT refuses when
  ``int(exp) <= now - leeway``; ``nbf`` and ``iat`` only become more valid as time passes, and
  a clock that went back before the verification is a miss), and
- the verification is at most ``trust_s`` seconds old, which bounds how long a signing key
  removed from the JWKS (or a changed shared secret) keeps verifying tokens held here.

Only successful verifications are stored; a miss or a stale entry is verified in full.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

from serve_app.auth.principal import Principal


class _Entry(NamedTuple):
    principal: Principal
    exp: int
    verified_at: float
    trusted_until: float


class VerifiedTokens:
    """A bounded LRU map ``token -> Principal`` of verified JWTs; thread-safe (the
    authenticator verifies on the event loop and in worker threads)."""

    def __init__(
        self,
        size: int,
        trust_s: float,
        leeway_s: float,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.size = size
        self.trust_s = trust_s
        self.leeway = leeway_s
        self.clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.size > 0 and self.trust_s > 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, token: str) -> Principal | None:
        """The principal of ``token`` if it was verified and is still valid, else None (an
        entry found expired or past its trust window is dropped)."""
        now = self.clock()
        with self._lock:
            entry = self._entries.get(token)
            if entry is None:
                return None
            # PyJWT: expired when exp <= now - leeway.
            if entry.verified_at <= now < entry.trusted_until and entry.exp > now - self.leeway:
                self._entries.move_to_end(token)
                return entry.principal
            del self._entries[token]
            return None

    def put(self, token: str, principal: Principal, claims: dict[str, Any], since: float) -> None:
        """Keep ``token``, verified (its ``claims``) by a check that began at ``since``."""
        if not self.enabled:
            return
        try:
            exp = int(claims["exp"])  # as PyJWT reads it
        except (KeyError, ValueError, TypeError, OverflowError):
            return  # no expiry to re-check on a hit: never served from here
        entry = _Entry(principal, exp, since, since + self.trust_s)
        with self._lock:
            self._entries[token] = entry
            self._entries.move_to_end(token)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
