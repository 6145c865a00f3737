"""One exception tree for the whole gateway; ``serve_app.http.errors`` maps it to HTTP status.

Every error survives pickling with all its fields (``GatewayError.__reduce__``): raised
inside a Serve replica, it reaches the ingress as itself, not as Ray's
"Failed to unpickle serialized exception"."""

from __future__ import annotations

from typing import Any


def _rebuild(cls: type[GatewayError], args: tuple[Any, ...]) -> GatewayError:
    # Not through ``cls.__init__``: subclasses take other arguments than ``self.args``.
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    return error


class GatewayError(Exception):
    """Base of every error the gateway raises on purpose.

    ``reason`` is a short machine-readable code for callers and the audit log
    (``team_not_granted``, ``row_limit``, ...) where one applies; ``headers`` are the HTTP
    headers its answer carries."""

    status_code = 500
    code = "internal_error"

    def __init__(
        self,
        message: str,
        *,
        hint: str | None = None,
        field: str | None = None,
        reason: str | None = None,
        fields: list[dict[str, str]] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        # The request field at fault, as a dotted path (``filters.visibility``), when known.
        self.field = field
        self.reason = reason
        # Several fields at fault, each ``{"field": ..., "problem": ...}`` (``field`` is the
        # first of them).
        self.fields = fields

    @property
    def headers(self) -> dict[str, str]:
        return {}

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.args), self.__dict__.copy())


class InvalidInput(GatewayError):
    """The request is well-formed JSON but asks for something impossible."""

    status_code = 422
    code = "invalid_input"


class Unauthorized(GatewayError):
    """No credentials, or credentials that do not verify (bad signature, expired, unknown key).

    Answered 401 with ``WWW-Authenticate: Bearer``; ``error`` is the RFC 6750 error code
    (``invalid_token`` when a credential was sent, ``None`` when none was).
    """

    status_code = 401
    code = "unauthorized"

    def __init__(
        self, message: str, *, hint: str | None = None, error: str | None = "invalid_token"
    ) -> None:
        super().__init__(message, hint=hint)
        self.error = error
        # Where the protected resource's metadata is (RFC 9728), for an OAuth client to
        # discover the authorization server: set by the MCP endpoint.
        self.resource_metadata: str | None = None

    @property
    def headers(self) -> dict[str, str]:
        challenge = 'Bearer realm="rag-gateway"'
        if self.error:
            challenge += f', error="{self.error}"'
        if self.resource_metadata:
            challenge += f', resource_metadata="{self.resource_metadata}"'
        return {"WWW-Authenticate": challenge}


class Forbidden(GatewayError):
    """The caller may not do or see this. ``reason`` is a short machine-readable code
    (``team_not_granted``, ``not_in_allowed_groups``, ...) for callers and the audit log."""

    status_code = 403
    code = "forbidden"


class Conflict(GatewayError):
    """The request contradicts the current state (a reindex of the team is running already)."""

    status_code = 409
    code = "conflict"


class BackendUnavailable(GatewayError):
    """A model or store the request needs is not answering."""

    status_code = 503
    code = "backend_unavailable"

    def __init__(self, backend: str, message: str, *, hint: str | None = None) -> None:
        super().__init__(f"{backend}: {message}", hint=hint)
        self.backend = backend


class InvalidQuery(GatewayError):
    """A graph query Neo4j cannot compile (syntax, unknown function, bad parameter type).
    The message keeps Neo4j's own."""

    status_code = 400
    code = "invalid_query"


class QueryLimitExceeded(GatewayError):
    """A graph query ran past its transaction timeout or returned more rows than allowed."""

    status_code = 422
    code = "query_limit_exceeded"

    def __init__(self, message: str, *, reason: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint, reason=reason)


class NotFound(GatewayError):
    """A named thing (an entity of explain_path, an intent) does not exist in the scope."""

    status_code = 404
    code = "not_found"
