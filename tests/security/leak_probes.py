"""Leak probes: random and adversarial requests against the in-process gateway (fakes, no Ray),
checking that no response carries another team's data or data the caller may not see.

The gateway is built as in tests/security/test_tenancy_properties.py (``serve_app.testing``: a
corpus of three teams, both visibilities, several doc types, project and skill policies) with
JWT (HS256) and API key authentication. Each probe picks an identity, a credential (valid, or
expired / not yet valid / wrong audience / wrong issuer / forged / ``alg: none`` / garbage /
truncated token, an API key of another team, an unknown key, none at all) and a request with
random or adversarial fields, and sends it to ``POST /rag/search_docs``,
``POST /ingest/documents``, ``GET /audit/decisions`` or ``POST /rag/enrich_answer`` (whose
sources, like search matches, must stay inside what the caller may read). The expected
visibility comes from the oracle of the property tests (written from the policy's rules, not
from AccessContext); some documents carry document ACLs (allowed groups, allowed users,
denied groups: ``serve_app.testing.TENANCY_ACLS``), so every probe also checks them.

A leak is: a chunk (marker) of another team, or one the caller may not read, in any response;
a 200 for a team the identity does not grant; a write the caller may not make; a non-401 for
a bad credential; audit records of a team the caller may not read. Exit status 1 on any leak
or any 500.

The probes live by family, over shared parts (all in tests/security/): probe_kit (credentials,
random values, the leak record), search_probes (search, cache pairs, enrich), ingest_probes,
audit_probes; for --graph graph_seed (the seed and its oracle), graph_gateway (the gateway
over the real Neo4j, snapshots), graph_attacks (injections and caller Cypher),
graph_probe_kit (set-up, references, the leak check), graph_read_probes and
graph_write_probes. ``Prober`` joins them and runs them; this module also renders the report.

    .venv/bin/python -m tests.security.leak_probes --probes 5000
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from bench.common import environment_info, markdown_table, setup_logging, write_result
from serve_app.testing import isolated_env
from tests.security.audit_probes import AuditProbes
from tests.security.graph_probe_kit import GRAPH_ENDPOINTS
from tests.security.graph_read_probes import GraphReadProbes
from tests.security.graph_seed import graph_corpus
from tests.security.graph_write_probes import GraphWriteProbes
from tests.security.ingest_probes import IngestProbes
from tests.security.probe_kit import CREDENTIALS, ENDPOINTS
from tests.security.search_probes import SearchProbes

logger = logging.getLogger("tests.security.leak_probes")


class Prober(SearchProbes, IngestProbes, AuditProbes, GraphReadProbes, GraphWriteProbes):
    """Builds the gateways once and sends probes; counts per endpoint and category."""

    def __init__(self, seed: int, workdir: Path, neo4j: Any = None, store: Any = None) -> None:
        from serve_app.testing import (
            PEPPER,
            TEAMS,
            TENANCY_POLICY,
            build_gateway,
            jwt_auth,
            tenancy_corpus,
            write_api_keys,
        )
        from tests.security.test_tenancy_properties import ADVERSARIAL

        self.rng = random.Random(seed)
        self.teams = TEAMS
        self.adversarial = ADVERSARIAL
        self.corpus = tenancy_corpus()
        self.graph_enabled = neo4j is not None
        if self.graph_enabled:
            # Teams of this run only (the Neo4j server is shared): the same probes with
            # another --seed-independent suffix, deleted at the end.
            self.tag = os.urandom(4).hex()
            self.teams = tuple(f"{t}_{self.tag}" for t in TEAMS)
            self.corpus = graph_corpus(self.teams)
        # API keys: one per (team, role), with and without groups and permissions.
        self.key_identities: list[tuple[str, dict[str, Any]]] = []
        entries = []
        key_rng = random.Random(seed + 1)
        for team in self.teams:
            for role in ("owner", "guardian", "service", "member", "guest"):
                identity = {
                    "sub": f"svc_{team}_{role}",
                    "teams": {team: [role]},
                    "groups": set(key_rng.sample(["ops", "board", "dev"], key_rng.randint(0, 2))),
                    "permissions": set(
                        key_rng.sample(["skill:read", "memory:read"], key_rng.randint(0, 1))
                    ),
                    "agent_id": key_rng.choice(["", "ag_1"]),
                }
                entries.append(
                    {
                        "sub": identity["sub"],
                        "teams": identity["teams"],
                        "groups": sorted(identity["groups"]),
                        "permissions": sorted(identity["permissions"]),
                        "agent_id": identity["agent_id"],
                    }
                )
                self.key_identities.append(("", identity))
        keys = write_api_keys(workdir / "api_keys.yaml", entries)
        self.key_identities = [
            (k, ident) for k, (_, ident) in zip(keys, self.key_identities, strict=True)
        ]
        auth = jwt_auth(api_keys_file=str(workdir / "api_keys.yaml"), api_key_pepper=PEPPER)
        corpus = self.corpus
        # store: a factory of the vector store fake each gateway gets (default FakeVectorStore).
        new_store = store or (lambda: None)

        # Every gateway has its state database, so the semantic cache is on: the probes
        # repeat a few queries across identities, and a cached answer that crossed a scope
        # would be a leak like any other.
        def gateway(name: str, auth: dict[str, Any]) -> Any:
            return build_gateway(
                auth=auth,
                policy=TENANCY_POLICY,
                corpus=corpus,
                store=new_store(),
                state_url=f"sqlite:///{workdir / f'state_{name}.db'}",
                # The probes test tenancy: a 429 would make a probe pass without an answer.
                rate_limit={"enabled": False},
            )

        self.search_gw = gateway("search", auth)
        self.ingest_gw = gateway("ingest", auth)
        self.dev_gw = gateway("dev", {"mode": "dev"})
        self.dev_ingest_gw = gateway("dev_ingest", {"mode": "dev"})
        self.runs: Counter[tuple[str, str]] = Counter()
        self.statuses: Counter[tuple[str, int]] = Counter()
        self.leaks: list[dict[str, Any]] = []
        self.server_errors: list[dict[str, Any]] = []
        self.checked_matches = 0
        self.gateways = [self.search_gw, self.ingest_gw, self.dev_gw, self.dev_ingest_gw]
        if self.graph_enabled:
            self.open_graph(auth, neo4j)

    def close(self) -> None:
        for gw in self.gateways:
            gw.client.close()
            gw.services.recorder.log.close()

    def run(self, probes: int) -> None:
        kinds = [k for k, _ in CREDENTIALS]
        weights = [w for _, w in CREDENTIALS]
        endpoint_weights = [0.5, 0.2, 0.12, 0.18]
        probes_by_endpoint = [
            self.probe_search,
            self.probe_ingest,
            self.probe_audit,
            self.probe_enrich,
        ]
        if self.graph_enabled:
            # A third of the probes for the document endpoints, the rest for the graph.
            endpoint_weights = [w / 3 for w in endpoint_weights] + [
                0.2,
                0.15,
                0.1,
                0.06,
                0.08,
                0.15,
            ]
            probes_by_endpoint += [
                self.probe_graph_intent,
                self.probe_graph_cypher,
                self.probe_explain_path,
                self.probe_graph_entities,
                self.probe_search_graph,
                self.probe_graph_canaries,
            ]
        step = max(1, probes // 10)
        # About a tenth of the probes are cache pairs (both orders, then a repeat).
        pairs = max(1, probes // 50)
        self.probe_search_pairs(pairs)
        probes -= 5 * pairs
        for i in range(probes):
            kind = self.rng.choices(kinds, weights)[0]
            which = self.rng.choices(range(len(probes_by_endpoint)), endpoint_weights)[0]
            probes_by_endpoint[which](kind)
            if (i + 1) % step == 0:
                logger.info(
                    "%d/%d probes, %d leaks, %d server errors",
                    i + 1,
                    probes,
                    len(self.leaks),
                    len(self.server_errors),
                )


def run_probes(
    probes: int, seed: int = 0, graph: bool = False, neo4j: Any = None, store: Any = None
) -> dict[str, Any]:
    """Build the gateways, send ``probes`` probes; the counts, leaks and server errors.

    ``graph``: also probe the graph endpoints against the real Neo4j (``neo4j`` settings,
    default those of ``GatewaySettings(environment="test")``), in teams of this run only,
    deleted at the end."""
    graph_checks: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory(prefix="leak_probes_") as tmp,
        isolated_env(f"sqlite:///{Path(tmp) / 'audit.db'}"),
    ):
        if graph and neo4j is None:
            from serve_app.settings import GatewaySettings

            neo4j = GatewaySettings(environment="test").neo4j
        setup_started = time.perf_counter()
        prober = Prober(seed, Path(tmp), neo4j if graph else None, store)
        setup_s = time.perf_counter() - setup_started
        try:
            try:
                started = time.perf_counter()
                prober.run(probes)
                wall = time.perf_counter() - started
            finally:
                if prober.graph_enabled:
                    graph_checks = prober.close_graph()
        finally:
            prober.close()
    if graph_checks.get("changed_outside_upserts") or graph_checks.get("sentinels"):
        prober.leaks.append(
            {
                "endpoint": GRAPH_ENDPOINTS[1],
                "category": "final graph check",
                "status": 0,
                "problem": f"the graph changed outside the allowed upserts: {graph_checks}",
            }
        )
    per_endpoint: dict[str, dict[str, int]] = defaultdict(dict)
    for (endpoint, category), n in sorted(prober.runs.items()):
        per_endpoint[endpoint][category] = n
    leaks_by = Counter((leak["endpoint"], leak["category"]) for leak in prober.leaks)
    errors_by = Counter((e["endpoint"], e["category"]) for e in prober.server_errors)
    statuses: dict[str, dict[str, int]] = defaultdict(dict)
    for (endpoint, status), n in sorted(prober.statuses.items()):
        statuses[endpoint][str(status)] = n
    return {
        "probes": probes,
        "seed": seed,
        "wall_s": round(wall, 2),
        "probes_per_s": round(probes / wall, 1) if wall > 0 else None,
        "leaks_found": len(prober.leaks),
        "server_errors": len(prober.server_errors),
        "checked_matches": prober.checked_matches,
        "cache_hits": prober.search_gw.services.cache.hits + prober.dev_gw.services.cache.hits,
        "runs": {e: dict(c) for e, c in per_endpoint.items()},
        "statuses": {e: dict(s) for e, s in statuses.items()},
        "leaks_by": {f"{e} {c}": n for (e, c), n in leaks_by.items()},
        "server_errors_by": {f"{e} {c}": n for (e, c), n in errors_by.items()},
        "leaks": prober.leaks[:50],
        "server_error_samples": prober.server_errors[:20],
        **(
            {
                "graph": True,
                "graph_teams": list(prober.teams),
                "graph_setup_s": round(setup_s, 2),
                "graph_entities": len(prober.seed_graph.entities),
                "graph_checks": graph_checks,
            }
            if prober.graph_enabled
            else {}
        ),
    }


def render_tables(result: dict[str, Any]) -> str:
    rows = []
    endpoints = ENDPOINTS + (GRAPH_ENDPOINTS if result.get("graph") else ())
    for endpoint in endpoints:
        cats = result["runs"].get(endpoint, {})
        for category, n in sorted(cats.items()):
            key = f"{endpoint} {category}"
            rows.append(
                [
                    endpoint,
                    category,
                    n,
                    result["leaks_by"].get(key, 0),
                    result["server_errors_by"].get(key, 0),
                ]
            )
    for endpoint in endpoints:
        statuses = result["statuses"].get(endpoint, {})
        total = sum(result["runs"].get(endpoint, {}).values())
        status_text = ", ".join(f"{s}: {n}" for s, n in sorted(statuses.items()))
        rows.append([f"**{endpoint} total**", status_text, total, "", ""])
    rows.append(
        [
            "**all endpoints**",
            f"{result['checked_matches']} returned matches checked",
            result["probes"],
            result["leaks_found"],
            result["server_errors"],
        ]
    )
    return markdown_table(["endpoint", "category", "probes", "leaks", "5xx"], rows)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tests.security.leak_probes",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--probes", type=int, default=5000, help="probes to send (all endpoints)")
    p.add_argument("--seed", type=int, default=0, help="seed of the probe generator")
    p.add_argument("--out", default=None, help="result JSON (default bench/results/leaks-*.json)")
    p.add_argument(
        "--graph",
        action="store_true",
        help="also probe /graph/query, /graph/explain_path, /graph/entities and search_docs "
        "with the graph option against the real Neo4j (scripts/services.py up --only neo4j)",
    )
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    for noisy in ("serve_app", "deployments", "batch_ingest", "httpx2", "httpx", "neo4j"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    env = environment_info()
    result = run_probes(args.probes, args.seed, graph=args.graph)
    for leak in result["leaks"][:10]:
        logger.error("LEAK: %s", leak)
    for err in result["server_error_samples"][:5]:
        logger.error("SERVER ERROR: %s", err)
    write_result("leaks", {"environment": env, "args": vars(args), **result}, args.out)
    print(render_tables(result))
    print(
        f"\n{result['probes']} probes in {result['wall_s']} s: "
        f"{result['leaks_found']} leaks, {result['server_errors']} server errors"
    )
    return 1 if result["leaks_found"] or result["server_errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
