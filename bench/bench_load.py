"""Sustained mixed traffic against the gateway: an open-loop load test on real text.

An open-loop client (``httpx.AsyncClient``) sends requests at a fixed total rate whatever the
answers do (``--rate`` req/s for ``--duration`` s, default 600 s), each drawn from ``--mix``:

* ``search``: ``POST /rag/search_docs`` (``top_k`` 10) with an AppStream summary as the query
  (``bench.realtext``: the 2,126 Debian AppStream descriptions are the team's documents) or,
  ``--kjv-query-share`` of them, 10 words of a KJV chapter the team holds; ``--graph-search-share``
  of the searches ask ``"graph": "boost"`` (an entity lookup in Neo4j).
* ``enrich``: ``POST /rag/enrich_answer`` with a draft of two sentences of one AppStream
  description and one of another, ``max_docs`` 3.
* ``graph``: ``POST /graph/query`` with one of the named intents ``GET /graph/intents`` lists
  (all ten, arguments from the seeded graph), and a quarter of them (unless ``path`` is in the
  mix) ``POST /graph/explain_path`` between a seeded user, agent, project or topic.
* ``ingest``: ``POST /ingest/documents`` of one KJV chapter (several 200-token chunks): a new
  ``doc_id`` (``--ingest-shares`` new, the same text again, a changed text of a document
  already there — its last 15 % of words cut, so stale chunks must go).

Seeding (before the clock starts): the AppStream chunks straight into Milvus with cached real
embeddings (``--seed store``, with the harness) or through ``POST /ingest/documents``
(``--seed api``); then ``POST /graph/entities`` (users, agents, resources, memberships) and
``--graph-seed`` KJV chapters through the API with project, channel, author and tags, so the
intents have a graph to read.

Recorded per endpoint: requests scheduled and sent, answers by status, errors, throughput,
p50/p95/p99/max latency (from the send; also from the scheduled time), missed schedule
(``late``: sent more than ``--late-ms`` after its time; ``dropped``: not sent because
``--max-in-flight`` requests were waiting), degraded answers by reason, cache statuses. The RSS
of every Serve replica before and after (the ray state API with the harness; ``/proc`` by
process title with ``--url``). At the end the team's chunk count in Milvus against what the
ingests acknowledged (each touched document's stored chunk ids against the gateway's own
chunker), when the store is reachable. A progress line every ``--progress-s`` (30 s).

    .venv/bin/python -m bench.bench_load --rate 8 --duration 600
    .venv/bin/python -m bench.bench_load --url http://127.0.0.1:8000 --token "$JWT" --team dao_x
    .venv/bin/python -m bench.bench_load --duration 60 --rate 2      # a short trial

``bench/fault_run.py`` imports ``LoadGenerator``, ``Workload``, ``Recorder`` from here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import logging
import os
import random
import re
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.common import (
    DEFAULT_PORT,
    environment_info,
    latency_summary,
    markdown_table,
    setup_logging,
)

logger = logging.getLogger("bench.load")

SECRET = "bench-load-hs256-secret-0123456789abcdef0123"
COLLECTION = "bench_load"
TEAM = "bench_load_t0"
KINDS = ("search", "enrich", "graph", "path", "ingest")
PATHS = {
    "search": "/rag/search_docs",
    "enrich": "/rag/enrich_answer",
    "graph": "/graph/query",
    "path": "/graph/explain_path",
    "ingest": "/ingest/documents",
}
DEFAULT_MIX = "search=0.6,enrich=0.15,graph=0.15,ingest=0.1"
DEFAULT_TIMEOUTS = {"search": 60.0, "enrich": 60.0, "graph": 60.0, "path": 60.0, "ingest": 180.0}
CACHE_DIR = Path(__file__).resolve().parent / "results" / "cache"


# --- small helpers ------------------------------------------------------------------------


def parse_mix(text: str) -> dict[str, float]:
    """``"search=0.6,graph=0.15"`` → normalised shares; ``graph`` without ``path`` gives a
    quarter of its share to ``path`` (explain_path)."""
    mix: dict[str, float] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        name, _, value = part.partition("=")
        name = name.strip()
        if name not in KINDS:
            raise argparse.ArgumentTypeError(f"unknown kind {name!r} in --mix; kinds: {KINDS}")
        mix[name] = float(value)
    if "graph" in mix and "path" not in mix:
        mix["path"] = mix["graph"] / 4
        mix["graph"] -= mix["path"]
    total = sum(mix.values())
    if total <= 0:
        raise argparse.ArgumentTypeError("--mix needs a positive share")
    return {k: v / total for k, v in mix.items() if v > 0}


def parse_shares(text: str) -> dict[str, float]:
    names = ("new", "same", "modified")
    values = [float(v) for v in text.split(",")]
    if len(values) != 3 or sum(values) <= 0:
        raise argparse.ArgumentTypeError("--ingest-shares takes three numbers: new,same,modified")
    return {n: v / sum(values) for n, v in zip(names, values, strict=True)}


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9_]+", "_", name.lower()).strip("_")


_NUMBER = re.compile(r"\d+(\.\d+)?")


def reason_key(reason: str, doc_ids: Iterable[str] = ()) -> str:
    """A degraded reason without its variable parts (document ids, numbers), cut to its
    first two ``:``-separated parts: the key answers are counted by."""
    text = reason
    for doc_id in doc_ids:
        text = text.replace(doc_id, "<doc>")
    text = _NUMBER.sub("N", text)
    parts = [p.strip() for p in text.split(": ")]
    return ": ".join(parts[:2])[:140]


def rss_mb(pid: int) -> float | None:
    """Resident set size of ``pid`` in MiB (psutil where importable, else /proc)."""
    try:
        import psutil

        return round(psutil.Process(pid).memory_info().rss / 2**20, 1)
    except ImportError:
        pass
    except Exception:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


_REPLICA_TITLE = re.compile(r"ServeReplica:([^:\s]+):([A-Za-z0-9_]+)")


def serve_replicas() -> tuple[list[dict[str, Any]], str]:
    """ALIVE Serve replica actors of the cluster this process is connected to: the ray state
    API, else (no dashboard: the harness starts none) the GCS actor table.

    Returns:
        ``([{deployment, app, actor_id, pid, name}], source)``.
    """
    rows: list[dict[str, Any]] = []
    try:
        from ray.util.state import list_actors

        actors = list_actors(
            filters=[("state", "=", "ALIVE")],
            limit=10_000,
            timeout=10,
            raise_on_missing_output=False,
        )
        raw = [(a.class_name, a.actor_id, a.pid, a.name) for a in actors]
        source = "ray.util.state.list_actors"
    except Exception as exc:  # the state API needs the dashboard
        from ray._private import state as ray_state

        logger.debug("ray state API unavailable (%s); reading the GCS actor table", exc)
        table = ray_state.actors(actor_state_name="ALIVE")
        values = table.values() if isinstance(table, dict) else table
        raw = [(a["ActorClassName"], a["ActorID"], a["Pid"], a["Name"]) for a in values]
        source = "ray._private.state.actors (GCS)"
    for class_name, actor_id, pid, name in raw:
        match = _REPLICA_TITLE.search(class_name or "")
        if match:
            rows.append(
                {
                    "app": match.group(1),
                    "deployment": match.group(2),
                    "actor_id": actor_id,
                    "pid": int(pid) if pid else None,
                    "name": name,
                }
            )
    return sorted(rows, key=lambda r: (r["deployment"], r["actor_id"])), source


def proc_replicas() -> list[dict[str, Any]]:
    """Serve replica processes on this machine found by their process title (``ray::
    ServeReplica:<app>:<deployment>``): for ``--url``, where this process is no Ray driver."""
    rows = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            title = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        match = _REPLICA_TITLE.search(title) if title.startswith("ray::") else None
        if match:
            rows.append(
                {
                    "app": match.group(1),
                    "deployment": match.group(2),
                    "actor_id": None,
                    "pid": int(entry.name),
                    "name": title.strip()[:120],
                }
            )
    return sorted(rows, key=lambda r: (r["deployment"], r["pid"]))


def replica_memory(in_process: bool) -> dict[str, Any]:
    """Every Serve replica with its RSS now."""
    try:
        if in_process:
            replicas, source = serve_replicas()
        else:
            replicas, source = proc_replicas(), "/proc process titles (this machine)"
    except Exception as exc:
        return {"skipped": f"could not list the replicas: {exc!r}", "replicas": []}
    if not replicas:
        return {
            "skipped": "no Serve replica process found"
            + ("" if in_process else " on this machine (is the gateway running elsewhere?)"),
            "source": source,
            "replicas": [],
        }
    for r in replicas:
        r["rss_mb"] = rss_mb(r["pid"]) if r["pid"] else None
    return {"source": source, "at": time.time(), "replicas": replicas}


def rss_by_deployment(memory: dict[str, Any]) -> dict[str, float]:
    """The largest replica RSS of each deployment in one ``replica_memory`` sample."""
    out: dict[str, float] = {}
    for r in memory.get("replicas", []):
        if r.get("rss_mb") is not None:
            name = str(r.get("deployment"))
            out[name] = max(out.get(name, 0.0), float(r["rss_mb"]))
    return out


def memory_curve(windows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per deployment over the progress samples: first, peak, last, and the change over
    the second half (levelled off when it is small next to the whole run's)."""
    series: dict[str, list[tuple[float, float]]] = {}
    for w in windows:
        for name, mb in (w.get("rss_mb") or {}).items():
            series.setdefault(name, []).append((w["elapsed_s"], mb))
    out = {}
    for name, points in series.items():
        values = [mb for _, mb in points]
        half = values[len(values) // 2]
        out[name] = {
            "samples": len(values),
            "first_mb": values[0],
            "peak_mb": max(values),
            "last_mb": values[-1],
            "change_mb": round(values[-1] - values[0], 1),
            "second_half_change_mb": round(values[-1] - half, 1),
        }
    return out


def memory_delta(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """Per replica (matched by actor id, else pid): RSS before, after and the change."""

    def key(r: dict[str, Any]) -> Any:
        return r.get("actor_id") or r.get("pid")

    old = {key(r): r for r in before.get("replicas", [])}
    new = {key(r): r for r in after.get("replicas", [])}
    rows = []
    for k in list(old) + [k for k in new if k not in old]:
        a, b = old.get(k), new.get(k)
        r = b or a or {}
        ra = a.get("rss_mb") if a else None
        rb = b.get("rss_mb") if b else None
        rows.append(
            {
                "deployment": r.get("deployment"),
                "actor_id": r.get("actor_id"),
                "pid": r.get("pid"),
                "rss_before_mb": ra,
                "rss_after_mb": rb,
                "delta_mb": round(rb - ra, 1) if ra is not None and rb is not None else None,
                "note": "" if a and b else ("gone (replaced?)" if a else "new replica"),
            }
        )
    return rows


# --- the real text ------------------------------------------------------------------------


def appstream_set() -> dict[str, Any]:
    """The AppStream documents, summaries (queries) and qrels, cached as JSON next to the
    vector cache: parsing the DEP-11 YAML takes a minute on 2 cores."""
    from bench.quality import appstream_set as source

    path = source.catalogue_path()
    stat = os.stat(path)
    tag = hashlib.sha256(f"{path}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    cached = CACHE_DIR / f"load-appstream-{tag}.json"
    if cached.exists():
        return json.loads(cached.read_text())
    from bench import realtext

    labeled = realtext.appstream("placeholder")
    data = {
        "documents": [{k: v for k, v in d.items() if k != "team_id"} for d in labeled.documents],
        "queries": labeled.queries,
        "qrels": {q: dict(r) for q, r in labeled.qrels.items()},
    }
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps(data))
    return data


# Traditional authors, so EXPERTS_ON_TOPIC and explain_path have people to find.
AUTHORS = {
    **dict.fromkeys(["genesis", "exodus", "leviticus", "numbers", "deuteronomy"], "moses"),
    "psalms": "david",
    "proverbs": "solomon",
    "ecclesiastes": "solomon",
    "isaiah": "isaiah",
    "jeremiah": "jeremiah",
    "matthew": "matthew",
    "mark": "mark",
    "luke": "luke",
    "acts": "luke",
    "john": "john",
    "revelation_of_john": "john",
    **dict.fromkeys(["romans", "i_corinthians", "ii_corinthians", "galatians"], "paul"),
}


def chapter_book(doc: dict[str, Any]) -> str:
    return doc["doc_id"].split("-", 1)[1].rsplit(".", 1)[0]


# --- the ingest ledger --------------------------------------------------------------------


@dataclass
class DocState:
    """One document the run may write, and what the gateway acknowledged of it."""

    doc: dict[str, Any]
    # The variant the gateway acknowledged storing last (0 full text, 1 cut); None: what was
    # stored before the run (``initial``).
    acked: int | None = None
    # Variants sent without a clear answer (503, timeout, failed): stored or not.
    uncertain: set[int] = field(default_factory=set)
    busy: bool = False
    attempts: int = 0
    outcomes: Counter = field(default_factory=Counter)
    initial: list[str] | None = None  # chunk ids stored when the run started

    @property
    def doc_id(self) -> str:
        return str(self.doc["doc_id"])

    @property
    def doc_type(self) -> str:
        return str(self.doc.get("doc_type", "doc"))

    def variant(self, n: int) -> dict[str, Any]:
        if n == 0:
            return dict(self.doc)
        words = self.doc["text"].split()
        return {**self.doc, "text": " ".join(words[: max(8, int(len(words) * 0.85))])}

    @property
    def current(self) -> int:
        """The variant a re-send of the same text uses."""
        return self.acked if self.acked is not None else 0


class Ledger:
    """Which documents were sent, which variant each request carried and what the gateway
    answered: the expected chunks at the end.

    Args:
        pool: documents not in the team yet (new ``doc_id``\\s are taken from its front).
        shares: ``new``/``same``/``modified`` shares of the ingests.
        chunk_ids: the gateway's chunk ids of a document dict (its own chunker).
    """

    def __init__(
        self,
        pool: list[dict[str, Any]],
        shares: dict[str, float],
        chunk_ids: Callable[[dict[str, Any]], list[str]],
    ) -> None:
        self.docs: dict[str, DocState] = {}
        self.pool = [DocState(d) for d in pool]
        self.shares = shares
        self._chunk_ids = chunk_ids
        self._ids_cache: dict[tuple[str, int], list[str]] = {}
        self.ops: Counter = Counter()

    def expected_ids(self, state: DocState, variant: int) -> list[str]:
        key = (state.doc_id, variant)
        if key not in self._ids_cache:
            self._ids_cache[key] = self._chunk_ids(state.variant(variant))
        return self._ids_cache[key]

    def register(self, doc: dict[str, Any]) -> DocState:
        """A document written outside the load's ingests (seeding, probes, the bus)."""
        state = self.docs.get(doc["doc_id"])
        if state is None:
            state = DocState(doc)
            self.docs[state.doc_id] = state
        return state

    def take_new(self) -> DocState | None:
        while self.pool:
            state = self.pool.pop(0)
            if state.doc_id not in self.docs:
                self.docs[state.doc_id] = state
                return state
        return None

    def pick(self, rng: random.Random) -> tuple[DocState, int, str] | None:
        """The next ingest: (document, variant, op), the document marked busy."""
        op = rng.choices(list(self.shares), weights=list(self.shares.values()))[0]
        known = [s for s in self.docs.values() if s.acked is not None and not s.busy]
        if op != "new" and not known:
            op = "new"
        state: DocState | None
        if op == "new":
            state = self.take_new()
            if state is None:
                if not known:
                    return None
                op = "same"
        if op == "same":
            state = rng.choice(known)
            variant = state.current
        elif op == "modified":
            state = rng.choice(known)
            variant = 1 - state.current
        else:
            assert state is not None
            variant = 0
        state.busy = True
        self.ops[op] += 1
        return state, variant, op

    def settle(self, state: DocState, variant: int, outcome: str) -> None:
        """``written`` (200: indexed or unchanged), ``refused`` (a 4xx: nothing written) or
        ``uncertain`` (503, 5xx, timeout, per-document failure)."""
        state.busy = False
        state.attempts += 1
        state.outcomes[outcome] += 1
        if outcome == "written":
            state.acked = variant
            state.uncertain.clear()
        elif outcome == "uncertain":
            state.uncertain.add(variant)

    def touched(self) -> list[DocState]:
        return [s for s in self.docs.values() if s.attempts]


def verify_chunks(store: Any, team: str, ledger: Ledger, count_before: int) -> dict[str, Any]:
    """The team's chunk count against the acknowledged ingests, and every touched document's
    stored chunk ids against its acknowledged variant's (an uncertain one may be either)."""
    touched = ledger.touched()
    keys = [(team, s.doc_type, s.doc_id) for s in touched]
    stored: dict[tuple[str, str, str], list[tuple[str, str, str]]] = {}
    for start in range(0, len(keys), 256):
        stored.update(store.fingerprints(keys[start : start + 256]))
    problems: list[dict[str, Any]] = []
    uncertain_resolved: Counter = Counter()
    delta = 0
    for state, key in zip(touched, keys, strict=True):
        ids = [row[0] for row in stored.get(key, [])]
        initial = state.initial or []
        expected = (
            ledger.expected_ids(state, state.acked) if state.acked is not None else list(initial)
        )
        options = {"acknowledged": expected}
        for v in sorted(state.uncertain):
            options[f"uncertain variant {v}"] = ledger.expected_ids(state, v)
        match = next((name for name, want in options.items() if sorted(want) == sorted(ids)), None)
        if state.uncertain:
            uncertain_resolved[match or "neither"] += 1
        if match is None:
            problems.append(
                {
                    "doc_id": state.doc_id,
                    "stored": len(ids),
                    "stored_distinct": len(set(ids)),
                    "expected": len(expected),
                    "missing": len(set(expected) - set(ids)),
                    "extra": len(set(ids) - set(expected)),
                    "outcomes": dict(state.outcomes),
                }
            )
            delta += len(ids) - len(initial)
        else:
            delta += len(options[match]) - len(initial)
    count_after = None
    for attempt in range(3):
        count_after = store.count(team)
        if count_after == count_before + delta:
            break
        time.sleep(2.0 * (attempt + 1))  # a count may trail the last write briefly
    expected_total = count_before + sum(
        len(ledger.expected_ids(s, s.acked) if s.acked is not None else (s.initial or []))
        - len(s.initial or [])
        for s in touched
    )
    return {
        "team": team,
        "count_before_load": count_before,
        "count_after": count_after,
        "expected_from_acknowledged": expected_total,
        "expected_with_uncertain_as_found": count_before + delta,
        # Exact: every document holds the chunks of its acknowledged variant (an uncertain
        # request's variant where one was stored), and the count is what that adds up to.
        "exact": count_after == count_before + delta and not problems,
        "exact_without_uncertain": count_after == expected_total and not problems,
        "documents_checked": len(touched),
        "uncertain_documents": {k: v for k, v in uncertain_resolved.items()},
        "mismatched_documents": len(problems),
        "mismatches": problems[:20],
    }


# --- the workload ---------------------------------------------------------------------------


class Workload:
    """Request bodies from the real-text sets and the seeded graph.

    Args:
        team: the team of every request.
        apps: ``appstream_set()``.
        chapters: KJV chapters (``realtext.kjv_chapters``) of ``team``.
        graph_seed: chapters ingested (with graph metadata) before the load.
        seed: the random seed of every choice.
    """

    def __init__(
        self,
        team: str,
        apps: dict[str, Any],
        chapters: list[dict[str, Any]],
        *,
        graph_seed: int,
        seed: int,
        kjv_query_share: float,
        graph_search_share: float,
        ingest_shares: dict[str, float],
        chunk_ids: Callable[[dict[str, Any]], list[str]],
        app_docs: int | None = None,
    ) -> None:
        self.team = team
        self.rng = random.Random(seed)
        docs = apps["documents"][:app_docs] if app_docs else apps["documents"]
        self.app_docs = [{**d, "team_id": team} for d in docs]
        present = {d["doc_id"] for d in self.app_docs}
        summary_of: dict[str, str] = {}
        for qid, text in sorted(apps["queries"].items()):
            for doc_id in apps["qrels"].get(qid, {}):
                summary_of.setdefault(doc_id, text)
        self.summary_of = summary_of
        self.app_queries = [
            t for q, t in sorted(apps["queries"].items()) if set(apps["qrels"].get(q, {})) & present
        ] or list(apps["queries"].values())
        self.kjv_query_share = kjv_query_share
        self.graph_search_share = graph_search_share
        books = list(dict.fromkeys(chapter_book(c) for c in chapters))
        self.testament = {
            b: ("old-testament" if i < 39 else "new-testament") for i, b in enumerate(books)
        }
        enriched = [self.chapter_doc(c) for c in chapters]
        stride = max(1, len(enriched) // max(graph_seed, 1))
        self.seed_chapters = enriched[::stride][:graph_seed]
        seeded = {d["doc_id"] for d in self.seed_chapters}
        pool = [d for d in enriched if d["doc_id"] not in seeded]
        random.Random(seed + 1).shuffle(pool)
        self.ledger = Ledger(pool, ingest_shares, chunk_ids)
        seed_books = list(dict.fromkeys(chapter_book(d) for d in self.seed_chapters))
        self.books = [slug(b) for b in seed_books]
        self.users = sorted({self.author(b) for b in self.books})
        self.projects = [f"prj_{b}" for b in self.books]
        self.channels = [f"ch_{b}" for b in self.books]
        self.agents = ["agent_concordance", "agent_reader"]
        self.resources = {"res_kjv1769": "KJV 1769", "res_strongs": "Strong's Concordance"}
        self.intents: list[str] = []  # set from GET /graph/intents
        self._probe_verses: list[dict[str, Any]] = []

    def author(self, book_slug: str) -> str:
        return f"user_{AUTHORS.get(book_slug, 'scribe_' + book_slug)}"

    def chapter_doc(self, chapter: dict[str, Any]) -> dict[str, Any]:
        book = slug(chapter_book(chapter))
        return {
            **chapter,
            "team_id": self.team,
            "project_id": f"prj_{book}",
            "channel_id": f"ch_{book}",
            "author_id": self.author(book),
            "tags": ["kjv", book, self.testament.get(chapter_book(chapter), "kjv")],
        }

    # --- seeding ------------------------------------------------------------------------
    def graph_entities(self) -> dict[str, Any]:
        """``POST /graph/entities``: members (with roles), agents serving projects and the
        DAO, resources the projects use."""
        nodes: list[dict[str, Any]] = [
            {"label": "User", "id": u, "name": u.removeprefix("user_").replace("_", " ").title()}
            for u in self.users
        ]
        nodes += [{"label": "Agent", "id": a, "name": a} for a in self.agents]
        nodes += [{"label": "Resource", "id": k, "name": v} for k, v in self.resources.items()]
        rels: list[dict[str, Any]] = []
        for i, u in enumerate(self.users):
            role = "elder" if i % 3 == 0 else "member"
            rels.append(
                {
                    "type": "MEMBER_OF",
                    "from": {"label": "User", "id": u},
                    "to": {"label": "MicroDAO", "id": self.team},
                    "properties": {"role": role},
                }
            )
        nodes.append({"label": "MicroDAO", "id": self.team, "name": self.team})
        for i, p in enumerate(self.projects):
            nodes.append({"label": "Project", "id": p, "name": p})
            rels.append(
                {
                    "type": "SERVES",
                    "from": {"label": "Agent", "id": self.agents[i % 2]},
                    "to": {"label": "Project", "id": p},
                }
            )
            for res in ("res_kjv1769",) + (("res_strongs",) if i % 2 == 0 else ()):
                rels.append(
                    {
                        "type": "USES",
                        "from": {"label": "Project", "id": p},
                        "to": {"label": "Resource", "id": res},
                    }
                )
        rels.append(
            {
                "type": "SERVES",
                "from": {"label": "Agent", "id": "agent_reader"},
                "to": {"label": "MicroDAO", "id": self.team},
            }
        )
        return {"team_id": self.team, "nodes": nodes, "relationships": rels}

    # --- request bodies -------------------------------------------------------------------
    def held_chapters(self) -> list[DocState]:
        return [s for s in self.ledger.docs.values() if s.acked is not None]

    def search_body(self, rng: random.Random) -> dict[str, Any]:
        held = self.held_chapters()
        if held and rng.random() < self.kjv_query_share:
            words = rng.choice(held).variant(0)["text"].split()
            start = rng.randrange(max(1, len(words) - 12))
            query = " ".join(words[start : start + 10])
        else:
            query = rng.choice(self.app_queries)
        body: dict[str, Any] = {"team_id": self.team, "query": query, "top_k": 10}
        if rng.random() < self.graph_search_share:
            body["graph"] = "boost"
        return body

    def enrich_body(self, rng: random.Random) -> dict[str, Any]:
        a, b = rng.sample(self.app_docs, 2)

        def sentences(doc: dict[str, Any], n: int) -> str:
            parts = re.split(r"(?<=[.!?])\s+", doc["text"])
            return " ".join(parts[:n])

        draft = f"{sentences(a, 2)} {sentences(b, 1)}".strip()[:4000]
        question = self.summary_of.get(a["doc_id"]) or f"What is {a.get('title') or a['doc_id']}?"
        return {"team_id": self.team, "question": question, "draft_answer": draft, "max_docs": 3}

    def graph_body(self, rng: random.Random) -> dict[str, Any]:
        intent = rng.choice(self.intents or ["DOCS_MENTIONING_TOPIC"])
        book = rng.choice(self.books)
        held = self.held_chapters()
        args: dict[str, Any] = {
            "FIND_PROJECTS_BY_TECH": {"tech": rng.choice(list(self.resources.values()) + [book])},
            "MEMBERS_OF_DAO": rng.choice([{}, {"role": "elder"}]),
            "AGENTS_SERVING": {"target": rng.choice(self.projects + [self.team])},
            "DOCS_MENTIONING_TOPIC": {"topic": rng.choice([book, "kjv", "new-testament"])},
            "RESOURCES_USED_BY_PROJECT": {"project": f"prj_{book}"},
            "TOPICS_OF_CHANNEL": {"channel": f"ch_{book}"},
            "EXPERTS_ON_TOPIC": {"topic": book},
            "RELATED_PROJECTS": {"project": f"prj_{book}"},
            "LINKED_DOCS": {"doc": rng.choice(held).doc_id if held else "kjv-Genesis.1"},
            "ENTITY_NEIGHBOURS": {"entity": rng.choice(self.users + self.projects)},
        }.get(intent, {})
        return {"team_id": self.team, "intent": intent, "args": args}

    def path_body(self, rng: random.Random) -> dict[str, Any]:
        book = rng.choice(self.books)
        pairs = [
            (self.author(book), f"prj_{book}"),
            (self.author(book), book),
            (rng.choice(self.agents), "res_kjv1769"),
            (self.author(book), rng.choice(self.users)),
        ]
        src, dst = rng.choice(pairs)
        if src == dst:
            dst = f"prj_{book}"
        return {"team_id": self.team, "from": src, "to": dst, "max_hops": 4, "max_paths": 3}

    def ingest_pick(self, rng: random.Random) -> tuple[DocState, int, str] | None:
        return self.ledger.pick(rng)

    def probe_doc(self, label: str) -> DocState:
        """A new one-chunk document (a KJV verse) for a probe ingest."""
        if not self._probe_verses:
            from bench import realtext

            verses = realtext.kjv_documents(self.team)
            self._probe_verses = verses[::-1][:2000]
        verse = self._probe_verses.pop(0)
        doc = {
            **verse,
            "doc_id": f"probe-{label}-{verse['doc_id']}",
            "team_id": self.team,
            "tags": ["kjv", "probe"],
        }
        state = self.ledger.register(doc)
        state.busy = True
        return state


# --- what happened ---------------------------------------------------------------------------


@dataclass
class Sample:
    """One request and its answer. Times are ``time.monotonic()`` seconds."""

    kind: str
    scheduled: float
    sent: float
    done: float
    status: int | str  # the HTTP status, or "timeout" / "transport:<Error>" / "cancelled"
    degraded: list[str] = field(default_factory=list)
    error: str = ""  # "<error code>: <message>" of a non-2xx answer, or the exception
    cache: str = ""
    probe: str = ""  # "" for the scheduled load, else the probe's label
    late: bool = False
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def latency_s(self) -> float:
        return self.done - self.sent

    @property
    def ok(self) -> bool:
        return isinstance(self.status, int) and 200 <= self.status < 300

    @property
    def normal(self) -> bool:
        return self.ok and not self.degraded and not self.cache.startswith("unavailable")

    def brief(self, t0: float) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "probe": self.probe,
            "sent_s": round(self.sent - t0, 3),
            "latency_ms": round(self.latency_s * 1000, 1),
            "status": self.status,
            "error": self.error[:300],
            "degraded": [d[:200] for d in self.degraded],
            "cache": self.cache[:120],
            **({"detail": self.detail} if self.detail else {}),
        }


class Recorder:
    """Every answer, and the schedule's misses, per kind."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.samples: list[Sample] = []
        self.scheduled: Counter = Counter()
        self.late: Counter = Counter()
        self.dropped: Counter = Counter()
        self.windows: list[dict[str, Any]] = []

    def add(self, sample: Sample) -> None:
        self.samples.append(sample)

    def between(self, start: float, end: float, *, by: str = "sent") -> list[Sample]:
        return [s for s in self.samples if start <= getattr(s, by) < end]


def error_samples(samples: list[Sample], per_status: int = 2) -> dict[str, list[str]]:
    """The first messages of each non-2xx status."""
    out: dict[str, list[str]] = {}
    for s in samples:
        if not s.ok:
            got = out.setdefault(str(s.status), [])
            if len(got) < per_status:
                got.append(s.error[:300])
    return out


def summarize(
    samples: list[Sample],
    seconds: float,
    scheduled: Counter | None = None,
    late: Counter | None = None,
    dropped: Counter | None = None,
) -> dict[str, Any]:
    """Per kind (and ``all``): counts by status, errors, throughput, latency percentiles,
    missed schedule, degraded answers by reason, cache statuses."""
    out: dict[str, Any] = {}
    kinds = sorted(
        {s.kind for s in samples} | set(scheduled or {}),
        key=lambda k: (KINDS.index(k) if k in KINDS else 99, k),
    )
    for kind in [*kinds, "all"]:
        group = [s for s in samples if kind in ("all", s.kind)]

        def total(c: Counter | None, kind: str = kind) -> int:
            if c is None:
                return 0
            return sum(c.values()) if kind == "all" else c.get(kind, 0)

        statuses = Counter(str(s.status) for s in group)
        degraded: Counter = Counter()
        for s in group:
            for r in s.degraded:
                degraded[reason_key(r, [s.detail.get("doc_id", "")] if s.detail else [])] += 1
        ok = [s for s in group if s.ok]
        out[kind] = {
            "scheduled": total(scheduled) if scheduled is not None else len(group),
            "answered": len(group),
            "ok": len(ok),
            "statuses": dict(sorted(statuses.items())),
            "errors": {k: v for k, v in sorted(statuses.items()) if not k.startswith("2")},
            "error_samples": error_samples(group),
            "throughput_rps": round(len(group) / seconds, 3) if seconds > 0 else None,
            "ok_rps": round(len(ok) / seconds, 3) if seconds > 0 else None,
            "latency": latency_summary([s.latency_s for s in group]),
            "latency_ok": latency_summary([s.latency_s for s in ok]),
            "latency_from_schedule": latency_summary([s.done - s.scheduled for s in group]),
            "missed_schedule": {
                "late": total(late),
                "dropped": total(dropped),
                "total": total(late) + total(dropped),
            },
            "degraded_answers": sum(1 for s in group if s.degraded),
            "degraded_by_reason": dict(degraded.most_common()),
        }
        cache = Counter(s.cache.split(":")[0] for s in group if s.cache)
        if cache:
            out[kind]["cache"] = dict(cache)
        sizes = [
            v
            for s in ok
            for k, v in s.detail.items()
            if k in ("matches", "sources", "rows", "paths")
        ]
        if sizes:
            out[kind]["empty_answers"] = sum(1 for v in sizes if v == 0)
            out[kind]["mean_items"] = round(sum(sizes) / len(sizes), 2)
        ops = Counter(s.detail.get("op") for s in group if s.detail.get("op"))
        if ops:
            out[kind]["ingest_ops"] = dict(ops)
            out[kind]["doc_status"] = dict(
                Counter(s.detail.get("doc_status", "-") for s in group if s.detail.get("op"))
            )
    return out


# --- the load generator -----------------------------------------------------------------------


class LoadGenerator:
    """Open-loop traffic: request ``i`` is due at ``start + i / rate`` whatever the earlier
    ones are doing; a request more than ``late_s`` behind its time is counted ``late``, one
    that finds ``max_in_flight`` requests waiting is not sent (``dropped``).

    Args:
        client: an ``httpx.AsyncClient`` on the gateway's base URL (auth headers set).
        workload: the bodies.
        recorder: where every answer goes.
        rate: requests per second, all kinds together (``set_rate`` changes it).
        mix: share per kind (``parse_mix``).
    """

    def __init__(
        self,
        client: httpx.AsyncClient,
        workload: Workload,
        recorder: Recorder,
        *,
        rate: float,
        mix: dict[str, float],
        seed: int = 16,
        late_s: float = 0.1,
        max_in_flight: int = 256,
        timeouts: dict[str, float] | None = None,
    ) -> None:
        self.client = client
        self.workload = workload
        self.recorder = recorder
        self.rate = rate
        self.mix = mix
        self.rng = random.Random(seed)
        self.late_s = late_s
        self.max_in_flight = max_in_flight
        self.timeouts = {**DEFAULT_TIMEOUTS, **(timeouts or {})}
        self.in_flight: set[asyncio.Task[Sample]] = set()
        self.sent = 0
        # Set to sample the replicas' RSS with each progress line (a curve, not two points).
        self.memory_probe: Callable[[], dict[str, Any]] | None = None

    def set_rate(self, rate: float) -> None:
        self.rate = rate

    def choose(self) -> str:
        return self.rng.choices(list(self.mix), weights=list(self.mix.values()))[0]

    async def run(
        self,
        duration_s: float,
        *,
        stop: asyncio.Event | None = None,
        progress_s: float = 30.0,
    ) -> float:
        """Send until ``duration_s`` passed or ``stop`` is set, then wait for the answers
        (at most the longest timeout). Returns the seconds the schedule ran."""
        start = time.monotonic()
        next_at = start
        reporter = asyncio.create_task(self._progress(start, progress_s))
        try:
            while True:
                now = time.monotonic()
                if now - start >= duration_s or (stop is not None and stop.is_set()):
                    break
                if self.rate <= 0:
                    next_at = now + 0.2
                    await asyncio.sleep(0.2)
                    continue
                if next_at > now:
                    await asyncio.sleep(min(next_at - now, 0.25))
                    continue
                lateness = now - next_at
                kind = self.choose()
                self.recorder.scheduled[kind] += 1
                if len(self.in_flight) >= self.max_in_flight:
                    self.recorder.dropped[kind] += 1
                else:
                    late = lateness > self.late_s
                    if late:
                        self.recorder.late[kind] += 1
                    self.spawn(kind, scheduled=next_at, late=late)
                next_at += 1.0 / self.rate
            ran = time.monotonic() - start
        finally:
            reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reporter
        await self.drain()
        self._log_window(start, final=True)
        return ran

    def spawn(
        self,
        kind: str,
        *,
        scheduled: float | None = None,
        late: bool = False,
        probe: str = "",
        body: dict[str, Any] | None = None,
        state: tuple[DocState, int, str] | None = None,
    ) -> asyncio.Task[Sample]:
        task = asyncio.create_task(
            self.request(kind, scheduled=scheduled, late=late, probe=probe, body=body, state=state)
        )
        self.in_flight.add(task)
        task.add_done_callback(self.in_flight.discard)
        return task

    async def drain(self, timeout_s: float | None = None) -> None:
        pending = set(self.in_flight)
        if not pending:
            return
        limit = timeout_s if timeout_s is not None else max(self.timeouts.values()) + 10
        done, still = await asyncio.wait(pending, timeout=limit)
        for task in still:
            task.cancel()
        if still:
            logger.warning("%d requests still unanswered after %.0fs: cancelled", len(still), limit)
            await asyncio.wait(still, timeout=5)

    def body_for(self, kind: str) -> tuple[dict[str, Any], tuple[DocState, int, str] | None]:
        rng = self.rng
        if kind == "search":
            return self.workload.search_body(rng), None
        if kind == "enrich":
            return self.workload.enrich_body(rng), None
        if kind == "graph":
            return self.workload.graph_body(rng), None
        if kind == "path":
            return self.workload.path_body(rng), None
        if kind == "ingest":
            picked = self.workload.ingest_pick(rng)
            if picked is None:
                return self.workload.search_body(rng), None
            state, variant, _ = picked
            return {"documents": [state.variant(variant)]}, picked
        raise ValueError(kind)

    async def request(
        self,
        kind: str,
        *,
        scheduled: float | None = None,
        late: bool = False,
        probe: str = "",
        body: dict[str, Any] | None = None,
        state: tuple[DocState, int, str] | None = None,
    ) -> Sample:
        """Send one request of ``kind`` (its body drawn unless given) and record the answer."""
        if body is None and state is None:
            body, state = self.body_for(kind)
            if kind == "ingest" and state is None:
                kind = "search"  # nothing left to ingest
        if state is not None:
            body = {"documents": [state[0].variant(state[1])]}
        sent = time.monotonic()
        sample = Sample(
            kind,
            scheduled if scheduled is not None else sent,
            sent,
            sent,
            "-",
            probe=probe,
            late=late,
        )
        if state is not None:
            sample.detail = {"doc_id": state[0].doc_id, "op": state[2], "variant": state[1]}
        elif kind == "graph" and body:
            sample.detail = {"intent": body.get("intent")}
        self.sent += 1
        data: Any = None
        try:
            resp = await self.client.post(PATHS[kind], json=body, timeout=self.timeouts[kind])
            sample.status = resp.status_code
            with contextlib.suppress(ValueError):
                data = resp.json()
            if resp.status_code == 202 and isinstance(data, dict) and data.get("status_url"):
                data, sample.status = await self._wait_job(data["status_url"], sent, kind)
        except httpx.TimeoutException:
            sample.status = "timeout"
            sample.error = f"no answer within {self.timeouts[kind]:g}s"
        except httpx.TransportError as exc:
            sample.status = f"transport:{type(exc).__name__}"
            sample.error = str(exc)[:300]
        except asyncio.CancelledError:
            sample.status = "cancelled"
            sample.done = time.monotonic()
            self._finish(sample, None, state)
            raise
        sample.done = time.monotonic()
        self._finish(sample, data, state)
        return sample

    async def _wait_job(self, url: str, sent: float, kind: str) -> tuple[Any, int | str]:
        """Poll a 202 ingest job until done or failed (the request's own timeout)."""
        while time.monotonic() - sent < self.timeouts[kind]:
            await asyncio.sleep(1.0)
            resp = await self.client.get(url, timeout=30)
            job = resp.json()
            if job.get("status") == "done":
                return job.get("result") or {}, 200
            if job.get("status") == "failed":
                return {"error": "job_failed", "message": job.get("error")}, "job_failed"
        return {"error": "job_timeout", "message": url}, "timeout"

    def _finish(self, sample: Sample, data: Any, state: tuple[DocState, int, str] | None) -> None:
        if isinstance(data, dict):
            if sample.ok:
                sample.degraded = [str(r) for r in data.get("degraded_reasons") or []]
                if data.get("degraded") and not sample.degraded:
                    sample.degraded = ["degraded (no reason given)"]
                cache = data.get("cache")
                if isinstance(cache, dict):
                    sample.cache = str(cache.get("status", ""))
                # How much came back: matches, sources, rows or paths.
                for key in ("matches", "sources", "rows", "paths"):
                    if isinstance(data.get(key), list):
                        sample.detail[key] = len(data[key])
                        break
            elif not sample.error:
                sample.error = f"{data.get('error', '')}: {data.get('message', '')}"[:500]
                if sample.detail.get("intent"):
                    sample.error = f"[{sample.detail['intent']}] {sample.error}"
        elif not sample.ok and not sample.error:
            sample.error = "(no JSON body)"
        if state is not None:
            doc_state, variant, _ = state
            outcome = "uncertain"
            if sample.ok and isinstance(data, dict):
                docs = data.get("documents") or [{}]
                doc_status = docs[0].get("status", "?")
                sample.detail["doc_status"] = doc_status
                sample.detail["chunks"] = docs[0].get("chunks")
                outcome = "written" if doc_status in ("indexed", "unchanged") else "uncertain"
            elif isinstance(sample.status, int) and 400 <= sample.status < 500:
                outcome = "refused"
            self.workload.ledger.settle(doc_state, variant, outcome)
        self.recorder.add(sample)

    async def _progress(self, start: float, every_s: float) -> None:
        while True:
            await asyncio.sleep(every_s)
            memory = None
            if self.memory_probe is not None:
                memory = rss_by_deployment(await asyncio.to_thread(self.memory_probe))
            self._log_window(start, memory=memory)

    def _log_window(
        self, start: float, final: bool = False, memory: dict[str, float] | None = None
    ) -> None:
        now = time.monotonic()
        rec = self.recorder
        last = rec.windows[-1]["until"] if rec.windows else start
        window = rec.between(last, now, by="done")
        lat = latency_summary([s.latency_s for s in window])
        errors = Counter(str(s.status) for s in window if not s.ok)
        entry = {
            "since": last,
            "until": now,
            "elapsed_s": round(now - start, 1),
            "answered": len(window),
            "rps": round(len(window) / max(now - last, 1e-9), 2),
            "p50_ms": lat.get("p50_ms"),
            "p95_ms": lat.get("p95_ms"),
            "max_ms": lat.get("max_ms"),
            "errors": dict(errors),
            "degraded": sum(1 for s in window if s.degraded),
            "in_flight": len(self.in_flight),
        }
        if memory is not None:
            entry["rss_mb"] = memory
        rec.windows.append(entry)
        missed = sum(rec.late.values()) + sum(rec.dropped.values())
        logger.info(
            "%s%5.0fs: sent %d, in flight %d | last %.0fs: %d answers %.1f/s, p50 %s p95 %s "
            "max %s ms, errors %s, degraded %d | missed schedule %d",
            "done " if final else "",
            entry["elapsed_s"],
            self.sent,
            len(self.in_flight),
            now - last,
            len(window),
            entry["rps"],
            entry["p50_ms"],
            entry["p95_ms"],
            entry["max_ms"],
            dict(errors) or "none",
            entry["degraded"],
            missed,
        )


# --- set-up shared with fault_run -----------------------------------------------------------


def token(team: str, settings: Any, role: str = "owner") -> str:
    import jwt

    now = int(time.time())
    claims: dict[str, Any] = {"sub": "bench-load", "iat": now, "exp": now + 86_400}
    claims[settings.auth.claims.teams] = {team: [role]}
    return jwt.encode(claims, SECRET, "HS256")


def chunk_counter(settings: Any) -> Callable[[dict[str, Any]], list[str]]:
    """The gateway's chunk ids of one document dict (its chunker and tokenizer)."""
    from batch_ingest.chunks import chunk_builder
    from batch_ingest.documents import SourceDocument

    builder = chunk_builder(settings.chunking, settings.embedder)

    def ids(doc: dict[str, Any]) -> list[str]:
        return [c.chunk_id for c in builder.build_chunks(SourceDocument.model_validate(doc))]

    return ids


def build_workload(args: argparse.Namespace, settings: Any) -> Workload:
    from bench import realtext

    t0 = time.perf_counter()
    apps = appstream_set()
    chapters = realtext.kjv_chapters(args.team)
    workload = Workload(
        args.team,
        apps,
        chapters,
        graph_seed=args.graph_seed,
        seed=args.seed,
        kjv_query_share=args.kjv_query_share,
        graph_search_share=args.graph_search_share,
        ingest_shares=args.ingest_shares,
        chunk_ids=chunk_counter(settings),
        app_docs=args.seed_apps or None,
    )
    logger.info(
        "workload: %d AppStream documents, %d queries, %d KJV chapters (%d seeded with graph "
        "metadata) in %.1fs",
        len(workload.app_docs),
        len(workload.app_queries),
        len(chapters),
        len(workload.seed_chapters),
        time.perf_counter() - t0,
    )
    return workload


async def post_ok(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], timeout: float = 300.0
) -> dict[str, Any]:
    resp = await client.post(path, json=body, timeout=timeout)
    if resp.status_code not in (200, 202):
        raise RuntimeError(f"POST {path} answered {resp.status_code}: {resp.text[:500]}")
    data: dict[str, Any] = resp.json()
    return data


async def seed_via_api(
    client: httpx.AsyncClient,
    workload: Workload,
    docs: list[dict[str, Any]],
    what: str,
    batch: int = 16,
) -> dict[str, Any]:
    """Ingest ``docs`` through ``POST /ingest/documents`` (sequential batches; registered in
    the ledger as acknowledged)."""
    t0 = time.perf_counter()
    totals: Counter = Counter()
    for start in range(0, len(docs), batch):
        part = docs[start : start + batch]
        data = await post_ok(client, PATHS["ingest"], {"documents": part}, timeout=600)
        if "documents" not in data:
            raise RuntimeError(f"seeding {what}: ingest answered a job, not a result: {data}")
        for doc, res in zip(part, data["documents"], strict=True):
            totals[res["status"]] += 1
            totals["chunks"] += int(res.get("chunks") or 0)
            if doc["doc_id"] in workload.ledger.docs or what == "chapters":
                state = workload.ledger.register(doc)
                state.acked = 0 if res["status"] in ("indexed", "unchanged") else None
        if start // batch % 10 == 0:
            logger.info("seed %s: %d/%d documents", what, start + len(part), len(docs))
    out = {"documents": len(docs), **totals, "s": round(time.perf_counter() - t0, 1)}
    logger.info("seeded %s through the API: %s", what, out)
    return out


async def seed_graph(client: httpx.AsyncClient, workload: Workload) -> dict[str, Any]:
    """Graph entities, then the seed chapters (with graph metadata) through the API; reads
    the intent names the gateway offers."""
    out: dict[str, Any] = {}
    resp = await client.get("/graph/intents", timeout=30)
    if resp.status_code == 200:
        data = resp.json()
        items = data.get("intents", data) if isinstance(data, dict) else data
        workload.intents = [i["intent"] for i in items if isinstance(i, dict) and "intent" in i]
    out["intents"] = workload.intents
    data = await post_ok(client, "/graph/entities", workload.graph_entities(), timeout=120)
    out["entities"] = {k: data.get(k) for k in ("nodes", "relationships")}
    out["chapters"] = await seed_via_api(client, workload, workload.seed_chapters, "chapters", 4)
    return out


def initial_state(store: Any, workload: Workload) -> int:
    """What the store holds of every document the run may write, and the team's count."""
    ledger = workload.ledger
    states = list(ledger.docs.values()) + ledger.pool
    keys = [(workload.team, s.doc_type, s.doc_id) for s in states]
    stored: dict[Any, list[Any]] = {}
    for start in range(0, len(keys), 256):
        stored.update(store.fingerprints(keys[start : start + 256]))
    for state, key in zip(states, keys, strict=True):
        state.initial = [row[0] for row in stored.get(key, [])]
    store.flush(workload.team)
    return int(store.count(workload.team))


async def warm_up(
    client: httpx.AsyncClient, gen: LoadGenerator, n: int, timeout_s: float = 180.0
) -> dict[str, Any]:
    """``n`` sequential requests per query kind, then until the Retriever's memory index of
    the team is loaded (bounded)."""
    t0 = time.monotonic()
    statuses: Counter = Counter()
    for i in range(n):
        for kind in ("search", "enrich", "graph", "path"):
            if kind not in gen.mix and i > 1:
                continue
            body, _ = gen.body_for(kind)
            try:
                resp = await client.post(PATHS[kind], json=body, timeout=120)
                statuses[f"{kind}:{resp.status_code}"] += 1
            except httpx.HTTPError as exc:
                statuses[f"{kind}:{type(exc).__name__}"] += 1
    state: dict[str, Any] = {}
    while time.monotonic() - t0 < timeout_s:
        try:
            ready = (await client.get("/readyz", timeout=15)).json()
            state = ready.get("components", {}).get("milvus", {}).get("memory_index", {}) or {}
        except (httpx.HTTPError, ValueError):
            state = {}
        if not state.get("enabled") or not state.get("loading"):
            break
        await client.post(PATHS["search"], json=gen.workload.search_body(gen.rng), timeout=60)
        await asyncio.sleep(1.0)
    out = {
        "s": round(time.monotonic() - t0, 1),
        "statuses": dict(statuses),
        "memory_index": {k: v for k, v in state.items() if k != "timing"},
    }
    logger.info("warm-up: %s", out)
    return out


def write_app_chunks(store: Any, workload: Workload, settings: Any) -> dict[str, Any]:
    """The AppStream documents' chunks, embedded here (cached), straight into Milvus."""
    from bench import realtext

    t0 = time.perf_counter()
    chunks = realtext.embed_chunks(
        realtext.build_chunks(workload.app_docs, settings), settings, name="appstream"
    )
    for start in range(0, len(chunks), 256):
        store.upsert(chunks[start : start + 256])
    store.flush(workload.team)
    out = {
        "documents": len(workload.app_docs),
        "chunks": len(chunks),
        "s": round(time.perf_counter() - t0, 1),
    }
    logger.info("wrote the AppStream chunks into Milvus: %s", out)
    return out


# --- the run -------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_load",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_load_arguments(p)
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    p.add_argument("--rate", type=float, default=8.0, help="requests per second, all kinds")
    p.add_argument("--url", default="", help="target a running gateway instead of the harness")
    p.add_argument("--token", default="", help="with --url: a bearer JWT for --team")
    p.add_argument("--api-key", default="", help="with --url: an API key (X-API-Key)")
    p.add_argument(
        "--milvus-uri", default="", help="with --url: Milvus of the gateway (chunk check)"
    )
    p.add_argument(
        "--store-collection", default="", help="with --url: the gateway's MILVUS__COLLECTION"
    )
    p.add_argument(
        "--cache",
        choices=("off", "memory", "redis"),
        default="off",
        help="harness: the semantic cache (off: searches are measured, not cache hits)",
    )
    p.add_argument("--redis-url", default="", help="with --cache redis")
    p.add_argument("--keep-samples", action="store_true", help="every answer in the JSON")
    return p


def add_load_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments bench_load and fault_run share."""
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--collection", default=COLLECTION, help="harness: must start with bench_")
    p.add_argument("--team", default=TEAM)
    p.add_argument("--mix", type=parse_mix, default=DEFAULT_MIX)
    p.add_argument("--seed", type=int, default=16)
    p.add_argument(
        "--seed-mode",
        choices=("store", "api", "none"),
        default="",
        help="how the AppStream documents get in (default: store with the harness, api with --url)",
    )
    p.add_argument("--seed-apps", type=int, default=0, help="only the first N AppStream docs")
    p.add_argument("--graph-seed", type=int, default=24, help="KJV chapters seeded via the API")
    p.add_argument("--kjv-query-share", type=float, default=0.3)
    p.add_argument("--graph-search-share", type=float, default=0.1)
    p.add_argument(
        "--ingest-shares",
        type=parse_shares,
        default="0.5,0.3,0.2",
        help="ingests: new doc_id, the same text again, a changed text",
    )
    p.add_argument("--late-ms", type=float, default=100.0, help="later than this: missed")
    p.add_argument("--max-in-flight", type=int, default=256)
    p.add_argument("--warmup", type=int, default=3, help="sequential requests per kind first")
    p.add_argument("--progress-s", type=float, default=30.0)
    p.add_argument("--out", default=None)
    p.add_argument("-v", "--verbose", action="store_true")


def harness_settings(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "auth": {"mode": "jwt", "hs256_secret": SECRET},
        # The source registry and the cache's index generations: this run's own database.
        "state": {"url": f"sqlite:///{folder / 'state.db'}"},
    }
    cache = getattr(args, "cache", "off")
    if cache == "memory":
        settings["cache"] = {"enabled": True, "backend": "memory"}
    elif cache == "redis":
        if not args.redis_url:
            raise SystemExit("--cache redis needs --redis-url (scripts/services.py url redis)")
        settings["cache"] = {
            "enabled": True,
            "backend": "redis",
            "redis_url": args.redis_url,
            "redis_prefix": f"bench_load:{os.getpid()}:",
        }
    return settings


async def prepare(
    args: argparse.Namespace,
    client: httpx.AsyncClient,
    settings: Any,
    store: Any | None,
    seed_mode: str,
) -> tuple[Workload, dict[str, Any], int | None]:
    """The workload, the seeded data and the team's chunk count before the load."""
    workload = build_workload(args, settings)
    seeded: dict[str, Any] = {"mode": seed_mode}
    if seed_mode == "store":
        if store is None:
            raise SystemExit("--seed-mode store needs the store (harness or --milvus-uri)")
        seeded["apps"] = await asyncio.to_thread(write_app_chunks, store, workload, settings)
    elif seed_mode == "api":
        seeded["apps"] = await seed_via_api(client, workload, workload.app_docs, "AppStream", 32)
    seeded["graph"] = await seed_graph(client, workload)
    count_before = None
    if store is not None:
        try:
            count_before = await asyncio.to_thread(initial_state, store, workload)
        except Exception as exc:
            logger.warning("could not read the store before the load: %r", exc)
    seeded["count_before_load"] = count_before
    return workload, seeded, count_before


async def measure(
    args: argparse.Namespace,
    base_url: str,
    headers: dict[str, str],
    settings: Any,
    store: Any | None,
    seed_mode: str,
    in_process: bool,
) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=args.max_in_flight + 8, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=base_url, headers=headers, limits=limits) as client:
        workload, seeded, count_before = await prepare(args, client, settings, store, seed_mode)
        recorder = Recorder()
        gen = LoadGenerator(
            client,
            workload,
            recorder,
            rate=args.rate,
            mix=args.mix,
            seed=args.seed,
            late_s=args.late_ms / 1000,
            max_in_flight=args.max_in_flight,
        )
        warm = await warm_up(client, gen, args.warmup)
        gen.sent = 0
        recorder = gen.recorder = Recorder()
        memory_before = replica_memory(in_process)
        gen.memory_probe = lambda: replica_memory(in_process)
        logger.info(
            "load: %.1f req/s for %.0fs, mix %s",
            args.rate,
            args.duration,
            {k: round(v, 3) for k, v in args.mix.items()},
        )
        ran = await gen.run(args.duration, progress_s=args.progress_s)
        memory_after = replica_memory(in_process)
        ready = await client.get("/readyz", timeout=30)
    result: dict[str, Any] = {
        "seed_data": seeded,
        "warmup": warm,
        "schedule": {
            "rate": args.rate,
            "duration_s": args.duration,
            "ran_s": round(ran, 1),
            "mix": args.mix,
            "late_ms": args.late_ms,
            "max_in_flight": args.max_in_flight,
        },
        "endpoints": summarize(
            recorder.samples, ran, recorder.scheduled, recorder.late, recorder.dropped
        ),
        "ingest_ops": dict(workload.ledger.ops),
        "progress": [
            {k: v for k, v in w.items() if k not in ("since", "until")} for w in recorder.windows
        ],
        "replica_memory": {
            "before": memory_before,
            "after": memory_after,
            "delta": memory_delta(memory_before, memory_after),
            "curve": memory_curve(recorder.windows),
        },
        "readyz_after": {"status": ready.status_code, "body": ready.json()},
    }
    if store is not None and count_before is not None:
        try:
            result["chunks"] = await asyncio.to_thread(
                verify_chunks, store, args.team, workload.ledger, count_before
            )
        except Exception as exc:
            result["chunks"] = {"skipped": f"could not read the store: {exc!r}"}
    else:
        result["chunks"] = {
            "skipped": "no store access (with --url pass --milvus-uri and "
            "--store-collection of the gateway)"
        }
    logger.info("chunk check: %s", {k: v for k, v in result["chunks"].items() if k != "mismatches"})
    if args.keep_samples:
        result["samples"] = [s.brief(recorder.t0) for s in recorder.samples]
    return result


def render(result: dict[str, Any]) -> str:
    rows = []
    for kind, s in result.get("endpoints", {}).items():
        lat = s["latency"]
        rows.append(
            [
                kind if kind == "all" else f"{kind} {PATHS.get(kind, '')}",
                s["scheduled"],
                s["ok"],
                ", ".join(f"{k}×{v}" for k, v in s["errors"].items()) or "0",
                s["throughput_rps"],
                lat.get("p50_ms", "–"),
                lat.get("p95_ms", "–"),
                lat.get("p99_ms", "–"),
                lat.get("max_ms", "–"),
                s["missed_schedule"]["total"],
                s["degraded_answers"],
            ]
        )
    parts = [
        markdown_table(
            [
                "endpoint",
                "scheduled",
                "ok",
                "errors",
                "req/s",
                "p50 ms",
                "p95 ms",
                "p99 ms",
                "max ms",
                "missed",
                "degraded",
            ],
            rows,
        )
    ]
    degraded = result.get("endpoints", {}).get("all", {}).get("degraded_by_reason", {})
    if degraded:
        parts.append("Degraded: " + "; ".join(f"{k} ×{v}" for k, v in degraded.items()))
    mem = result.get("replica_memory", {})
    if mem.get("delta"):
        parts.append(
            markdown_table(
                ["replica", "pid", "RSS before MiB", "RSS after MiB", "Δ MiB", "note"],
                [
                    [
                        r["deployment"],
                        r["pid"],
                        r["rss_before_mb"],
                        r["rss_after_mb"],
                        r["delta_mb"],
                        r["note"],
                    ]
                    for r in mem["delta"]
                ],
            )
        )
    elif mem:
        parts.append(f"Replica RSS: {mem.get('before', {}).get('skipped', 'n/a')}")
    if mem.get("curve"):
        parts.append(
            markdown_table(
                ["deployment", "samples", "first MiB", "peak MiB", "last MiB", "Δ", "Δ 2nd half"],
                [
                    [
                        name,
                        c["samples"],
                        c["first_mb"],
                        c["peak_mb"],
                        c["last_mb"],
                        c["change_mb"],
                        c["second_half_change_mb"],
                    ]
                    for name, c in sorted(mem["curve"].items())
                ],
            )
        )
    ch = result.get("chunks", {})
    if "skipped" in ch:
        parts.append(f"Chunk check: skipped — {ch['skipped']}")
    elif ch:
        parts.append(
            f"Chunks of {ch['team']}: {ch['count_after']} stored, "
            f"{ch['expected_from_acknowledged']} expected from the acknowledged ingests "
            f"({'exact' if ch['exact'] else 'MISMATCH'}; {ch['documents_checked']} documents "
            f"checked, {ch['mismatched_documents']} mismatched, uncertain "
            f"{ch['uncertain_documents'] or 0})"
        )
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    if isinstance(args.mix, str):
        args.mix = parse_mix(args.mix)
    if isinstance(args.ingest_shares, str):
        args.ingest_shares = parse_shares(args.ingest_shares)
    seed_mode = args.seed_mode or ("api" if args.url else "store")
    result: dict[str, Any] = {
        "benchmark": "load",
        "args": vars(args),
        "environment": environment_info(),
    }
    if args.url:
        from bench.common import write_result
        from serve_app.settings import GatewaySettings

        if args.token:
            headers = {"authorization": f"Bearer {args.token}"}
        elif args.api_key:
            headers = {"x-api-key": args.api_key}
        else:
            headers = {}
            logger.warning("no --token/--api-key: only a gateway in AUTH__MODE=dev answers")
        overrides: dict[str, Any] = {}
        if args.milvus_uri or args.store_collection:
            overrides["milvus"] = {
                k: v
                for k, v in (("uri", args.milvus_uri), ("collection", args.store_collection))
                if v
            }
        settings = GatewaySettings(**overrides)
        store = None
        if args.milvus_uri or args.store_collection:
            from deployments.models.embedding import embedding_dim
            from deployments.vector_store.store import MilvusStore

            try:
                store = MilvusStore(settings.milvus, dim=embedding_dim(settings.embedder))
                store.start()
            except Exception as exc:
                logger.warning("Milvus not reachable (%r): the chunk check is skipped", exc)
                store = None
        t0 = time.perf_counter()
        try:
            result.update(
                asyncio.run(
                    measure(args, args.url.rstrip("/"), headers, settings, store, seed_mode, False)
                )
            )
        finally:
            if store is not None:
                store.close()
        result["total_s"] = round(time.perf_counter() - t0, 1)
        result["table_markdown"] = render(result)
        write_result("load", result, args.out)
    else:
        from bench.serve_harness import ServeHarness, run_benchmark

        folder = Path(tempfile.mkdtemp(prefix="bench_load_", dir="/tmp"))
        try:
            harness = ServeHarness(
                port=args.port,
                collection=args.collection,
                tenant_prefix=args.team if args.team.startswith("bench_") else None,
                settings=harness_settings(args, folder),
            )
            result["deadlines"] = deadlines(harness.settings)

            async def run(h: ServeHarness) -> dict[str, Any]:
                store = h.milvus_store()
                store.start()
                try:
                    headers = {"authorization": f"Bearer {token(args.team, h.settings)}"}
                    return await measure(
                        args, h.base_url, headers, h.settings, store, seed_mode, True
                    )
                finally:
                    store.close()

            run_benchmark("load", harness, result, run, render, args.out)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    print(result["table_markdown"])
    return 0


def deadlines(settings: Any) -> dict[str, float]:
    """The README's deadlines, from the run's settings."""
    return {
        "search.embed_deadline_s": settings.search.embed_deadline_s,
        "search.rerank_deadline_s": settings.search.rerank_deadline_s,
        "search.graph_deadline_s": settings.search.graph_deadline_s,
        "search.store_deadline_s": settings.search.store_deadline_s,
        "neo4j.deadline_s": settings.neo4j.deadline_s,
        "cache.redis_timeout_s": settings.cache.redis_timeout_s,
    }


if __name__ == "__main__":
    raise SystemExit(main())
