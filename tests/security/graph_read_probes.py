"""Probes of the graph's read tools: ``POST /graph/query`` with an intent (real, misspelt
or made up; arguments that are real references, another team's, injections or adversarial
values; fields an intent does not take, such as team_id or cypher), ``POST
/graph/explain_path`` between such references (labels, hop and path limits out of range
too) and ``POST /rag/search_docs`` with the graph option (boost or scope, entity names and
Lucene queries as the query). Canary probes ask a valid caller's own team about entities
only documents name, mostly ones only ACL'd documents name: explain_path must answer 404
exactly when an end is outside the caller's scope.
"""

from __future__ import annotations

from typing import Any

from tests.security.graph_attacks import LUCENE_QUERIES
from tests.security.graph_probe_kit import GRAPH_ENDPOINTS, GraphProbeKit


class GraphReadProbes(GraphProbeKit):
    """Intent, explain_path, graph-search and canary probes."""

    def probe_graph_intent(self, kind: str) -> None:
        from deployments.graph_store.intents import INTENTS

        rng = self.rng
        _, headers, expected, gw = self.graph_identity(kind)
        noisy = rng.random() < 0.5
        body = self.graph_body(expected, kind, noisy)
        name = rng.choice(list(INTENTS))
        if noisy and rng.random() < 0.1:
            name = rng.choice(["DROP_EVERYTHING", name.lower(), " " + name, str(self.adv())])
        body["intent"] = name
        args: dict[str, Any] = {}
        intent = INTENTS.get(name)
        if intent is not None:
            for field in intent.args.model_fields:
                if field == "limit":
                    if rng.random() < 0.3:
                        args["limit"] = self.maybe([1, 5, 200, 0, 201], noisy)
                elif field == "role":
                    if rng.random() < 0.5:
                        args["role"] = self.maybe(["guardian", "member"], noisy)
                elif field != "target" or rng.random() < 0.7:
                    args[field] = self.graph_ref(noisy, body["team_id"])
        if noisy and rng.random() < 0.1:
            args[rng.choice(["team_id", "visibilities", "cypher", "x"])] = rng.choice(self.teams)
        body["args"] = args
        response = gw.post("/graph/query", body, headers)
        self.record(GRAPH_ENDPOINTS[0], kind, response, self.check_graph(expected, body, response))

    def probe_explain_path(self, kind: str) -> None:
        from deployments.graph_store.cypher import NODE_LABELS

        rng = self.rng
        _, headers, expected, gw = self.graph_identity(kind)
        noisy = rng.random() < 0.5
        body = self.graph_body(expected, kind, noisy)
        for side in ("from", "to"):
            ref = self.graph_ref(noisy and rng.random() < 0.5, body["team_id"], own=0.9)
            if rng.random() < 0.3:
                label = self.maybe(list(NODE_LABELS) + ["Bogus"], noisy)
                body[side] = {rng.choice(["ref", "id", "name"]): ref, "label": label}
            else:
                body[side] = ref
        if rng.random() < 0.5:
            body["max_hops"] = self.maybe([1, 2, 4, 6] + ([7, 0] if noisy else []), noisy)
        if rng.random() < 0.5:
            body["max_paths"] = self.maybe([1, 3, 10] + ([11] if noisy else []), noisy)
        response = gw.post("/graph/explain_path", body, headers)
        self.record(GRAPH_ENDPOINTS[2], kind, response, self.check_graph(expected, body, response))

    def probe_graph_canaries(self, kind: str) -> None:
        """A valid caller asks its own team about an entity documents made (mostly one only
        documents with an ACL name: a canary) through a graph-boosted search, explain_path
        or an intent. Beyond ``check_graph``: explain_path answers 404 exactly when an end
        is outside the caller's scope (existence is not confirmed, nor lost)."""
        rng = self.rng
        _, headers, expected, gw = self.graph_identity("jwt_valid", elevated=0.4)
        body = self.graph_body(expected, "jwt_valid", False)
        team = str(body["team_id"])
        made = [
            e
            for e in self.seed_graph.by_key.values()
            if e["team_id"] == team and e.get("sources") and e["label"] != "Doc"
        ]
        if not made:
            return
        canaries = [e for e in made if all(d.get("acl") for d in e["sources"])]
        entry = rng.choice(canaries if canaries and rng.random() < 0.7 else made)
        # explain_path never takes a wiki-link placeholder as an end.
        other = rng.choice(
            [
                e
                for e in self.seed_graph.by_key.values()
                if e["team_id"] == team and not str(e["id"]).startswith("wiki:")
            ]
        )
        r = rng.random()
        if r < 0.35:
            body |= {"query": f"{entry['id']} {other['id']}", "graph": {"mode": "boost"}}
            endpoint, path = GRAPH_ENDPOINTS[4], "/rag/search_docs"
        elif r < 0.7:
            body["from"] = {"ref": entry["id"], "label": entry["label"]}
            body["to"] = {"ref": other["id"], "label": other["label"]}
            endpoint, path = GRAPH_ENDPOINTS[2], "/graph/explain_path"
        else:
            body["intent"] = rng.choice(
                ["ENTITY_NEIGHBOURS", "DOCS_MENTIONING_TOPIC", "EXPERTS_ON_TOPIC"]
                + ["TOPICS_OF_CHANNEL", "FIND_PROJECTS_BY_TECH", "RELATED_PROJECTS"]
            )
            field = {
                "ENTITY_NEIGHBOURS": "entity",
                "TOPICS_OF_CHANNEL": "channel",
                "FIND_PROJECTS_BY_TECH": "tech",
                "RELATED_PROJECTS": "project",
            }.get(body["intent"], "topic")
            body["args"] = {field: entry["id"]}
            endpoint, path = GRAPH_ENDPOINTS[0], "/graph/query"
        response = gw.post(path, body, headers)
        problem = self.check_graph(expected, body, response)
        if problem is None and path == "/graph/explain_path" and other is not entry:
            ident, _ = self.scope_of(expected, body)
            conf = body.get("mode", body.get("visibility")) == "confidential"
            both = all(self.seed_graph.visible(ident, team, conf, e) for e in (entry, other))
            if response.status_code in (200, 404) and both != (response.status_code == 200):
                problem = (
                    f"explain_path answered {response.status_code} for ends visible: "
                    f"{[self.seed_graph.visible(ident, team, conf, e) for e in (entry, other)]}"
                )
        self.record(endpoint, "canary", response, problem)

    def probe_search_graph(self, kind: str) -> None:
        rng = self.rng
        _, headers, expected, gw = self.graph_identity(kind)
        noisy = rng.random() < 0.5
        body = self.graph_body(expected, kind, noisy)
        r = rng.random()
        if r < 0.4:
            query = " ".join(
                str(self.graph_ref(False, body["team_id"])) for _ in range(rng.randint(1, 3))
            )
        elif r < 0.7:
            query = self.maybe(LUCENE_QUERIES, noisy)
        else:
            query = str(self.graph_ref(True))
        body["query"] = query
        body["top_k"] = self.maybe([5, 20, 50], noisy)
        mode = self.maybe(["boost", "scope"], noisy)
        if rng.random() < 0.3:
            body["graph"] = {"mode": mode, "max_entities": self.maybe([1, 5, 50, 51], noisy)}
        else:
            body["graph"] = mode
        if rng.random() < 0.3:
            body["filters"] = {"visibility": self.maybe(["public", "confidential"], noisy)}
        response = gw.post("/rag/search_docs", body, headers)
        problem = self.check_graph(expected, body, response)
        if problem is None and response.status_code == 200:
            ident, granted = self.scope_of(expected, body)
            teams = {m["source_ref"]["team_id"] for m in response.json()["matches"]}
            self.checked_matches += len(response.json()["matches"])
            if not teams <= {t.strip() for t in granted}:
                problem = f"matches of teams {sorted(teams)}"
        self.record(GRAPH_ENDPOINTS[4], kind, response, problem)
