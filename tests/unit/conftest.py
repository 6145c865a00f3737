from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest

from deployments.config import GatewaySettings

GATEWAY_SECTIONS = tuple(GatewaySettings.model_fields)


def _drop_gateway_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        lowered = name.lower()
        if any(lowered == s or lowered.startswith(s + "__") for s in GATEWAY_SECTIONS):
            monkeypatch.delenv(name)


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
