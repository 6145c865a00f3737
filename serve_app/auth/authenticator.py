"""Authenticator: turns the credential of a request into a ``Principal``.

``Authorization: Bearer <JWT>`` is verified by ``TokenVerifier``; an API key is sent as
``X-API-Key: rgk_...`` or ``Authorization: Bearer rgk_...``. In ``dev`` mode a request without
any credential gets a development principal that trusts the body (refused in production by
the settings); a credential that is sent is always verified, in every mode.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

from deployments.errors import BackendUnavailable, Unauthorized
from serve_app.auth.api_keys import PREFIX as API_KEY_PREFIX
from serve_app.auth.api_keys import ApiKeyStore
from serve_app.auth.principal import Principal, principal_from_claims
from serve_app.auth.token_cache import VerifiedTokens
from serve_app.auth.tokens import TokenVerifier
from serve_app.settings import AuthSettings, GatewaySettings

logger = logging.getLogger(__name__)

_MISSING_HINT = "send 'Authorization: Bearer <JWT>' or 'X-API-Key: rgk_...'"


class Authenticator:
    def __init__(
        self,
        auth: AuthSettings,
        *,
        tokens: TokenVerifier | None = None,
        api_keys: ApiKeyStore | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.auth = auth
        self.tokens = tokens
        self.api_keys = api_keys
        # Verified JWTs (exact token string -> principal), re-checked for expiry on every hit
        # and trusted at most auth.token_cache_s; None when off.
        verified = VerifiedTokens(
            auth.token_cache_size, auth.token_cache_s, auth.leeway_s, clock=clock
        )
        self.verified_tokens = verified if tokens is not None and verified.enabled else None
        self.dev = auth.mode == "dev"
        if self.dev:
            logger.warning(
                "AUTH MODE dev: requests without credentials are TRUSTED FROM THEIR BODY "
                "(team_id, mode, user_id) with roles %s. Development only; set AUTH__MODE=jwt "
                "anywhere else.",
                auth.dev_roles,
            )

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> Authenticator:
        """Build the verifiers the settings configure; reads key files (no network).

        Raises:
            ValueError: a configured JWKS or API key file cannot be read or is invalid.
        """
        auth = settings.auth
        api_keys = None
        if auth.api_keys_file:
            api_keys = ApiKeyStore(
                auth.api_keys_file,
                auth.api_key_pepper.get_secret_value(),
                reload_s=auth.api_keys_reload_s,
            )
        tokens = TokenVerifier(auth) if auth.verifies_tokens else None
        return cls(auth, tokens=tokens, api_keys=api_keys)

    def _verify_api_key(self, key: str) -> Principal:
        if self.api_keys is None:
            raise Unauthorized("API keys are not accepted here", hint=_MISSING_HINT)
        return self.api_keys.verify(key)

    def _verify_token(self, token: str) -> Principal:
        if self.tokens is None:
            raise Unauthorized(
                "bearer tokens are not accepted here (no JWKS or shared secret configured)",
                hint=_MISSING_HINT,
            )
        cache = self.verified_tokens
        if cache is not None and (principal := cache.get(token)) is not None:
            return principal
        since = cache.clock() if cache is not None else 0.0
        claims = self.tokens.verify(token)
        principal = principal_from_claims(claims, self.auth.claims, self.auth.default_team_roles)
        if cache is not None:
            cache.put(token, principal, claims, since)
        return principal

    def _verify(self, kind: str, credential: str) -> Principal:
        try:
            if kind == "api_key":
                return self._verify_api_key(credential)
            return self._verify_token(credential)
        except (Unauthorized, BackendUnavailable):
            raise
        except Exception as exc:
            # A credential must never produce a 500, whatever it holds; a bug here is logged
            # with its stack and the caller still gets a clean 401.
            logger.exception("credential check failed unexpectedly")
            raise Unauthorized("credential could not be verified", hint=_MISSING_HINT) from exc

    @staticmethod
    def credential(headers: Mapping[str, str]) -> tuple[str, str] | None:
        """``(kind, value)`` of the request's credential, ``None`` when there is none.

        Raises:
            Unauthorized: an Authorization header that is not ``Bearer <value>``, or two
                credentials at once.
        """
        authorization = headers.get("authorization")
        api_key = headers.get("x-api-key")
        found: list[tuple[str, str]] = []
        if authorization is not None:
            scheme, _, value = authorization.strip().partition(" ")
            value = value.strip()
            if scheme.lower() != "bearer" or not value:
                raise Unauthorized(
                    "the Authorization header must be 'Bearer <token>'", hint=_MISSING_HINT
                )
            found.append(("api_key" if value.startswith(API_KEY_PREFIX) else "jwt", value))
        if api_key is not None:
            found.append(("api_key", api_key.strip()))
        if len(found) > 1:
            raise Unauthorized(
                "send one credential: Authorization or X-API-Key, not both", hint=_MISSING_HINT
            )
        return found[0] if found else None

    async def authenticate(self, headers: Mapping[str, str]) -> Principal:
        """The principal of a request.

        Raises:
            Unauthorized: no credential (outside dev mode) or one that does not verify.
            BackendUnavailable: the JWKS URL is needed and cannot be fetched.
        """
        found = self.credential(headers)
        if found is None:
            if self.dev:
                return Principal.development(self.auth.dev_roles)
            raise Unauthorized("credentials required", hint=_MISSING_HINT, error=None)
        kind, value = found
        if kind == "jwt" and self.verified_tokens is not None:
            # A token verified recently needs neither PyJWT nor the thread hop below.
            principal = self.verified_tokens.get(value)
            if principal is not None:
                return principal
        if kind == "jwt" and self.tokens is not None and self.tokens.may_fetch(value):
            # PyJWKClient fetches with blocking urllib; keep the event loop free.
            return await asyncio.to_thread(self._verify, kind, value)
        return self._verify(kind, value)
