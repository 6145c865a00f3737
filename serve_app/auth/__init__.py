"""Authentication: verified JWTs (HS256 secret or JWKS) and hashed API keys become a
``Principal``; ``serve_app.access.context`` turns it into the request's ``AccessContext``."""

from serve_app.auth.authenticator import Authenticator
from serve_app.auth.principal import Principal

__all__ = ["Authenticator", "Principal"]
