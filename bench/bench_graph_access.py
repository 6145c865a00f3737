"""What the entity-access rule of issue 32 costs the graph, and the two ways to check it.

An entity documents made (a project, channel, author, agent, topic) is visible only through a
document the caller may see. Two ways to check it were measured on the same graph, in the
same run, interleaved per query:

* **before**: the statements of the gateway before issue 32 (``--before``, commit ac052c1,
  read with ``git show``: the baseline, leaking);
* **query** (shipped): at query time, ``EXISTS`` a visible ``Doc`` one relationship away,
  walked from the entity (``deployments.graph_store.intents.source_visible``);
* **write**: at write time, every derived entity keeps ``access``, the distinct access
  signatures (visibility, doc type, project, ACL tokens, skill tags, id) of its documents,
  recomputed whenever one of them changes; a query tests the list with no traversal.

Data: the Debian AppStream catalogue (DEP-11, ``bench.quality.appstream_set.components``):
each component is a document (title its name), its keywords, categories and provided
items (media types, binaries, fonts, ...) are its topics, its developer the author, its
package the channel, its project group the project, its desktop launcher the agent. A share
of the documents is confidential, restricted to group ``hr``, denies group ``contractors``,
or admits only user ``alice`` (deterministic by id). Queries: real names from the catalogue
for the intents (keywords, developers, packages, groups), the components' summaries for the
entity search behind a graph-boosted search (``related_docs``), developer → keyword for
explain_path. Callers: a member without groups (public), an ``hr`` member (public and
confidential), a contractor in ``hr``.

    .venv/bin/python -m bench.bench_graph_access --rounds 3

Needs Neo4j (``scripts/services.py up --only neo4j``). Writes ``bench/results/graph_access-*.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import logging
import random
import re
import statistics
import time
import uuid
from dataclasses import replace
from typing import Any

from bench.common import environment_info, markdown_table, setup_logging, write_result
from bench.quality.appstream_set import components, plain
from deployments import acl
from deployments.graph_store.cypher import ENTITIES, RELATED_DOCS
from deployments.graph_store.intents import INTENTS, source_visible
from deployments.graph_store.store import Neo4jGraph
from deployments.protocols import GraphDocument, GraphScope
from serve_app.settings import GatewaySettings

logger = logging.getLogger("bench.graph_access")

SEP, LIST = "\u001f", "\u001e"
VARIANTS = ("before", "query", "write")
NODE_VAR = re.compile(r"\b(\w+)\.team_id = \$team_id")

# The write-time variant: the access signatures of a derived node's documents.
SIGNATURE = (
    "s.visibility + $sep + coalesce(s.doc_type, '') + $sep + coalesce(s.project_id, '')"
    " + $sep + reduce(x = '', a IN coalesce(s.acl_allow, ['*']) | x + $list + a)"
    " + $sep + reduce(x = '', g IN coalesce(s.acl_deny, []) | x + $list + g)"
    " + $sep + reduce(x = '', t IN [t IN coalesce(s.tags, []) WHERE t STARTS WITH 'skill:']"
    " | x + $list + t) + $sep + s.id"
)
ACCESS_OF = f"""
UNWIND $ids AS eid
MATCH (n) WHERE elementId(n) = eid AND coalesce(n.derived, false)
SET n.access = COLLECT {{
  MATCH (n)--(s:Doc) WHERE NOT coalesce(s.stub, false) RETURN DISTINCT {SIGNATURE}
}}
RETURN count(n) AS c
"""


def write_time_check(v: str) -> str:
    """``source_visible`` answered from ``v.access`` (the write-time variant)."""
    f = f"{v}_sig"
    fields = f"split({f}, '{SEP}')"
    return (
        f"(NOT coalesce({v}.derived, false) OR any({f} IN coalesce({v}.access, [])"
        f" WHERE {fields}[0] IN $visibilities"
        f" AND any(a IN split({fields}[3], '{LIST}') WHERE a IN $acl_principals)"
        f" AND none(g IN split({fields}[4], '{LIST}') WHERE g IN $acl_principals)"
        f" AND ($doc_types IS NULL OR {fields}[1] IN $doc_types)"
        f" AND ({fields}[2] = '' OR ({fields}[2] IN $projects) <> $projects_deny)"
        f" AND NOT {fields}[6] IN $denied_skill_ids"
        f" AND CASE WHEN $skill_tags_deny"
        f" THEN none(t IN split({fields}[5], '{LIST}') WHERE t IN $skill_tags)"
        f" ELSE all(t IN split({fields}[5], '{LIST}') WHERE t = '' OR t IN $skill_tags) END))"
    )


BEFORE: dict[str, Any] = {}


def load_before(rev: str) -> None:
    """The statements of ``rev`` (``git show``): its intents, entity search and
    ``entity_allowed``, as the ``before`` variant."""
    import subprocess
    import sys
    import types

    from bench.common import REPO_ROOT

    def load(path: str, name: str, *replace: tuple[str, str]) -> Any:
        src = subprocess.run(
            ["git", "show", f"{rev}:{path}"],
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO_ROOT,
        ).stdout
        for a, b in replace:
            src = src.replace(a, b)
        module = types.ModuleType(name)
        sys.modules[name] = module
        exec(compile(src, f"{rev}:{path}", "exec"), module.__dict__)  # noqa: S102
        return module

    # The paths and module names at ``rev`` (before issue 39 moved them into graph_store/).
    intents = load("deployments/graph_intents.py", "_before_graph_intents")
    cypher = load(
        "deployments/graph_cypher.py",
        "_before_graph_cypher",
        ("from deployments.graph_intents import", "from _before_graph_intents import"),
    )
    BEFORE.update(
        {k: v.cypher for k, v in intents.INTENTS.items()},
        entities=cypher.ENTITIES,
        related_docs=cypher.RELATED_DOCS,
        entity_allowed=intents.entity_allowed,
        rev=rev,
    )


def statement(key: str, variant: str) -> str:
    """The Cypher of one statement of the workload in ``variant``."""
    if variant == "before":
        return BEFORE[key]
    cypher = (
        INTENTS[key].cypher if key in INTENTS else {"entities": ENTITIES}.get(key, RELATED_DOCS)
    )
    return variant_of(cypher, variant)


def variant_of(cypher: str, variant: str) -> str:
    """The statement with the derived-entity check of ``variant`` (query or write)."""
    if variant == "query":
        return cypher
    for v in set(NODE_VAR.findall(cypher)):
        cypher = cypher.replace(source_visible(v), write_time_check(v))
    return cypher


def access_of(comp_id: str) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """Visibility and ACL of one component, deterministic by its id."""
    h = int(hashlib.sha256(comp_id.encode()).hexdigest()[:8], 16) % 100
    vis = "confidential" if h % 5 == 0 else "public"
    if h < 25:
        return vis, acl.allow_tokens(groups=["hr"]), ()
    if h < 35:
        return vis, acl.OPEN_ALLOW, acl.deny_tokens(["contractors"])
    if h < 40:
        return vis, acl.allow_tokens(users=["alice"]), ()
    return vis, acl.OPEN_ALLOW, ()


def documents(team: str, limit: int) -> tuple[list[GraphDocument], dict[str, list[str]]]:
    docs, names = [], {"topic": [], "user": [], "channel": [], "project": [], "summary": []}
    for comp in components()[:limit]:
        name = (comp.get("Name") or {}).get("C") or comp["ID"]
        tags: list[str] = list((comp.get("Keywords") or {}).get("C") or [])
        tags += list(comp.get("Categories") or [])
        for vals in (comp.get("Provides") or {}).values():
            tags += [str(v) for v in (vals if isinstance(vals, list) else [vals])]
        tags = list(dict.fromkeys(t for t in tags if t))[:64]
        launchers = [
            str(i)
            for v in (comp.get("Launchable") or {}).values()
            for i in (v if isinstance(v, list) else [v])
        ]
        dev = comp.get("DeveloperName")
        author = dev.get("C", "") if isinstance(dev, dict) else ""
        vis, allow, deny = access_of(comp["ID"])
        docs.append(
            GraphDocument(
                team_id=team,
                doc_id=comp["ID"],
                title=name,
                visibility=vis,
                doc_type="doc",
                project_id=comp.get("ProjectGroup") or "",
                channel_id=comp.get("Package") or "",
                agent_id=launchers[0] if launchers else "",
                author_id=author,
                tags=tuple(tags),
                acl_allow=allow,
                acl_deny=deny,
            )
        )
        names["topic"] += tags[:3]
        names["user"] += [author] if author else []
        names["channel"] += [comp.get("Package") or ""]
        names["project"] += [comp.get("ProjectGroup")] if comp.get("ProjectGroup") else []
        summary = plain((comp.get("Summary") or {}).get("C") or "")
        names["summary"] += [summary] if summary else []
    return docs, {k: sorted({x for x in v if x}) for k, v in names.items()}


def callers(team: str) -> dict[str, GraphScope]:
    return {
        "member": GraphScope(team, ("public",), acl_principals=acl.principal_tokens("bob", [])),
        "hr": GraphScope(
            team, ("public", "confidential"), acl_principals=acl.principal_tokens("hana", ["hr"])
        ),
        "contractor": GraphScope(
            team, ("public",), acl_principals=acl.principal_tokens("carl", ["hr", "contractors"])
        ),
    }


def workload(names: dict[str, list[str]], rng: random.Random, n: int) -> list[tuple[str, dict]]:
    """``n`` (statement key, args) pairs: intents with real names, entity search with real
    summaries, explain_path developer → keyword."""
    kinds = [
        ("DOCS_MENTIONING_TOPIC", "topic", "topic"),
        ("EXPERTS_ON_TOPIC", "topic", "topic"),
        ("TOPICS_OF_CHANNEL", "channel", "channel"),
        ("ENTITY_NEIGHBOURS", "entity", "user"),
        ("FIND_PROJECTS_BY_TECH", "tech", "topic"),
        ("RELATED_PROJECTS", "project", "project"),
        ("entities", "text", "summary"),
        ("related_docs", "text", "summary"),
        ("explain_path", "pair", "user"),
    ]
    out = []
    for i in range(n):
        key, arg, pool = kinds[i % len(kinds)]
        if key == "explain_path":
            out.append((key, {"from": rng.choice(names["user"]), "to": rng.choice(names["topic"])}))
        else:
            out.append((key, {arg: rng.choice(names[pool])}))
    return out


async def run_one(
    graph: Neo4jGraph, key: str, args: dict, scope: GraphScope, variant: str
) -> tuple[float, int]:
    """One statement of the workload in ``variant``; seconds and rows."""
    from deployments.graph_store.cypher import lucene_terms

    params = {**scope.params, "limit": 20}
    if key in INTENTS:
        params |= INTENTS[key].args.model_validate(args).model_dump()
    elif key in ("entities", "related_docs"):
        params |= {"lucene": lucene_terms(args["text"]), "max_entities": 5, "max_docs": 50}
    else:
        return await explain(graph, args, scope, variant)
    started = time.perf_counter()
    _, rows = await graph.client.read(statement(key, variant), params, max_rows=10_000)
    return time.perf_counter() - started, len(rows)


async def explain(
    graph: Neo4jGraph, args: dict, scope: GraphScope, variant: str
) -> tuple[float, int]:
    """explain_path's two end lookups and its path query, with ``variant``'s check."""
    from deployments.graph_store.intents import entity_allowed as current

    entity_allowed = BEFORE["entity_allowed"] if variant == "before" else current

    resolve = f"""
MATCH (a) WHERE a.team_id = $team_id AND a.visibility IN $visibilities
  AND NOT coalesce(a.stub, false) AND {entity_allowed("a")}
  AND (a.id = $ref OR toLower(coalesce(a.name, a.title, '')) = toLower($ref))
RETURN a.id AS id, labels(a)[0] AS label LIMIT 5
"""
    paths = f"""
MATCH (a) WHERE a.team_id = $team_id AND any(k IN $sources WHERE a.id = k[1] AND k[0] IN labels(a))
MATCH (b) WHERE b.team_id = $team_id AND any(k IN $targets WHERE b.id = k[1] AND k[0] IN labels(b))
WITH a, b WHERE a <> b
MATCH p = allShortestPaths((a)-[*..3]-(b))
WHERE all(n IN nodes(p) WHERE n.team_id = $team_id AND n.visibility IN $visibilities
                              AND NOT coalesce(n.stub, false) AND {entity_allowed("n")})
  AND all(r IN relationships(p) WHERE r.visibility IN $visibilities)
RETURN length(p) AS hops ORDER BY hops LIMIT 5
"""
    started = time.perf_counter()
    ends = []
    for ref in (args["from"], args["to"]):
        _, rows = await graph.client.read(
            variant_of(resolve, variant) if variant != "before" else resolve,
            {**scope.params, "ref": ref},
            max_rows=5,
        )
        ends.append([[r[1], r[0]] for r in rows])
    found = 0
    if ends[0] and ends[1]:
        _, rows = await graph.client.read(
            variant_of(paths, variant) if variant != "before" else paths,
            {**scope.params, "sources": ends[0], "targets": ends[1]},
            max_rows=5,
        )
        found = len(rows)
    return time.perf_counter() - started, found


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    settings = GatewaySettings(environment="test")
    graph = Neo4jGraph(settings.neo4j)
    await graph.start()
    team = f"bench_graph_{uuid.uuid4().hex[:6]}"
    docs, names = documents(team, args.docs)
    result: dict[str, Any] = {
        "team": team,
        "docs": len(docs),
        "before": BEFORE["rev"],
        "env": environment_info(),
    }
    try:
        started = time.perf_counter()
        for i in range(0, len(docs), args.batch):
            await graph.merge_documents(docs[i : i + args.batch])
            if (i // args.batch) % 5 == 0:
                logger.info("loaded %d/%d documents", min(i + args.batch, len(docs)), len(docs))
        result["load_s"] = round(time.perf_counter() - started, 2)
        rows = await graph.client.run(
            "MATCH (n {team_id: $t}) RETURN count(n) AS nodes, "
            "sum(CASE WHEN n:Doc THEN 0 ELSE 1 END) AS entities, "
            "sum(CASE WHEN coalesce(n.derived, false) THEN 1 ELSE 0 END) AS derived",
            {"t": team},
        )
        result["graph"] = rows[0]
        logger.info("graph: %s (loaded in %.1f s)", rows[0], result["load_s"])
        # The write-time variant's state: every derived node's access signatures.
        ids = [
            r["e"]
            for r in await graph.client.run(
                "MATCH (n {team_id: $t}) WHERE n.derived RETURN elementId(n) AS e", {"t": team}
            )
        ]
        started = time.perf_counter()
        for i in range(0, len(ids), 2000):
            await graph.client.run(
                ACCESS_OF, {"ids": ids[i : i + 2000], "sep": SEP, "list": LIST}, write=True
            )
        result["write_access_full_s"] = round(time.perf_counter() - started, 2)
        result["writes"] = await write_costs(graph, docs, args)
        result["reads"] = await read_costs(graph, team, names, args)
        result["agreement"] = await agreement(graph, team, names, args)
    finally:
        await graph.client.run("MATCH (n {team_id: $t}) DETACH DELETE n", {"t": team}, write=True)
        await graph.close()
    return result


async def write_costs(graph: Neo4jGraph, docs: list[GraphDocument], args) -> dict[str, Any]:
    """Re-sending a batch of documents (another visibility, so every entity around them is
    derived again): the shipped write (MERGE + visibility recompute) against the same plus
    the write-time variant's access recompute of the same entities."""
    rng = random.Random(7)
    query_s, write_s = [], []
    for _ in range(args.write_rounds):
        batch = rng.sample(docs, args.batch)
        flipped = [
            replace(d, visibility="public" if d.visibility == "confidential" else "confidential")
            for d in batch
        ]
        for variant in ("query", "write"):
            started = time.perf_counter()
            await graph.merge_documents(flipped)
            if variant == "write":
                ids = await graph.client.run(
                    "UNWIND $ids AS i MATCH (d:Doc {team_id: $t, id: i})--(n) "
                    "WHERE n.derived RETURN DISTINCT elementId(n) AS e",
                    {"ids": [d.doc_id for d in batch], "t": batch[0].team_id},
                )
                await graph.client.run(
                    ACCESS_OF, {"ids": [r["e"] for r in ids], "sep": SEP, "list": LIST}, write=True
                )
            (query_s if variant == "query" else write_s).append(time.perf_counter() - started)
            flipped = batch  # and back, the other variant starts from the original
    return {
        "batch": args.batch,
        "query_p50_ms": round(statistics.median(query_s) * 1000, 1),
        "write_p50_ms": round(statistics.median(write_s) * 1000, 1),
    }


async def read_costs(graph, team, names, args) -> dict[str, Any]:
    rng = random.Random(13)
    work = workload(names, rng, args.queries)
    times: dict[tuple[str, str, str], list[float]] = {}
    for round_no in range(args.rounds):
        for key, qargs in work:
            for caller, scope in callers(team).items():
                order = list(VARIANTS)
                rng.shuffle(order)
                for variant in order:
                    seconds, _ = await run_one(graph, key, qargs, scope, variant)
                    if round_no or args.rounds == 1:  # the first round warms plans and caches
                        times.setdefault((key, caller, variant), []).append(seconds)
        logger.info("round %d/%d done", round_no + 1, args.rounds)
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for k, _ in work):
        row = {}
        for variant in VARIANTS:
            all_s = [s for (k, _, v), ss in times.items() if k == key and v == variant for s in ss]
            row[variant] = round(statistics.median(all_s) * 1000, 2)
        out[key] = row
    return out


async def agreement(graph, team, names, args) -> dict[str, int]:
    """How many answers differ between the two checks (they must not) and from before
    (the entities the rule now hides)."""
    rng = random.Random(29)
    diff_write = diff_none = 0
    for key, qargs in workload(names, rng, min(args.queries, 90)):
        for scope in callers(team).values():
            counts = {v: (await run_one(graph, key, qargs, scope, v))[1] for v in VARIANTS}
            diff_write += counts["write"] != counts["query"]
            diff_none += counts["before"] != counts["query"]
    return {"query_vs_write_differ": diff_write, "query_vs_before_differ": diff_none}


def render(result: dict[str, Any]) -> str:
    rows = [
        [
            key,
            r["before"],
            r["query"],
            r["write"],
            f"{r['query'] / r['before']:.2f}x",
            f"{r['write'] / r['before']:.2f}x",
        ]
        for key, r in result["reads"].items()
    ]
    table = markdown_table(
        ["statement", "before ms", "query ms", "write ms", "query/before", "write/before"], rows
    )
    w = result["writes"]
    return (
        f"{result['graph']}, loaded in {result['load_s']} s; write-time access for every "
        f"derived node: {result['write_access_full_s']} s\n\n{table}\n\n"
        f"re-sending {w['batch']} documents: query-time {w['query_p50_ms']} ms, write-time "
        f"{w['write_p50_ms']} ms (p50)\nanswers: {result['agreement']}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=100_000, help="components to load (all)")
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--queries", type=int, default=180, help="statements per round")
    p.add_argument("--rounds", type=int, default=3, help="rounds (the first one warms up)")
    p.add_argument("--write-rounds", type=int, default=7)
    p.add_argument("--before", default="ac052c1", help="the revision of the baseline")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    setup_logging()
    load_before(args.before)
    result = asyncio.run(main_async(args))
    print(render(result))
    path = write_result("graph_access", result, args.out)
    logger.info("written %s", path)


if __name__ == "__main__":
    main()
