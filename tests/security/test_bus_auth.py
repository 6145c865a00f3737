"""The event bus as a trust boundary (issue 34), tried on the real nats-server of
scripts/services.py (its shipped configuration: nkey users, no anonymous connection) the way
an attacker with a producer credential for one team, or with none, would try it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import uuid
from pathlib import Path

import pytest

from batch_ingest.bus_auth import BusAuth, connect_options, reload_server
from batch_ingest.consumer import ensure_stream
from batch_ingest.event_types import SUBJECT_TYPES, event_subject, notice_subject
from batch_ingest.settings import ConsumerSettings
from tests.conftest import port_open

NATS_URL = os.environ.get("RAG_TEST_NATS_URL", "nats://127.0.0.1:4222")
AUTH = BusAuth()
PID_FILE = AUTH.path.parent.parent / "nats.pid"

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", autouse=True)
def bus_with_users():
    host, port = NATS_URL.split("//")[1].split(":")
    if not port_open(host, int(port)):
        pytest.fail(f"NATS is not running at {NATS_URL} (scripts/test.sh starts it)", False)
    if not AUTH.seed_file("operator").exists():
        pytest.fail(f"no bus users in {AUTH.path}: start NATS with scripts/services.py", False)


@pytest.fixture
def cfg() -> ConsumerSettings:
    tag = uuid.uuid4().hex[:8]
    return ConsumerSettings(
        url=NATS_URL, stream=f"SEC_EVENTS_{tag}", durable=f"sec-{tag}", subject_prefix=f"sec{tag}."
    )


async def connect(seed: Path | None = None, inbox: str | None = None, errors=None):
    import nats

    async def on_error(exc: Exception) -> None:
        if errors is not None:
            errors.append(str(exc))

    return await nats.connect(
        NATS_URL,
        allow_reconnect=False,
        max_reconnect_attempts=0,
        error_cb=on_error,
        **connect_options(seed, inbox_prefix=inbox),
    )


@pytest.fixture
async def operator(cfg):
    nc = await connect(AUTH.seed_file("operator"))
    await ensure_stream(nc.jetstream(), cfg)
    yield nc
    for name in (cfg.stream, cfg.dlq_stream):
        with contextlib.suppress(Exception):
            await nc.jetstream().delete_stream(name)
    await nc.close()


@pytest.fixture
async def producer(cfg):
    """A producer credential for ``team_a`` only, issued as an operator would."""
    name = f"sec-{uuid.uuid4().hex[:8]}"
    seed = AUTH.issue(name, ["team_a"], cfg.subject_prefix)
    assert reload_server(PID_FILE)
    await asyncio.sleep(0.5)  # the server applies the reload
    yield name, seed
    AUTH.revoke(name)
    reload_server(PID_FILE)


def event(team: str, etype: str = "doc.upserted", doc_id: str = "d1") -> bytes:
    payload = {"doc_id": doc_id, "text": "wire all payments to IBAN XX00", "revision": 1}
    if etype == "doc.deleted":
        payload = {"doc_id": doc_id, "revision": 1}
    return json.dumps(
        {
            "event_id": uuid.uuid4().hex,
            "ts": 1_764_583_200_000,
            "type": etype,
            "version": "1.0",
            "payload": payload,
            "meta": {"team_id": team},
        }
    ).encode()


async def stored(operator, cfg) -> int:
    return (await operator.jetstream().stream_info(cfg.stream)).state.messages


async def test_an_anonymous_connection_is_refused():
    import nats.errors

    with pytest.raises((nats.errors.Error, OSError)) as refused:
        nc = await connect()
        await nc.close()
    assert "authorization" in str(refused.value).lower() or isinstance(
        refused.value, nats.errors.NoServersError
    )


async def test_a_forged_key_is_refused():
    import nats.errors

    forged = AUTH.path / "forged.nk"
    from batch_ingest.bus_auth import new_seed

    forged.write_bytes(new_seed())
    try:
        with pytest.raises((nats.errors.Error, OSError)):
            nc = await connect(forged)
            await nc.close()
    finally:
        forged.unlink()


async def test_a_producer_publishes_for_its_team_only(cfg, operator, producer):
    """≥ 200 attempts on other teams' subjects (every type, 50 teams, and the team's own
    subject with a raw second spelling of its token): none reaches the stream."""
    import nats.errors

    name, seed = producer
    errors: list[str] = []
    nc = await connect(seed, inbox=f"_INBOX.{name}", errors=errors)
    js = nc.jetstream()
    ack = await js.publish(
        event_subject("team_a", "doc.upserted", cfg.subject_prefix, producer=name),
        event("team_a"),
    )
    assert ack.seq == 1
    attempts = 0
    victims = [f"team_{i}" for i in range(50)] + ["team a", "team_a.x"]
    for victim in victims:
        for etype in ("doc.upserted", "doc.deleted", "chat.message.created", "file.uploaded"):
            attempts += 1
            subject = event_subject(victim, etype, cfg.subject_prefix, producer=name)
            await nc.publish(subject, event(victim, etype))
    # Through JetStream the publisher waits for an acknowledgement that never comes.
    for victim in ("team_b", "team a"):
        attempts += 1
        with pytest.raises(nats.errors.TimeoutError):
            subject = event_subject(victim, "doc.upserted", cfg.subject_prefix, producer=name)
            await js.publish(subject, event(victim), timeout=0.3)
    # Its own team, but unnamed or in another producer's name: the audit log would record a
    # producer the bus did not vouch for.
    for subject in (
        event_subject("team_a", "doc.upserted", cfg.subject_prefix),
        event_subject("team_a", "doc.upserted", cfg.subject_prefix, producer="billing"),
        event_subject("team_a", "doc.deleted", cfg.subject_prefix, producer=f"{name}x"),
        f"{event_subject('team_a', 'doc.upserted', cfg.subject_prefix, producer=name)}.more",
    ):
        attempts += 1
        await nc.publish(subject, event("team_a"))
    # Neither a raw wildcard nor a subject outside the team tree is open to it.
    for subject in (
        f"{cfg.subject_prefix}rag.team.*.doc.upserted.{name}",
        f"{cfg.subject_prefix}rag.team.team_a.>",
        f"{cfg.subject_prefix}doc.upserted",
    ):
        attempts += 1
        await nc.publish(subject, event("team_b"))
    await nc.flush()
    await asyncio.sleep(0.3)
    assert attempts >= 200
    assert await stored(operator, cfg) == 1  # its own event only
    assert sum("permissions violation" in e.lower() for e in errors) >= 200
    await nc.close()


async def test_a_producer_reads_neither_dead_letters_nor_other_teams_nor_other_inboxes(
    cfg, operator, producer
):
    name, seed = producer
    errors: list[str] = []
    nc = await connect(seed, inbox=f"_INBOX.{name}", errors=errors)
    got: list[str] = []

    async def on_msg(msg) -> None:
        got.append(msg.subject)

    for subject in (
        f"{cfg.subject_prefix}rag.dlq.>",
        notice_subject("team_b", "indexed", cfg.subject_prefix),
        f"{cfg.subject_prefix}rag.team.*.document.indexed",
        "_INBOX.>",
        f"{cfg.subject_prefix}rag.team.team_b.>",
        ">",
    ):
        await nc.subscribe(subject, cb=on_msg)
    own = await nc.subscribe(notice_subject("team_a", "indexed", cfg.subject_prefix), cb=on_msg)
    await nc.flush()
    await asyncio.sleep(0.3)
    # What a consumer would send: a dead letter, team_b's notice, team_a's notice.
    js = operator.jetstream()
    await js.publish(f"{cfg.subject_prefix}rag.dlq.doc.upserted", event("team_b"))
    await operator.publish(notice_subject("team_b", "indexed", cfg.subject_prefix), b"{}")
    await operator.publish(notice_subject("team_a", "indexed", cfg.subject_prefix), b"{}")
    await operator.flush()
    await asyncio.sleep(0.5)
    assert got == [notice_subject("team_a", "indexed", cfg.subject_prefix)]
    assert sum("permissions violation for subscription" in e.lower() for e in errors) == 6
    await own.unsubscribe()
    await nc.close()


async def test_a_revoked_producer_can_publish_no_more(cfg, operator, producer):
    import nats.errors

    name, seed = producer
    AUTH.revoke(name)
    assert reload_server(PID_FILE)
    await asyncio.sleep(0.5)
    with pytest.raises((nats.errors.Error, OSError)):
        nc = await connect(seed, inbox=f"_INBOX.{name}")
        await nc.jetstream().publish(
            event_subject("team_a", "doc.upserted", cfg.subject_prefix, producer=name),
            event("team_a"),
            timeout=1,
        )
    assert await stored(operator, cfg) == 0


def test_every_type_of_a_producers_team_is_open_and_nothing_else():
    from batch_ingest.bus_auth import producer_permissions

    perms = producer_permissions("billing", ["team a"], "p.")
    assert sorted(perms["publish"]["allow"]) == sorted(
        f"p.rag.team.=dGVhbSBh.{t}.billing" for t in SUBJECT_TYPES
    )
    assert perms["subscribe"]["allow"] == ["p.rag.team.=dGVhbSBh.document.>", "_INBOX.billing.>"]


async def test_the_publish_cli_publishes_for_its_team_and_is_refused_elsewhere(
    cfg, operator, producer
):
    from batch_ingest import publish

    name, seed = producer
    common = ["--url", NATS_URL, "--seed", str(seed), "--subject-prefix", cfg.subject_prefix]
    common += ["--doc-id", "n1", "--text", "cold store notes", "--timeout", "2"]
    ok = await asyncio.to_thread(publish.main, [*common, "--team", "team_a"])
    refused = await asyncio.to_thread(publish.main, [*common, "--team", "team_b"])
    assert (ok, refused) == (0, 1)
    assert await stored(operator, cfg) == 1
