"""Probes of the doors whose answers carry the corpus's documents: ``POST /rag/search_docs``
and ``POST /rag/enrich_answer``.

A search probe asks for a team it was or was not granted, with random or adversarial
queries, filters (project, channel, agent, visibility, doc types, tags, even a team_id of
its own), search modes and privacy modes; an enrich probe sends a draft (claims the corpus
supports, a document's marker, text nothing supports) the same way. Every match and every
source must belong to the one granted team and be a document the caller may read (the
property tests' oracle, document ACLs included); enriched text must carry no marker the
draft did not. Cache pairs send one body as two identities whose scopes differ, in both
orders with the cache cleared between, then the first again from the cache: an answer
cached for one scope and served to another is a leak like any other.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tests.security.probe_kit import ENDPOINTS, ProbeKit, dev_identity

QUERIES = ("Milvus gateway search notes", "deploy budget qmk3q", "qmk12q", "")
DOC_TYPES = ("doc", "wiki", "message", "transaction", "file", "rwa")
# Drafts for rag.enrich_answer: claims the corpus supports (in every team), a marker of one
# document, and text nothing supports.
DRAFTS = (
    "Milvus gateway search notes about doc deploy budget. Nothing here is about purple cats.",
    "Milvus gateway search notes of dao_b about wiki deploy budget qmk3q.",
    "- Milvus gateway search notes about transaction deploy budget\n- Search notes on qmk12q.",
    "Purple elephants dance on quantum keyboards.",
)


class SearchProbes(ProbeKit):
    """Search, cache-pair and enrich probes (``search_gw``, ``dev_gw``: the gateways of JWT
    and API key callers and of development body trust)."""

    search_gw: Any
    dev_gw: Any

    def probe_search_pairs(self, pairs: int) -> None:
        """The cache in both orders: one search body sent by two valid identities whose
        scopes differ (roles, groups, privacy mode), A then B, the cache cleared, B then A;
        each answer checked against the oracle like any search probe."""
        for _ in range(pairs):
            team = self.rng.choice(self.teams)
            first, second = self.identity(), self.identity()
            first["teams"] = {team: [self.rng.choice(["owner", "guardian", "member"])]}
            second["teams"] = {team: [self.rng.choice(["guest", "service", "member"])]}
            query = self.rng.choice(QUERIES[:3])
            mode = self.rng.choice(["public", "confidential"])
            body = {"team_id": team, "query": query, "top_k": 50, "mode": mode}
            second_mode = self.rng.choice(["public", mode])
            for order in ((first, second), (second, first)):
                asyncio.run(self.search_gw.services.cache.store.clear())
                for ident in order:
                    mode_of = mode if ident is first else second_mode
                    self.probe_search("jwt_valid", fixed=(ident, body | {"mode": mode_of}))
            # The same identity again: answered from the cache, and checked the same way.
            self.probe_search("jwt_valid", fixed=(first, body | {"mode": mode}))

    def probe_search(
        self, kind: str, fixed: tuple[dict[str, Any], dict[str, Any]] | None = None
    ) -> None:

        rng = self.rng
        identity = fixed[0] if fixed else self.identity()
        headers, expected = self.credential(kind, identity)
        noisy = rng.random() < 0.5
        if fixed:
            self._check_search(kind, headers, expected, dict(fixed[1]), "cache_pair")
            return
        body: dict[str, Any] = {
            "team_id": self.team(expected, noisy, kind == "api_key_other_team"),
            "query": self.maybe(QUERIES, noisy),
            "top_k": self.maybe([5, 50, 50], noisy),
        }
        if rng.random() < 0.3:
            body["user_id"] = self.maybe([identity["sub"], "mallory"], noisy)
        if rng.random() < 0.3:
            body["agent_id"] = self.maybe(["ag_1", "ag_2", ""], noisy)
        if rng.random() < 0.3:
            body["search_mode"] = self.maybe(["hybrid", "dense", "bm25"], noisy)
        if rng.random() < 0.6:
            filters: dict[str, Any] = {}
            for name, values in (
                ("project_id", ["", "prj_open", "prj_ops", "prj_board"]),
                ("channel_id", ["ch_1", ""]),
                ("agent_id", ["ag_1", ""]),
                ("visibility", ["public", "confidential"]),
            ):
                if rng.random() < 0.4:
                    filters[name] = self.maybe(values, noisy)
            if rng.random() < 0.5:
                filters["doc_type"] = [
                    self.maybe(DOC_TYPES, noisy) for _ in range(rng.randint(0, 3))
                ]
            if rng.random() < 0.3:
                filters["tags"] = [self.maybe(["milvus", "rag"], noisy) for _ in range(2)]
            if noisy and rng.random() < 0.1:
                filters["team_id"] = rng.choice(self.teams)  # must be refused (422)
            body["filters"] = filters
        mode = self.maybe(["confidential", "public", None], noisy)
        if mode is not None:
            body[rng.choice(["mode", "visibility"])] = mode
        self._check_search(kind, headers, expected, body, kind)

    def _check_search(
        self, kind: str, headers: dict[str, str], expected: Any, body: dict[str, Any], category: str
    ) -> None:
        from tests.security.test_tenancy_properties import MARKER, may_read

        gw = self.dev_gw if expected == "dev" else self.search_gw
        response = gw.search(body, **headers)
        problem = self.common_failure(expected, response)
        if response.status_code == 200 and problem is None:
            ident = dev_identity(body) if expected == "dev" else expected
            raw = str(body["team_id"])
            granted = {raw, raw.strip()} & set(ident["teams"])
            matches = response.json()["matches"]
            returned = {m["source_ref"]["team_id"] for m in matches}
            self.checked_matches += len(matches)
            if not granted:
                problem = f"200 for team {raw!r} not granted"
            elif not returned <= granted or len(returned) > 1:
                problem = f"matches of teams {sorted(returned - granted)}"
            else:
                team = next(iter(returned), raw.strip())
                conf = body.get("mode", body.get("visibility")) == "confidential"
                visible = {i for i, d in enumerate(self.corpus) if may_read(ident, team, conf, d)}
                leaked = {int(i) for i in MARKER.findall(response.text)} - visible
                ids = {m["source_ref"]["id"] for m in matches}
                allowed = {self.corpus[i]["doc_id"] for i in visible}
                if leaked:
                    problem = f"leaked {[self.corpus[i]['doc_id'] for i in sorted(leaked)]}"
                elif not ids <= allowed:
                    problem = f"ids not allowed: {sorted(ids - allowed)}"
        self.record(ENDPOINTS[0], category, response, problem)

    def probe_enrich(self, kind: str) -> None:
        from tests.security.test_tenancy_properties import MARKER, may_read

        rng = self.rng
        identity = self.identity()
        headers, expected = self.credential(kind, identity)
        noisy = rng.random() < 0.5
        body: dict[str, Any] = {
            "team_id": self.team(expected, noisy, kind == "api_key_other_team"),
            "draft_answer": self.maybe(DRAFTS, noisy),
            "max_docs": self.maybe([1, 3, 20], noisy),
        }
        if rng.random() < 0.3:
            body["question"] = self.maybe(QUERIES, noisy)
        if rng.random() < 0.3:
            body["user_id"] = self.maybe([identity["sub"], "mallory"], noisy)
        if rng.random() < 0.3:
            body["agent_id"] = self.maybe(["ag_1", "ag_2", ""], noisy)
        if rng.random() < 0.4:
            filters: dict[str, Any] = {}
            for name, values in (
                ("project_id", ["", "prj_open", "prj_ops", "prj_board"]),
                ("visibility", ["public", "confidential"]),
                ("doc_type", [["doc"], ["wiki", "file"], "transaction"]),
            ):
                if rng.random() < 0.4:
                    filters[name] = self.maybe(values, noisy)
            if noisy and rng.random() < 0.1:
                filters["team_id"] = rng.choice(self.teams)  # must be refused (422)
            body["filters"] = filters
        mode = self.maybe(["confidential", "public", None], noisy)
        if mode is not None:
            body[rng.choice(["mode", "visibility"])] = mode
        gw = self.dev_gw if expected == "dev" else self.search_gw
        response = gw.client.post("/rag/enrich_answer", json=body, headers=headers)
        problem = self.common_failure(expected, response)
        if response.status_code == 200 and problem is None:
            ident = dev_identity(body) if expected == "dev" else expected
            raw = str(body["team_id"])
            granted = {raw, raw.strip()} & set(ident["teams"])
            answer = response.json()
            sources = answer["sources"]
            returned = {s["team_id"] for s in sources}
            self.checked_matches += len(sources)
            # The answer echoes the draft (plus [n] markers); markers of the draft don't count.
            echoed = set(MARKER.findall(str(body["draft_answer"])))
            if not granted:
                problem = f"200 for team {raw!r} not granted"
            elif not returned <= granted or len(returned) > 1:
                problem = f"sources of teams {sorted(returned - granted)}"
            elif set(MARKER.findall(answer["enriched_answer"])) - echoed:
                problem = "markers in enriched_answer that the draft did not have"
            else:
                team = next(iter(returned), raw.strip())
                conf = body.get("mode", body.get("visibility")) == "confidential"
                visible = {i for i, d in enumerate(self.corpus) if may_read(ident, team, conf, d)}
                leaked = {int(i) for i in MARKER.findall(str(sources))} - visible
                ids = {s["id"] for s in sources}
                allowed = {self.corpus[i]["doc_id"] for i in visible}
                if leaked:
                    problem = f"leaked {[self.corpus[i]['doc_id'] for i in sorted(leaked)]}"
                elif not ids <= allowed:
                    problem = f"ids not allowed: {sorted(ids - allowed)}"
        self.record(ENDPOINTS[3], kind, response, problem)
