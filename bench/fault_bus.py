"""The bus of the ``nats`` fault (``Bus``): a ``batch_ingest.consumer`` subprocess on a
stream of this run and a JetStream publisher that keeps reconnecting while NATS is down;
``wait_indexed`` waits until the consumer has indexed a published document's chunks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from batch_ingest.bus_auth import local_options
from batch_ingest.event_types import event_subject
from bench.bench_load import DocState, Workload
from bench.common import REPO_ROOT

logger = logging.getLogger("bench.faults")


class Bus:
    """A ``batch_ingest.consumer`` subprocess on this run's stream, and a publisher."""

    def __init__(self, url: str, settings: Any, folder: Path, team: str) -> None:
        tag = secrets.token_hex(3)
        self.url = url
        self.stream = f"BENCH_FAULTS_{tag.upper()}"
        self.durable = f"bench-faults-{tag}"
        self.prefix = f"bench_faults_{tag}."
        self.team = team
        self.settings = settings
        self.log_path = folder / f"consumer-{tag}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.nc: Any = None
        self.js: Any = None

    async def start(self, timeout_s: float = 240.0) -> float:
        s = self.settings
        env = {
            **os.environ,
            "MILVUS__URI": s.milvus.uri,
            "MILVUS__COLLECTION": s.milvus.collection,
            "NEO4J__URI": s.neo4j.uri,
            "NEO4J__USER": s.neo4j.user,
            "NEO4J__PASSWORD": s.neo4j.password,
            "STATE__URL": s.state.url,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }
        argv = [
            sys.executable,
            "-m",
            "batch_ingest.consumer",
            "--url",
            self.url,
            "--stream",
            self.stream,
            "--durable",
            self.durable,
            "--subject-prefix",
            self.prefix,
            "--backoff",
            "2,5,10,20",
        ]
        t0 = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                argv,
                cwd=REPO_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        while time.monotonic() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the consumer exited: {self.log_tail()}")
            if "consuming" in self.log_path.read_text(errors="replace"):
                break
            await asyncio.sleep(1.0)
        else:
            raise TimeoutError(f"the consumer did not start in {timeout_s:.0f}s: {self.log_tail()}")
        import nats

        async def quiet(exc: Exception) -> None:  # reconnect attempts while NATS is down
            logger.debug("publisher: %r", exc)

        self.nc = await nats.connect(
            self.url,
            name="bench-faults-publisher",
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            connect_timeout=2,
            error_cb=quiet,
            **local_options(),
        )
        self.js = self.nc.jetstream()
        took = time.monotonic() - t0
        logger.info("consumer pid %d consuming %s after %.1fs", self.proc.pid, self.stream, took)
        return took

    def log_tail(self, n: int = 1500) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def event(self, doc: dict[str, Any], event_id: str) -> dict[str, Any]:
        payload = {k: v for k, v in doc.items() if k not in ("team_id",)}
        payload["revision"] = 1
        return {
            "event_id": event_id,
            "ts": int(time.time() * 1000),
            "domain": "doc",
            "type": "doc.upserted",
            "version": "1.0",
            "actor": {"id": "user_bench_faults", "kind": "user"},
            "payload": payload,
            "meta": {"team_id": self.team, "trace_id": uuid.uuid4().hex},
        }

    async def publish(self, event: dict[str, Any], timeout_s: float = 2.0) -> tuple[bool, str]:
        try:
            await self.js.publish(
                event_subject(self.team, "doc.upserted", self.prefix),
                json.dumps(event).encode(),
                headers={"Nats-Msg-Id": event["event_id"]},
                timeout=timeout_s,
            )
            return True, ""
        except Exception as exc:
            return False, f"{type(exc).__name__}: {exc}"[:200]

    async def stop(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.nc is not None:
            with contextlib.suppress(Exception):
                for name in (self.stream, f"{self.stream}_DLQ"):
                    await self.js.delete_stream(name)
                out["streams_deleted"] = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.nc.close(), 5)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.to_thread(self.proc.wait), 30)
            except TimeoutError:
                self.proc.kill()
            out["consumer_rc"] = self.proc.returncode
        out["consumer_log_tail"] = self.log_tail(600).splitlines()[-5:]
        return out


async def wait_indexed(
    store: Any, workload: Workload, state: DocState, timeout_s: float
) -> float | None:
    """Seconds until ``state``'s document holds exactly its variant-0 chunks (None: never)."""
    want = sorted(workload.ledger.expected_ids(state, 0))
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        try:
            got = await asyncio.wait_for(
                asyncio.to_thread(store.get_chunks, workload.team, state.doc_type, state.doc_id),
                15,
            )
            if sorted(c.chunk_id for c in got) == want:
                return time.monotonic() - t0
        except Exception as exc:
            logger.debug("reading %s: %r", state.doc_id, exc)
        await asyncio.sleep(0.5)
    return None
