"""The gateway-environment fixtures shared by the unit and security suites (their conftests
import them): audit records in a temporary SQLite file, and no gateway variable of the
surrounding shell."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest

from serve_app.settings import GatewaySettings

GATEWAY_SECTIONS = tuple(GatewaySettings.model_fields)
AUDIT_URL_ENV = "AUDIT__URL"


def _drop_gateway_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        lowered = name.lower()
        if name.upper() == AUDIT_URL_ENV:
            continue
        if any(lowered == s or lowered.startswith(s + "__") for s in GATEWAY_SECTIONS):
            monkeypatch.delenv(name)


@pytest.fixture(scope="session", autouse=True)
def audit_in_tmp(tmp_path_factory):
    """Audit records of unit tests go to a temporary SQLite file, not var/audit.db (the
    env-cleaning helpers below keep this one variable)."""
    path = tmp_path_factory.mktemp("audit") / "audit.db"
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv(AUDIT_URL_ENV, f"sqlite:///{path}")
        yield


@pytest.fixture
def clean_gateway_env(monkeypatch):
    """Drop any gateway variable of the surrounding shell so each test sets its own."""
    _drop_gateway_env(monkeypatch)


@contextlib.contextmanager
def gateway_env_removed() -> Iterator[None]:
    """The same for module-scoped fixtures, which cannot use ``monkeypatch``."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        _drop_gateway_env(monkeypatch)
        yield
