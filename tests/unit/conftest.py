from __future__ import annotations

import os

import pytest

from deployments.config import GatewaySettings

GATEWAY_SECTIONS = tuple(GatewaySettings.model_fields)


@pytest.fixture
def clean_gateway_env(monkeypatch):
    """Drop any gateway variable of the surrounding shell so each test sets its own."""
    for name in list(os.environ):
        lowered = name.lower()
        if any(lowered == s or lowered.startswith(s + "__") for s in GATEWAY_SECTIONS):
            monkeypatch.delenv(name)
