"""ACL tightenings and deletes fired over HTTP at random phases of back-to-back
``POST /admin/reindex`` jobs of the same team, on a deployed app (issue 33): after each write
is acknowledged, and continuously while the jobs run, a team member outside the new access
list searches for every revoked document by its own marker word. Not one may come back.
At the end every tightened document is still found by the user it was tightened to (the
write was not lost either), and every job succeeded."""

from __future__ import annotations

import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx

from tests.integration.test_reindex import TOPICS

KEEPER, OUTSIDER = "keeper", "outsider"


def note(i: int) -> str:
    topic = TOPICS[i % len(TOPICS)]
    return "\n\n".join(
        f"Notes {i}.{p} about {topic}: the group met on item {p}; marker{i} stays open."
        for p in range(3)
    )


def event(team: str, etype: str, payload: dict[str, Any]) -> dict[str, Any]:
    return {
        "event_id": uuid.uuid4().hex,
        "ts": int(time.time() * 1000),
        "domain": "doc",
        "type": etype,
        "version": "1.0",
        "actor": {"id": "u_writer", "kind": "user"},
        "payload": payload,
        "meta": {"team_id": team, "trace_id": uuid.uuid4().hex},
    }


def upsert(team: str, i: int, revision: int, acl: dict[str, Any] | None = None) -> dict:
    payload: dict[str, Any] = {"doc_id": f"r{i:03d}", "text": note(i), "revision": revision}
    if acl is not None:
        payload["acl"] = acl
    return event(team, "doc.upserted", payload)


def delete(team: str, i: int, revision: int) -> dict:
    return event(
        team, "doc.deleted", {"doc_id": f"r{i:03d}", "doc_type": "doc", "revision": revision}
    )


@dataclass
class Outcome:
    writes: int = 0
    checks: int = 0
    jobs: list[dict[str, Any]] = field(default_factory=list)
    leaks: list[tuple[str, list[str]]] = field(default_factory=list)
    # The job's status when each check ran (a leak names it) and when each doc was revoked.
    phase: str = "none"
    revoked_at: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    tightened: set[str] = field(default_factory=set)
    found_by_keeper: set[str] = field(default_factory=set)


def found(c: httpx.Client, team: str, ids: set[str], user: str) -> set[str]:
    """Which of ``ids`` a search by their marker words returns to ``user``."""
    query = " ".join(f"marker{int(d[1:])}" for d in sorted(ids))
    r = c.post(
        "/rag/search_docs",
        json={"team_id": team, "query": query, "user_id": user, "search_mode": "bm25", "top_k": 50},
    )
    if r.status_code != 200:
        raise AssertionError(f"search answered {r.status_code}: {r.text[:300]}")
    return {m["source_ref"]["id"] for m in r.json()["matches"]} & ids


def revocations_during_reindexes(
    base: str, *, docs: int, writes: int, jobs: int, seed: int, timeout_s: float = 400
) -> Outcome:
    team = f"dao_revoke_{uuid.uuid4().hex[:6]}"
    out = Outcome()
    with httpx.Client(base_url=base, timeout=120) as c:
        r = c.post("/ingest/events", json={"events": [upsert(team, i, 1) for i in range(docs)]})
        assert r.status_code == 200 and r.json()["counts"].get("indexed") == docs, r.text
        stop = threading.Event()

        def run_jobs() -> None:
            with httpx.Client(base_url=base, timeout=120) as jc:
                while len(out.jobs) < jobs or not stop.is_set():
                    r = jc.post("/admin/reindex", json={"team_id": team})
                    if r.status_code != 202:
                        out.errors.append(f"POST /admin/reindex {r.status_code}: {r.text[:300]}")
                        return
                    job_id = r.json()["job_id"]
                    while True:
                        job = jc.get(f"/admin/reindex/{job_id}").json()
                        out.phase = f"job {len(out.jobs) + 1} {job['status']}"
                        if job["status"] not in ("queued", "running", "switching"):
                            break
                        time.sleep(0.3)
                    out.jobs.append(job)

        thread = threading.Thread(target=run_jobs, daemon=True)
        thread.start()
        rng = random.Random(seed)
        order = list(range(docs))
        rng.shuffle(order)
        revoked: set[str] = set()
        started = time.monotonic()
        while (out.writes < writes or len(out.jobs) < jobs) and order and not out.errors:
            i = order.pop()
            doc_id = f"r{i:03d}"
            if rng.random() < 0.5:
                ev, want = upsert(team, i, 2, {"allowed_users": [KEEPER]}), "indexed"
                out.tightened.add(doc_id)
            else:
                ev, want = delete(team, i, 2), "deleted"
            r = c.post("/ingest/events", json={"events": [ev]})
            assert r.status_code == 200, r.text
            assert r.json()["events"][0]["status"] == want, r.text
            revoked.add(doc_id)  # acknowledged
            out.writes += 1
            out.revoked_at[doc_id] = out.writes
            for _ in range(rng.randint(1, 3)):
                leaked = found(c, team, revoked, OUTSIDER)
                out.checks += 1
                if leaked:
                    when = (
                        f"after write {out.writes} at {time.monotonic() - started:.2f}s, "
                        f"{out.phase}, revoked at write "
                        + ", ".join(f"{d}: {out.revoked_at[d]}" for d in sorted(leaked))
                    )
                    out.leaks.append((when, sorted(leaked)))
                time.sleep(rng.uniform(0, 0.1))
            if time.monotonic() - started > timeout_s:
                break
        stop.set()
        while thread.is_alive():
            leaked = found(c, team, revoked, OUTSIDER)
            out.checks += 1
            if leaked:
                out.leaks.append(("while the last job finished", sorted(leaked)))
            time.sleep(0.1)
        out.found_by_keeper = found(c, team, out.tightened, KEEPER) if out.tightened else set()
    return out
