"""Shared fixtures. Markers are registered in pyproject.toml (--strict-markers)."""

from __future__ import annotations

import atexit
import os
import socket
import sys
import uuid

import pytest

from serve_app.settings import GatewaySettings

EXIT_STATUS = pytest.StashKey[int]()


def pytest_configure(config: pytest.Config) -> None:
    # Registered before any test imports a library, so it runs after their atexit handlers.
    atexit.register(_exit_without_teardown, config)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[EXIT_STATUS] = int(exitstatus)


def _exit_without_teardown(config: pytest.Config) -> None:
    """Ends the test process with the session's status once every atexit handler has run,
    skipping the interpreter's teardown of native modules: importing a transformers model
    class loads torch's dynamo and triton, whose nanobind bindings report leaks at teardown
    and then, now and then, segfault (a CI run's unit suite passed and exited 139, 2026-12-06;
    triton-lang/triton-cpu#278 is the leak). ``RAG_TEST_FULL_TEARDOWN=1`` keeps the teardown."""
    if os.environ.get("RAG_TEST_FULL_TEARDOWN") == "1" or EXIT_STATUS not in config.stash:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(config.stash[EXIT_STATUS])


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
