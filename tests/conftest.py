"""Shared fixtures. Markers are registered in pyproject.toml (--strict-markers)."""

from __future__ import annotations

import os
import socket
import uuid

import pytest

from serve_app.settings import GatewaySettings


def port_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def require_services() -> GatewaySettings:
    """Settings for the real services; fail (not skip) when they are not running, so a CI
    run without them can never pass by skipping."""
    settings = GatewaySettings(environment="test")
    from urllib.parse import urlparse

    for name, uri in (("milvus", settings.milvus.uri), ("neo4j", settings.neo4j.uri)):
        parsed = urlparse(uri)
        if parsed.hostname in ("127.0.0.1", "localhost") and not port_open(
            parsed.hostname, parsed.port or 0
        ):
            pytest.fail(
                f"{name} is not running at {uri}; start the services with "
                "`.venv/bin/python scripts/services.py up` (scripts/test.sh does this)",
                pytrace=False,
            )
    return settings


@pytest.fixture(scope="session")
def run_id() -> str:
    return os.environ.get("RAG_TEST_RUN_ID") or uuid.uuid4().hex[:8]
