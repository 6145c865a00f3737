"""What Neo4j's plan cache costs the gateway's graph reads: flat parameters against one map.

Neo4j 5 keys a cached plan by the query text and the power-of-ten length bucket of each string
and list parameter, so the same intent asked by a caller with two visibilities instead of one,
three ACL principals instead of two, or about a name of 12 characters instead of 8, is planned
again (deployments/graph_store/params.py). Two forms of the gateway's own reads, on the same
graph, in the same run:

* **flat**: each parameter bound by its own name (the gateway before this change);
* **map** (shipped): every parameter read from one map ``$p`` (``Neo4jClient.read_own``).

Each round empties Neo4j's query caches (``db.clearQueryCaches()``) before each form, then
runs the same workload: the six intents and the entity search behind a graph-boosted search,
with real names from the Debian AppStream catalogue (``bench.bench_graph_access``: keywords,
developers, packages, project groups, summaries), asked by three callers (a member, an ``hr``
member who also sees confidential documents, a contractor) whose ACL principals differ in
number. The order of the forms alternates between rounds.

Then the warm-up (``deployments/graph_store/warmup.py``): caches emptied, the first call of
each statement with and without ``warm_plans`` before it (the map form; rounds alternate).
And the writes: caches emptied, ``MERGE_DOCUMENTS`` in batches of growing size (the same
AppStream documents, another team each batch), flat against one map.

    .venv/bin/python -m bench.bench_graph_plans --rounds 3

Needs Neo4j (``scripts/services.py up --only neo4j``). Writes ``bench/results/graph_plans-*.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import statistics
import time
import uuid
from typing import Any

from bench.bench_graph_access import callers, documents, workload
from bench.common import environment_info, markdown_table, setup_logging, write_result
from deployments.graph_store.cypher import ENTITIES, MERGE_DOCUMENTS, RELATED_DOCS, lucene_terms
from deployments.graph_store.intents import INTENTS
from deployments.graph_store.params import bound, bundled
from deployments.graph_store.store import Neo4jGraph, document_row
from deployments.graph_store.warmup import warm_plans
from deployments.protocols import GraphScope
from serve_app.settings import GatewaySettings

logger = logging.getLogger("bench.graph_plans")

FORMS = ("flat", "map")
STATEMENTS = {**{name: i.cypher for name, i in INTENTS.items()}, "entities": ENTITIES}
STATEMENTS["related_docs"] = RELATED_DOCS
# A call this slow was (most likely) planned: a cached plan answers these reads in 3-40 ms
# here, and planning one of them takes 0.1-4 s.
PLANNED_MS = 100.0


async def call(graph: Neo4jGraph, form: str, key: str, args: dict, scope: GraphScope) -> float:
    params: dict[str, Any] = {**scope.params, "limit": 20}
    if key in INTENTS:
        params |= INTENTS[key].args.model_validate(args).model_dump()
    else:
        params |= {"lucene": lucene_terms(args["text"]), "max_entities": 5, "max_docs": 50}
    started = time.perf_counter()
    if form == "map":
        await graph.client.read_own(STATEMENTS[key], params, max_rows=10_000)
    else:
        await graph.client.read(STATEMENTS[key], params, max_rows=10_000)
    return (time.perf_counter() - started) * 1000


async def one_form(graph: Neo4jGraph, form: str, calls: list[tuple[str, dict, str]], team: str):
    await graph.client.run("CALL db.clearQueryCaches()")
    scopes = callers(team)
    return [await call(graph, form, key, args, scopes[who]) for key, args, who in calls]


async def first_calls(
    graph: Neo4jGraph, calls: list[tuple[str, dict, str]], team: str, warm: bool
) -> dict[str, Any]:
    """Caches emptied, optionally ``warm_plans``, then the first call of each statement."""
    await graph.client.run("CALL db.clearQueryCaches()")
    started = time.perf_counter()
    if warm:
        await warm_plans(graph.client)
    out: dict[str, Any] = {"warm_up_s": round(time.perf_counter() - started, 2) if warm else 0}
    scopes = callers(team)
    for key, args, who in calls:
        if key not in out:
            out[key] = round(await call(graph, "map", key, args, scopes[who]), 1)
    return out


WRITE_BATCHES = (1, 1, 3, 5, 12, 40, 150)


async def write_batches(graph: Neo4jGraph, docs: list, form: str) -> list[float]:
    """Caches emptied, then ``MERGE_DOCUMENTS`` once per size of ``WRITE_BATCHES`` (each
    batch into a fresh team, deleted after); ms per batch."""
    from dataclasses import replace

    await graph.client.run("CALL db.clearQueryCaches()")
    out = []
    for size in WRITE_BATCHES:
        team = f"bench_plans_w{uuid.uuid4().hex[:6]}"
        rows = [document_row(replace(d, team_id=team)) for d in docs[:size]]
        query, params = MERGE_DOCUMENTS, {"docs": rows}
        if form == "map":
            query, params = bundled(query), bound(params)

        async def work(tx: Any, query: str = query, params: dict = params) -> None:
            await (await tx.run(query, params)).consume()

        started = time.perf_counter()
        await graph.client.write_transaction(work)
        out.append(round((time.perf_counter() - started) * 1000, 1))
        await graph.client.run("MATCH (n {team_id: $t}) DETACH DELETE n", {"t": team}, write=True)
    return out


def summary(ms: list[float]) -> dict[str, Any]:
    ordered = sorted(ms)
    return {
        "calls": len(ms),
        "p50_ms": round(statistics.median(ms), 1),
        "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))], 1),
        "max_ms": round(ordered[-1], 1),
        "total_s": round(sum(ms) / 1000, 2),
        "planned": sum(1 for m in ms if m > PLANNED_MS),
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    settings = GatewaySettings(environment="test")
    graph = Neo4jGraph(settings.neo4j)
    await graph.start()
    team = f"bench_plans_{uuid.uuid4().hex[:6]}"
    docs, names = documents(team, args.docs)
    rng = random.Random(args.seed)
    work = [(k, a) for k, a in workload(names, rng, args.calls * 2) if k in STATEMENTS]
    who = list(callers(team))
    calls = [(k, a, who[i % len(who)]) for i, (k, a) in enumerate(work[: args.calls])]
    result: dict[str, Any] = {"team": team, "docs": len(docs), "env": environment_info()}
    try:
        for i in range(0, len(docs), 200):
            await graph.merge_documents(docs[i : i + 200])
        logger.info("loaded %d documents into %s", len(docs), team)
        per_form: dict[str, list[float]] = {f: [] for f in FORMS}
        for r in range(args.rounds):
            for form in FORMS if r % 2 == 0 else FORMS[::-1]:
                ms = await one_form(graph, form, calls, team)
                per_form[form] += ms
                logger.info("round %d %s: %s", r + 1, form, summary(ms))
        result["forms"] = {f: summary(ms) for f, ms in per_form.items()}
        flat, bundled = result["forms"]["flat"], result["forms"]["map"]
        result["ratio_total_flat_over_map"] = round(flat["total_s"] / bundled["total_s"], 2)
        firsts: dict[str, list[dict[str, Any]]] = {"cold": [], "warmed": []}
        for r in range(args.rounds):
            for warm in (False, True) if r % 2 == 0 else (True, False):
                firsts["warmed" if warm else "cold"].append(
                    await first_calls(graph, calls, team, warm)
                )
        writes: dict[str, list[list[float]]] = {f: [] for f in FORMS}
        for r in range(args.rounds):
            for form in FORMS if r % 2 == 0 else FORMS[::-1]:
                writes[form].append(await write_batches(graph, docs, form))
        result["write_batches"] = list(WRITE_BATCHES)
        result["write_ms"] = {
            f: [statistics.median(col) for col in zip(*runs, strict=True)]
            for f, runs in writes.items()
        }
        result["first_calls_ms"] = {
            k: {s: statistics.median(run[s] for run in runs) for s in runs[0]}
            for k, runs in firsts.items()
        }
    finally:
        await graph.client.run("MATCH (n {team_id: $t}) DETACH DELETE n", {"t": team}, write=True)
        await graph.close()
    return result


def render(result: dict[str, Any]) -> str:
    rows = [
        [f, s["calls"], s["p50_ms"], s["p90_ms"], s["max_ms"], s["total_s"], s["planned"]]
        for f, s in result["forms"].items()
    ]
    return markdown_table(
        ["form", "calls", "p50 ms", "p90 ms", "max ms", "total s", f"> {PLANNED_MS:.0f} ms"], rows
    ) + (
        f"\n\nflat / map, total: {result['ratio_total_flat_over_map']}×\n\n"
        + markdown_table(
            ["first call after emptied caches, ms (median)", "cold", "after warm_plans"],
            [
                [k, result["first_calls_ms"]["cold"][k], result["first_calls_ms"]["warmed"][k]]
                for k in result["first_calls_ms"]["cold"]
            ],
        )
        + "\n\n"
        + markdown_table(
            ["MERGE_DOCUMENTS batch of", *map(str, result["write_batches"])],
            [[f"{f}, ms (median)", *ms] for f, ms in result["write_ms"].items()],
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=1000, help="AppStream components loaded")
    parser.add_argument("--calls", type=int, default=120, help="reads per form and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", help="result JSON path")
    args = parser.parse_args()
    setup_logging()
    result = asyncio.run(main_async(args))
    print(render(result))
    print(write_result("graph_plans", result, args.out))


if __name__ == "__main__":
    main()
