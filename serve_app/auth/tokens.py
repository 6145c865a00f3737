"""Verification of bearer JWTs: HS* against a shared secret, RS*/PS*/ES*/EdDSA against the
keys of a JWKS (a URL, cached, or a file).

The algorithm of a token decides where its key comes from, and only algorithms of
``auth.algorithms`` are considered: an HS256 token is never checked with a public key of the
JWKS (algorithm confusion), ``alg: none`` is never accepted, and a JWKS key verifies only
tokens of its own algorithm (PyJWT binds a ``PyJWK`` to one algorithm).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import jwt
from jwt import PyJWK, PyJWKClient, PyJWKSet

from deployments.errors import BackendUnavailable, Unauthorized
from serve_app.settings import AuthSettings

logger = logging.getLogger(__name__)

# Longer than any real token; refused before any parsing.
MAX_TOKEN_CHARS = 16_384
_HINT = "send a fresh token from the identity provider as 'Authorization: Bearer <JWT>'"


def _unauthorized(message: str) -> Unauthorized:
    return Unauthorized(message, hint=_HINT)


# Least seconds between two checks whether the JWKS file changed, for a key id it holds.
JWKS_FILE_RECHECK_S = 1.0


class JwksFile:
    """Signing keys from a JWKS file, re-read when the file changes (key rotation): at once
    for an unknown key id, and at most ``recheck_s`` after a change for a known one, so a key
    removed from the file stops verifying within that time (and a verified token kept by
    ``serve_app/auth/token_cache.py`` within ``auth.token_cache_s`` more)."""

    def __init__(
        self,
        path: str,
        recheck_s: float = JWKS_FILE_RECHECK_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(path)
        self.recheck_s = recheck_s
        self.clock = clock
        self._lock = threading.Lock()
        self._mtime = 0.0
        self._checked = 0.0
        self._keys: dict[str, PyJWK] = {}
        self._load()

    def _load(self) -> None:
        try:
            mtime = os.stat(self.path).st_mtime
            key_set = PyJWKSet.from_json(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError, jwt.PyJWTError) as exc:
            raise ValueError(f"auth.jwks_file {self.path}: {exc}") from exc
        self._keys = {
            k.key_id: k for k in key_set.keys if k.key_id and k.public_key_use in ("sig", None)
        }
        self._mtime = mtime
        self._checked = self.clock()

    def get(self, kid: str) -> PyJWK | None:
        key = self._keys.get(kid)
        if key is not None and self.clock() - self._checked < self.recheck_s:
            return key
        with self._lock:
            try:
                self._checked = self.clock()
                changed = os.stat(self.path).st_mtime != self._mtime
                if changed:
                    self._load()
            except (OSError, ValueError) as exc:
                # Keep serving the keys we have; a half-written file must not lock everyone out.
                logger.error("JWKS file reload failed, keeping the previous keys: %s", exc)
        return self._keys.get(kid)


class TokenVerifier:
    """Verifies a JWT and returns its claims; raises ``Unauthorized`` (401) for any token that
    does not verify and ``BackendUnavailable`` (503) when the JWKS URL cannot be fetched."""

    def __init__(self, auth: AuthSettings) -> None:
        self.algorithms = tuple(auth.algorithms)
        self.secret = auth.hs256_secret.get_secret_value()
        self.issuer = auth.issuer or None
        self.audience = auth.audience or None
        self.leeway = auth.leeway_s
        self.jwks_file = JwksFile(auth.jwks_file) if auth.jwks_file else None
        self.jwks_url = auth.jwks_url
        self.jwks_client = (
            PyJWKClient(
                auth.jwks_url,
                cache_jwk_set=True,
                lifespan=auth.jwks_cache_s,
                timeout=auth.jwks_timeout_s,
                cooldown_duration=auth.jwks_refresh_cooldown_s,
            )
            if auth.jwks_url
            else None
        )
        required = ["exp", "sub"]
        required += ["iss"] if self.issuer else []
        required += ["aud"] if self.audience else []
        self.options: dict[str, Any] = {"require": required}

    def header(self, token: str) -> dict[str, Any]:
        if len(token) > MAX_TOKEN_CHARS:
            raise _unauthorized(f"token longer than {MAX_TOKEN_CHARS} characters")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise _unauthorized(f"malformed token: {exc}") from exc
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in self.algorithms:
            raise _unauthorized(
                f"token algorithm {str(alg)[:20]!r} is not accepted; accepted: "
                + ", ".join(self.algorithms)
            )
        return header

    def may_fetch(self, token: str) -> bool:
        """Whether verifying ``token`` may need a request to the JWKS URL (so the caller can
        run it off the event loop). False when the cached key set already has its key."""
        if self.jwks_client is None:
            return False
        try:
            header = self.header(token)
        except Unauthorized:
            return False
        if header["alg"].startswith("HS"):
            return False
        kid = header.get("kid")
        if self.jwks_file is not None and isinstance(kid, str) and self.jwks_file.get(kid):
            return False
        cache = self.jwks_client.jwk_set_cache
        cached = cache.get() if cache is not None else None
        return cached is None or not any(k.key_id == kid for k in cached.keys)

    def _key(self, header: dict[str, Any]) -> Any:
        alg = header["alg"]
        if alg.startswith("HS"):
            if not self.secret:
                raise _unauthorized(f"{alg} tokens are not accepted here (no shared secret)")
            return self.secret
        if self.jwks_file is None and self.jwks_client is None:
            raise _unauthorized(f"{alg} tokens are not accepted here (no JWKS configured)")
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            raise _unauthorized("token header has no key id (kid)")
        key = self.jwks_file.get(kid) if self.jwks_file is not None else None
        if key is None and self.jwks_client is not None:
            key = self._url_key(kid)
        if key is None:
            raise _unauthorized(f"unknown signing key id {kid[:64]!r}")
        if key.algorithm_name != alg:
            raise _unauthorized(
                f"token algorithm {alg} does not match its key's algorithm {key.algorithm_name}"
            )
        return key

    def _url_key(self, kid: str) -> PyJWK:
        assert self.jwks_client is not None
        try:
            return self.jwks_client.get_signing_key(kid)
        except (jwt.PyJWKClientConnectionError, jwt.PyJWKSetError) as exc:
            # The provider is down or answers garbage: keys fetched before still verify.
            stale = self._stale_key(kid)
            if stale is not None:
                logger.warning("JWKS fetch failed, using the previously fetched keys: %s", exc)
                return stale
            raise BackendUnavailable(
                "jwks",
                f"cannot get the signing keys from {self.jwks_url}: {exc}",
                hint="retry later; the identity provider's JWKS endpoint is not answering",
            ) from exc
        except jwt.PyJWKClientError as exc:
            logger.info("JWKS lookup of kid %r failed: %s", kid[:64], exc)
            raise _unauthorized(f"unknown signing key id {kid[:64]!r}") from exc

    def _stale_key(self, kid: str) -> PyJWK | None:
        cache = self.jwks_client.jwk_set_cache if self.jwks_client is not None else None
        held = cache.jwk_set_with_timestamp if cache is not None else None
        if held is None:
            return None
        return next((k for k in held.get_jwk_set().keys if k.key_id == kid), None)

    def verify(self, token: str) -> dict[str, Any]:
        """The verified claims of ``token``.

        Raises:
            Unauthorized: malformed, forged, expired, not yet valid, wrong issuer or audience,
                unknown key, algorithm not accepted.
            BackendUnavailable: the JWKS URL is needed and does not answer.
        """
        header = self.header(token)
        key = self._key(header)
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=[header["alg"]],
                audience=self.audience,
                issuer=self.issuer,
                leeway=self.leeway,
                options=cast(Any, self.options),
            )
        except jwt.ExpiredSignatureError as exc:
            raise _unauthorized("token expired") from exc
        except jwt.ImmatureSignatureError as exc:
            raise _unauthorized("token not valid yet (nbf or iat in the future)") from exc
        except jwt.InvalidAudienceError as exc:
            expected = self.audience or "no audience (AUTH__AUDIENCE is not set)"
            raise _unauthorized(f"token audience is not {expected!r}") from exc
        except jwt.InvalidIssuerError as exc:
            raise _unauthorized(f"token issuer is not {self.issuer!r}") from exc
        except jwt.MissingRequiredClaimError as exc:
            raise _unauthorized(f"token lacks the {exc.claim!r} claim") from exc
        except jwt.InvalidSignatureError as exc:
            raise _unauthorized("token signature does not verify") from exc
        except jwt.PyJWTError as exc:
            raise _unauthorized(f"invalid token: {exc}") from exc
        if not isinstance(claims, dict):
            raise _unauthorized("token payload is not a JSON object")
        return claims
