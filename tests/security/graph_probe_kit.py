"""What every graph probe shares: the run's graph (seeded over HTTP, checked against the
oracle, deleted at the end), entity references (mostly real, of the caller's team or
another, else injections), identities made owner or guardian of a team more often than the
document probes' (those see confidential data and may send Cypher), and request bodies for a
team granted or not.

``check_graph`` is the leak check of every graph answer: a marker (document or entity)
outside the caller's scope in any body, a node, relationship or named entity outside it in
a 200, a 200 for a team not granted, anything but 401 for a bad credential.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from tests.security.graph_attacks import INJECTIONS
from tests.security.graph_gateway import GraphGateway, GraphSnapshots
from tests.security.graph_seed import GRAPH_MARKER, GraphSeed
from tests.security.probe_kit import ProbeKit, dev_identity

GRAPH_ENDPOINTS = (
    "POST /graph/query intent",
    "POST /graph/query cypher",
    "POST /graph/explain_path",
    "POST /graph/entities",
    "POST /rag/search_docs graph",
)


def walk_entities(value: Any) -> Iterator[dict[str, Any]]:
    """Every serialised node and relationship inside a JSON value."""
    if isinstance(value, dict):
        if value.get("_type") in ("node", "relationship"):
            yield value
        for v in value.values():
            yield from walk_entities(v)
    elif isinstance(value, list):
        for v in value:
            yield from walk_entities(v)


class GraphProbeKit(ProbeKit):
    """The graph's set-up, clean-up, random references and leak check (the base of the
    graph probe families)."""

    seed_graph: GraphSeed
    graph_gw: GraphGateway
    dev_graph_gw: GraphGateway
    snapshots: GraphSnapshots
    tag: str
    written: int
    graph_refs: list[str]
    team_refs: dict[str, list[str]]
    seeded: frozenset[str]

    # --- set-up ------------------------------------------------------------------------------
    def open_graph(self, auth: dict[str, Any], neo4j: Any) -> None:
        from serve_app.testing import TENANCY_POLICY

        self.written = 0
        self.seed_graph = GraphSeed(self.teams, self.corpus)
        self.graph_refs = self.seed_graph.refs() + ["milvus", "prj_ops", "ch_1", "ag_1"]
        self.team_refs = {t: self.seed_graph.refs(t) for t in self.teams}
        self.snapshots = GraphSnapshots(neo4j, self.teams, self.tag)
        self.graph_gw = self.dev_graph_gw = None
        try:
            self.graph_gw = GraphGateway(auth, TENANCY_POLICY, neo4j)
            self.dev_graph_gw = GraphGateway(
                {"mode": "dev"}, TENANCY_POLICY, neo4j, store=self.graph_gw.store
            )
            self.seed_the_graph()
        except BaseException:
            self.close_graph()
            raise

    def close_graph(self) -> dict[str, Any]:
        """Counts, write checks and clean-up of the run's graph (always deletes it)."""
        checks: dict[str, Any] = {}
        try:
            if getattr(self, "seeded", None) is not None:
                # The seed plus what the allowed upserts wrote (probe_graph_entities).
                checks["changed_outside_upserts"] = len(self.snapshots.snapshot() ^ self.seeded)
                checks["sentinels"] = self.snapshots.sentinels()
                checks["nodes_per_team"] = self.snapshots.counts()
        finally:
            try:
                for gw in (self.graph_gw, self.dev_graph_gw):
                    if gw is not None:
                        gw.close()
            finally:
                self.snapshots.clean()
                checks["left_after_clean_up"] = sum(self.snapshots.counts().values())
                self.snapshots.close()
        return checks

    def seed_the_graph(self) -> None:
        """Ingest the corpus (documents, wiki-links, authors) and upsert the entities over
        HTTP as an owner of every team, then check the graph holds what the oracle assumes."""
        from tests.security.test_tenancy_properties import token_for

        owner = {
            "sub": "seeder",
            "teams": {t: ["owner"] for t in self.teams},
            "groups": {"ops", "board"},
            "permissions": {"skill:read"},
            "agent_id": "",
        }
        headers = {"authorization": f"Bearer {token_for(owner, 'valid')}"}
        # The dev gateway shares the vector store and the graph: seeded once.
        response = self.graph_gw.post("/ingest/documents", {"documents": self.corpus}, headers)
        body = response.json()
        assert response.status_code == 200 and not body.get("degraded"), response.text
        for team in self.teams:
            body = {"team_id": team, "mode": "confidential", **self.seed_graph.upserts[team]}
            response = self.graph_gw.post("/graph/entities", body, headers)
            assert response.status_code == 200, response.text
        for entry in self.seed_graph.by_key.values():
            rows = self.snapshots.query(
                f"MATCH (n:{entry['label']} {{team_id: $t, id: $i}}) "
                "RETURN n.visibility AS v, coalesce(n.stub, false) AS stub",
                t=entry["team_id"],
                i=entry["id"],
            )
            assert rows and rows[0]["v"] == entry["visibility"], (entry, rows)
        self.seeded = self.snapshots.snapshot()

    # --- helpers -----------------------------------------------------------------------------
    def graph_ref(self, noisy: bool, team: Any = None, own: float = 0.6) -> Any:
        """An entity reference: mostly a real id or name (of the body's team with
        probability ``own``, else of any team), else an injection or an adversarial value."""
        r = self.rng.random()
        if noisy and r < 0.3:
            return self.rng.choice(INJECTIONS) if self.rng.random() < 0.6 else self.adv()
        if isinstance(team, str) and team in self.team_refs and self.rng.random() < own:
            return self.rng.choice(self.team_refs[team])
        return self.rng.choice(self.graph_refs)

    def graph_identity(
        self, kind: str, elevated: float = 0.3, unrestricted: float = 0.0
    ) -> tuple[dict[str, Any], dict[str, str], Any, Any]:
        identity = self.identity()
        if self.rng.random() < unrestricted:
            # Every group and permission the policy asks for: no project or skill policy
            # hides anything, so caller Cypher runs (403 cypher_restricted_by_policy else).
            identity["groups"] = {"ops", "board"}
            identity["permissions"] = set(identity["permissions"]) | {"skill:read"}
        if self.rng.random() < elevated:
            # Owners and guardians see confidential data and may send Cypher: more of them.
            team = self.rng.choice(self.teams)
            identity["teams"][team] = self.rng.sample(
                ["owner", "guardian", "member", "service"], self.rng.randint(1, 2)
            )
        headers, expected = self.credential(kind, identity)
        gw = self.dev_graph_gw if expected == "dev" else self.graph_gw
        return identity, headers, expected, gw

    def scope_of(self, expected: Any, body: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
        ident = dev_identity(body) if expected == "dev" else expected
        raw = str(body.get("team_id"))
        return ident, {raw, raw.strip()} & set(ident["teams"])

    def check_graph(self, expected: Any, body: dict[str, Any], response: Any) -> str | None:
        """Markers outside the caller's scope in any body, a node or relationship outside it
        in a 200, a 200 for a team not granted, a non-401 for a bad credential."""
        from tests.security.test_tenancy_properties import MARKER

        asked = json.dumps(body, ensure_ascii=False, default=str)
        echoed_q = {int(m) for m in MARKER.findall(asked)}
        echoed_g = {int(m) for m in GRAPH_MARKER.findall(asked)}
        text = response.text
        found_q = {int(m) for m in MARKER.findall(text)} - echoed_q
        found_g = {int(m) for m in GRAPH_MARKER.findall(text)} - echoed_g
        if expected is None and response.status_code != 401:
            return f"bad credential answered {response.status_code}"
        if response.status_code != 200:
            if found_q or found_g:
                return f"markers {sorted(found_q)} {sorted(found_g)} in a {response.status_code}"
            return None
        ident, granted = self.scope_of(expected, body)
        if not granted:
            return f"200 for team {body.get('team_id')!r} not granted"
        team = next(iter(granted)).strip()
        conf = body.get("mode", body.get("visibility")) == "confidential"
        docs, ents = self.seed_graph.visible_markers(ident, team, conf)
        if found_q - docs:
            return f"leaked documents qmk{sorted(found_q - docs)}"
        if found_g - ents:
            leaked = [self.seed_graph.entities[j] for j in sorted(found_g - ents)]
            return "leaked entities " + ", ".join(
                f"{e['label']} {e['id']!r} ({e['team_id']}, {e['visibility']})" for e in leaked
            )
        payload = response.json()
        # The entities a graph-boosted search names (label and id, no _type): a name the
        # query echoes is still a leak when the entity is outside the scope.
        graph_part = payload.get("graph") if isinstance(payload, dict) else None
        for named in (graph_part or {}).get("entities") or ():
            entity = {"team_id": team, "labels": [named.get("label")], "id": named.get("id")}
            if not self.seed_graph.visible(ident, team, conf, entity):
                return f"graph.entities names an entity outside the scope: {named}"
        for entity in walk_entities(payload):
            if entity.get("team_id") != team:
                return f"{entity.get('_type')} of team {entity.get('team_id')!r}: {entity}"
            if entity["_type"] == "node":
                if not self.seed_graph.visible(ident, team, conf, entity):
                    return f"node outside the scope: {entity}"
                continue
            if entity.get("visibility") not in (
                ("public", "confidential") if conf and self.conf_role(ident, team) else ("public",)
            ):
                return f"relationship outside the scope: {entity}"
            for end in (entity.get("start") or {}, entity.get("end") or {}):
                known = self.seed_graph.by_key.get((team, end.get("label"), end.get("id")))
                if known is not None and not self.seed_graph.visible(ident, team, conf, known):
                    return f"relationship to an entity outside the scope: {entity}"
        return None

    @staticmethod
    def conf_role(ident: dict[str, Any], team: str) -> bool:
        from tests.security.test_tenancy_properties import CONFIDENTIAL_ROLES

        return bool(set(ident["teams"].get(team, ())) & CONFIDENTIAL_ROLES)

    def graph_body(self, expected: Any, kind: str, noisy: bool) -> dict[str, Any]:
        rng = self.rng
        body: dict[str, Any] = {
            "team_id": self.team(expected, noisy, kind == "api_key_other_team"),
        }
        mode = self.maybe(["confidential", "public", None], noisy)
        if mode is not None:
            body[rng.choice(["mode", "visibility"])] = mode
        if rng.random() < 0.15:
            body["user_id"] = self.maybe(["alice", "mallory", "seeder"], noisy)
        if noisy and rng.random() < 0.05:
            body[rng.choice(["dao_id", "microdao_id"])] = rng.choice(self.teams)
        return body
