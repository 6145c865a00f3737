"""Probes of what a caller sends the graph that could run or change something: caller
Cypher on ``POST /graph/query`` (scoped queries, ones the plan check must refuse, ones that
write into the caller's team or another) and upserts on ``POST /graph/entities`` (labels
that may not be written, visibilities beyond the caller's grant, properties that try to set
the team or visibility, relationships to another team). The graph is snapshotted around
each: Cypher that writes must never answer 200 nor change it, Cypher must not run for roles
without the Cypher grant; an upsert may only add what the caller may write, and a refused
one leaves the graph as it was.
"""

from __future__ import annotations

from typing import Any

from tests.security.graph_attacks import (
    LUCENE_QUERIES,
    REFUSED_CYPHER,
    SCALAR_CYPHER,
    SCOPED_CYPHER,
    WRITE_CYPHER,
)
from tests.security.graph_probe_kit import GRAPH_ENDPOINTS, GraphProbeKit


class GraphWriteProbes(GraphProbeKit):
    """Caller Cypher and entity upsert probes."""

    def probe_graph_cypher(self, kind: str) -> None:
        from deployments.graph_store.cypher import NODE_LABELS

        rng = self.rng
        _, headers, expected, gw = self.graph_identity(kind, elevated=0.6, unrestricted=0.6)
        noisy = rng.random() < 0.5
        body = self.graph_body(expected, kind, noisy)
        foreign = rng.choice([t for t in self.teams if t != body["team_id"]] or list(self.teams))
        sentinel = f"pwn_{self.tag}_{rng.randint(0, 10**6)}"
        r = rng.random()
        params: dict[str, Any] = {}
        category = "scoped"
        if r < 0.45:
            template = rng.choice(SCOPED_CYPHER)
            query = template.format(label=rng.choice(NODE_LABELS))
            if template in SCALAR_CYPHER:
                category = "scalar"
            if "$ref" in query:
                params["ref"] = self.graph_ref(noisy, body["team_id"])
            if "$lucene" in query:
                params["lucene"] = self.maybe(LUCENE_QUERIES, noisy)
        elif r < 0.75:
            category = "refused"
            query = rng.choice(REFUSED_CYPHER).replace("{foreign}", foreign)
        else:
            category = "write"
            query = rng.choice(WRITE_CYPHER).format(
                foreign=foreign, sentinel=sentinel, tag=self.tag
            )
        if noisy and rng.random() < 0.2:
            params[rng.choice(["name", "x", "team_id", "visibilities", "Team_id"])] = (
                self.graph_ref(True)
            )
        body["cypher"] = query
        if params or rng.random() < 0.2:
            body["params"] = params
        before = self.snapshots.snapshot() if category == "write" else None
        response = gw.post("/graph/query", body, headers)
        problem = self.check_graph(expected, body, response)
        if problem is None and response.status_code == 200:
            ident, granted = self.scope_of(expected, body)
            if not set(ident["teams"].get(next(iter(granted)).strip(), ())) & {"owner", "guardian"}:
                problem = "Cypher ran for roles without cypher_roles"
        if before is not None:
            if response.status_code == 200:
                problem = problem or "a write query answered 200"
            if self.snapshots.snapshot() != before:
                problem = problem or f"a write query ({response.status_code}) changed the graph"
        self.record(GRAPH_ENDPOINTS[1], f"{kind} {category}", response, problem)

    def probe_graph_entities(self, kind: str) -> None:
        from tests.security.test_tenancy_properties import CONFIDENTIAL_ROLES, WRITE_ROLES

        rng = self.rng
        _, headers, expected, gw = self.graph_identity(kind)
        noisy = rng.random() < 0.5
        body = self.graph_body(expected, kind, noisy)
        # Never write into a team outside this run (the Neo4j server is shared): a body
        # team the identity grants must be one of the run's teams.
        team = str(body["team_id"])
        ident = (
            {"teams": {team.strip(): ["owner"], team: ["owner"]}}
            if expected == "dev"
            else (expected or {"teams": {}})
        )
        if team.strip() not in self.teams and ({team, team.strip()} & set(ident["teams"])):
            body["team_id"] = rng.choice(self.teams)
        labels = ["User", "Agent", "Resource", "Project", "Topic"]
        fresh: list[tuple[str, str]] = []
        nodes = []
        for _ in range(rng.randint(0, 3)):
            label = rng.choice(labels + (["Doc", "MicroDAO", "Bogus"] if noisy else []))
            j = self.seed_graph._take()
            self.written += 1
            ident_id = f"w{self.written}_{self.tag}_gmk{j}g"
            node = {
                "label": label,
                "id": ident_id,
                "name": f"written gmk{j}g",
                "visibility": self.maybe(["public", "confidential"], noisy),
            }
            if noisy and rng.random() < 0.2:
                node["properties"] = rng.choice(
                    [{"team_id": self.teams[0]}, {"visibility": "public"}, {"ok": 1}]
                )
            nodes.append(node)
            fresh.append((label, ident_id))
        rels = []
        if fresh and rng.random() < 0.5:
            a = rng.choice(fresh)
            rels.append(
                {
                    "type": self.maybe(["USES", "SERVES", "MEMBER_OF", "OWNS"], noisy),
                    "from": {"label": a[0], "id": a[1]},
                    "to": {
                        "label": "MicroDAO",
                        "id": self.maybe(
                            [body["team_id"], foreign_of(self.teams, body["team_id"])], noisy
                        ),
                    },
                    "visibility": "confidential",
                }
            )
        if not nodes and not rels and rng.random() < 0.8:
            nodes.append({"label": "Resource", "id": f"w_{self.tag}_empty"})
        body["nodes"], body["relationships"] = nodes, rels
        before = self.snapshots.snapshot()
        response = gw.post("/graph/entities", body, headers)
        problem = self.check_graph(expected, body, response)
        after = self.snapshots.snapshot()
        if problem is None and response.status_code != 200 and after != before:
            problem = f"a {response.status_code} changed the graph"
        if problem is None and response.status_code == 200:
            if before - after:
                problem = "an upsert of new entities changed existing ones"
            self.seeded = (self.seeded - (before - after)) | (after - before)
            ident, granted = self.scope_of(expected, body)
            roles = set(ident["teams"].get(next(iter(granted)).strip(), ()))
            conf = body.get("mode", body.get("visibility")) == "confidential"
            vis = [n.get("visibility", "public") for n in nodes] + [r["visibility"] for r in rels]
            if not roles & WRITE_ROLES:
                problem = f"entities written with roles {sorted(roles)}"
            elif "confidential" in vis and not (conf and roles & CONFIDENTIAL_ROLES):
                problem = "confidential entities written without the right"
            # The oracle learns what was written (its relationships are confidential: they
            # never make a node public).
            for n in nodes:
                self.seed_graph._add(
                    str(body["team_id"]).strip(),
                    n["label"],
                    n["id"],
                    n.get("name", ""),
                    n.get("visibility", "public"),
                )
        self.record(GRAPH_ENDPOINTS[3], kind, response, problem)


def foreign_of(teams: tuple[str, ...], team: Any) -> str:
    others = [t for t in teams if t != team]
    return others[0] if others else teams[0]
