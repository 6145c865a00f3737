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

    .venv/bin/python -m tests.security.leak_probes --probes 5000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import re
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import environment_info, markdown_table, setup_logging, write_result
from deployments.graph_store.cypher import NODE_LABELS
from serve_app.testing import TENANCY_ACLS, TENANCY_LAYOUT, isolated_env

logger = logging.getLogger("tests.security.leak_probes")

ENDPOINTS = (
    "POST /rag/search_docs",
    "POST /ingest/documents",
    "GET /audit/decisions",
    "POST /rag/enrich_answer",
)
BAD_TOKENS = (
    "jwt_expired",
    "jwt_not_yet",
    "jwt_wrong_aud",
    "jwt_wrong_iss",
    "jwt_forged",
    "jwt_alg_none",
    "jwt_hs256_over_nothing",
    "jwt_garbage",
    "jwt_cut",
    "api_key_unknown",
    "no_credential",
)
# Credential kinds and their weights: most probes carry a valid credential, so that enough of
# them reach a 200 and the data that comes back can be checked.
CREDENTIALS = (
    ("jwt_valid", 16),
    ("api_key_valid", 4),
    ("api_key_other_team", 3),
    ("dev_body_trust", 3),
    *((kind, 1) for kind in BAD_TOKENS),
)
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


# --- graph endpoints (real Neo4j; --graph) --------------------------------------------------

GRAPH_ENDPOINTS = (
    "POST /graph/query intent",
    "POST /graph/query cypher",
    "POST /graph/explain_path",
    "POST /graph/entities",
    "POST /rag/search_docs graph",
)
# Every graph entity of the seed (but documents, which carry the corpus markers qmk<i>q)
# carries gmk<j>g in its id or name: a leak is found by string search of the response.
GRAPH_MARKER = re.compile(r"gmk(\d+)g")
# The tenancy layout plus a project only confidential documents name.
GRAPH_LAYOUT = (
    *TENANCY_LAYOUT,
    ("secret_plan", "confidential", "doc", "prj_secret"),
    ("skill", "public", "wiki", ""),
)
INJECTIONS = (
    "' OR 1=1 //",
    "}) MATCH (n) RETURN n //",
    '") RETURN n UNION MATCH (n) RETURN n //',
    "x' }) DETACH DELETE n //",
    "milvus' OR n.team_id <> '",
    "$team_id",
    "$visibilities",
    "*",
    "*:*",
    "name:*",
    "milvus~",
    "(milvus OR rag) AND NOT x",
    "team_id:dao_b*",
    "/.*/",
    "milvus^10",
    "\\",
    "\u202e\u200bmilvus",
    "MILVUS",
    "  milvus  ",
)
LUCENE_QUERIES = (
    "milvus",
    "prj_ops budget",
    "rag OR milvus",
    "milvus AND NOT rag",
    "title:*",
    "*",
    "milvus~2",
    '"deploy budget"',
    "(((",
    "a" * 300,
)
REFUSED_CYPHER = (
    "MATCH (n) RETURN n",
    "MATCH (n) WHERE n.team_id = '{foreign}' RETURN n",
    "MATCH (n) WHERE n.team_id = $team_id OR n.team_id = '{foreign}' RETURN n",
    "MATCH (p:Project) WHERE NOT p.team_id <> $team_id OR p.id = 'x' RETURN p",
    "MATCH (n) WITH n AS m MATCH (n:Doc) WHERE n.team_id = $team_id RETURN m",
    "MATCH (n) RETURN n.id AS id UNION MATCH (n:Doc) WHERE n.team_id = $team_id RETURN n.id AS id",
    "MATCH (n:Doc) WHERE n.team_id = $team_id MATCH (x:Doc) WHERE x.id = n.id RETURN x.title",
    "MATCH (a:Project) WHERE a.team_id = $team_id MATCH (b:Project) WHERE NOT (a)--(b) "
    "RETURN b.name",
    "MATCH (d:Doc) WHERE d.team_id = $team_id AND EXISTS { MATCH (x:Doc) } RETURN d.id",
    "MATCH (d:Doc) WHERE d.team_id = $team_id RETURN [(d)-->(x) | x.title] AS t",
    "CALL db.index.fulltext.queryNodes('entity_names', 'milvus') YIELD node RETURN node",
    "MATCH (n) WHERE elementId(n) = '4:x:1' RETURN n",
    "MATCH (d:Doc) WHERE d.team_id = $team_id RETURN COUNT { MATCH (x) } AS c",
    "CALL db.labels() YIELD label RETURN label",
    "CALL dbms.components()",
    "SHOW USERS",
    "SHOW DATABASES",
    "LOAD CSV FROM 'file:///etc/passwd' AS line RETURN line",
    "MATCH (n) RETURN n // WHERE n.team_id = $team_id",
    "MATCH (n) /* WHERE n.team_id = $team_id */ RETURN n.name",
    "MATCH (a) WHERE a.team_id = $team_id MATCH (b) WHERE b.name = a.name RETURN b",
    "MATCH (a) WHERE a.team_id = $team_id CALL () { MATCH (x) RETURN x } RETURN x",
    "MATCH (a) WHERE a.team_id = $team_id OPTIONAL MATCH (b {team_id: '{foreign}'}) RETURN b",
    "MATCH (n) WHERE n.team_id IN [$team_id, '{foreign}'] RETURN n",
    "MATCH (n) WHERE n.team_id STARTS WITH 'dao' RETURN n",
    "MATCH (n) WHERE n.team_id <> 'nobody' RETURN n",
    "MATCH p = shortestPath((a)-[*]-(b)) WHERE a.team_id = $team_id RETURN p",
    "UNWIND range(1, 5000) AS x RETURN x",
    "MATCH (p:Project WHERE RETURN p",
    "RETURN $nope",
)
WRITE_CYPHER = (
    "CREATE (n:Project {{team_id: $team_id, id: '{sentinel}'}}) RETURN n",
    "CREATE (n:Resource {{team_id: '{foreign}', id: '{sentinel}'}})",
    "MATCH (n) WHERE n.team_id = $team_id SET n.pwned = '{sentinel}' RETURN n",
    "MATCH (n:Project) WHERE n.team_id = $team_id SET n.visibility = 'public' RETURN n",
    "MATCH (n) WHERE n.team_id = $team_id DETACH DELETE n",
    "MATCH (n) WHERE n.team_id = $team_id REMOVE n.visibility RETURN n",
    "MERGE (n:Resource {{team_id: $team_id, id: '{sentinel}'}})",
    "MATCH (n:Doc) WHERE n.team_id = $team_id FOREACH (x IN [1] | SET n.pwned = '{sentinel}')",
    "MATCH (a:User), (b:MicroDAO) WHERE a.team_id = $team_id AND b.team_id = '{foreign}' "
    "CREATE (a)-[:MEMBER_OF {{pwned: '{sentinel}'}}]->(b)",
    "CALL {{ CREATE (n:Topic {{team_id: $team_id, id: '{sentinel}'}}) }} IN TRANSACTIONS",
    "CALL db.createLabel('{sentinel}')",
    "CREATE INDEX pwn_{tag} FOR (n:Doc) ON (n.pwned)",
    "DROP CONSTRAINT doc_team_id",
    "CALL dbms.setConfigValue('db.logs.query.enabled', 'OFF')",
    "MATCH (n) WHERE n.team_id = $team_id WITH n LIMIT 1 "
    "CALL (n) {{ SET n.pwned = '{sentinel}' }} RETURN n",
    "LOAD CSV FROM 'http://127.0.0.1:7474/' AS l CREATE (:Doc {{team_id: $team_id, id: l[0]}})",
)
# Scoped queries: they pass the plan check (in confidential mode at least) and return only
# what the caller's scope holds. {label} is filled per probe.
SCOPED_CYPHER = (
    "MATCH (n:{label}) WHERE n.team_id = $team_id AND n.visibility IN $visibilities "
    "RETURN n LIMIT 100",
    "MATCH (n:{label}) WHERE n.team_id = $team_id RETURN n LIMIT 100",
    "MATCH (a)-[r]->(b) WHERE a.team_id = $team_id AND a.visibility IN $visibilities "
    "AND r.visibility IN $visibilities AND b.visibility IN $visibilities RETURN a, r, b LIMIT 200",
    "MATCH (a)-[r]->(b) WHERE a.team_id = $team_id RETURN r LIMIT 200",
    "MATCH (d:Doc)-[r:PART_OF]->(p:Project) WHERE p.team_id = $team_id "
    "AND p.visibility IN $visibilities AND d.visibility IN $visibilities "
    "AND r.visibility IN $visibilities RETURN d, p",
    "MATCH (n) WHERE n.team_id = $team_id AND n.visibility IN $visibilities "
    "AND (n.id = $ref OR n.name = $ref OR n.title = $ref) RETURN n",
    "MATCH (u:User)-[m:MEMBER_OF]->(d:MicroDAO) WHERE u.team_id = $team_id "
    "AND u.visibility IN $visibilities AND m.visibility IN $visibilities "
    "AND d.visibility IN $visibilities RETURN u, m, d",
    "CALL db.index.fulltext.queryNodes('entity_names', $lucene) YIELD node, score "
    "WHERE node.team_id = $team_id AND node.visibility IN $visibilities RETURN node, score "
    "LIMIT 20",
    "MATCH (d:Doc {{team_id: $team_id}}) MATCH (d)-[:LINKS_TO*1..3]->(o) RETURN d, o LIMIT 50",
    "MATCH (p:Project)-[u:USES]->(r:Resource) WHERE p.team_id = $team_id "
    "AND p.visibility IN $visibilities AND u.visibility IN $visibilities "
    "AND r.visibility IN $visibilities RETURN p, collect(r) AS resources",
    "MATCH path = (a:Agent)-[s:SERVES]->(x) WHERE a.team_id = $team_id "
    "AND a.visibility IN $visibilities AND s.visibility IN $visibilities "
    "AND x.visibility IN $visibilities RETURN path",
    # Scalars and maps: no node object comes back, so only the plan check protects them
    # (docs/graph_schema.md, "Limits"): team and visibility, not the doc type / project /
    # skill policies.
    "MATCH (n:{label}) WHERE n.team_id = $team_id AND n.visibility IN $visibilities "
    "RETURN n.id AS id, coalesce(n.name, n.title) AS name LIMIT 100",
    "MATCH (n:{label}) WHERE n.team_id = $team_id AND n.visibility IN $visibilities "
    "RETURN properties(n) AS props LIMIT 100",
)
SCALAR_CYPHER = frozenset(SCOPED_CYPHER[-2:])


def graph_corpus(teams: tuple[str, ...]) -> list[dict[str, Any]]:
    """The tenancy corpus for the real graph: per team the tenancy layout (plus a project
    only confidential documents name), every document with an author, a channel, an agent
    and a topic (ids with a gmk marker: those of its visibility, or, for a document with an
    ACL, its own), [[links]] to the team's next document and, from one document of each
    visibility, to a note that does not exist (a placeholder). Markers qmk<i>q are the
    document index, as in the tenancy corpus."""
    from serve_app.testing import marker

    docs: list[dict[str, Any]] = []
    ents = 0
    for team in teams:
        per_vis: dict[str, dict[str, str]] = {}
        for vis in ("pub", "conf"):
            per_vis[vis] = {}
            for kind in ("user", "ch", "ag", "topic", "missing"):
                per_vis[vis][kind] = f"{kind}_{vis}_gmk{ents}g"
                ents += 1
        n = len(GRAPH_LAYOUT)
        for k, (suffix, visibility, doc_type, project) in enumerate(GRAPH_LAYOUT):
            index = len(docs)
            vis = "pub" if visibility == "public" else "conf"
            # A document with an ACL names an author, channel, agent and topic of its own:
            # entities that exist only because of it, seen only by whom its ACL admits.
            names = per_vis[vis]
            if suffix in TENANCY_ACLS:
                names = {}
                for kind in ("user", "ch", "ag", "topic"):
                    names[kind] = f"{kind}_{suffix}_gmk{ents}g"
                    ents += 1
            doc_id = f"{team}_{suffix}_{marker(index)}"
            # Linked by title: a link's text must not carry the target's marker.
            next_title = f"{GRAPH_LAYOUT[(k + 1) % n][0]} note of {team}"
            links = f"See [[{next_title}]]."
            if suffix in ("pub_doc", "conf_doc"):
                links += f" And [[{per_vis[vis]['missing']}]]."
            tags = ["milvus", "rag", names["topic"]]
            if suffix == "skill":
                tags.append("skill:SKILL-deploy")
            docs.append(
                {
                    "team_id": team,
                    "doc_id": doc_id,
                    "title": f"{suffix} note of {team}",
                    "text": f"Milvus gateway search notes of {team} about {doc_type} "
                    f"{marker(index)} deploy budget. {links}",
                    "visibility": visibility,
                    "doc_type": doc_type,
                    "project_id": project,
                    "channel_id": names["ch"],
                    "agent_id": names["ag"],
                    "author_id": names["user"],
                    "tags": tags,
                    **({"acl": TENANCY_ACLS[suffix]} if suffix in TENANCY_ACLS else {}),
                }
            )
    return docs


def node_doc(node: dict[str, Any]) -> dict[str, Any]:
    """A Doc node as the oracle's document (``may_read``)."""
    return {
        "team_id": node.get("team_id"),
        "doc_id": str(node.get("id") or ""),
        "visibility": node.get("visibility"),
        "doc_type": node.get("doc_type") or "",
        "project_id": node.get("project_id") or "",
        "tags": list(node.get("tags") or ()),
        "acl_allow": list(node.get("acl_allow") or ("*",)),
        "acl_deny": list(node.get("acl_deny") or ()),
    }


def dev_identity(body: dict[str, Any]) -> dict[str, Any]:
    """What development body trust grants: owner of the body's team, no groups or
    permissions, the body's ``user_id`` (or ``dev``) as subject."""
    team = str(body.get("team_id")).strip()
    sub = str(body.get("user_id") or "").strip() or "dev"
    return {"sub": sub, "teams": {team: ["owner"]}, "groups": set(), "permissions": set()}


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


class GraphSeed:
    """The gmk-marked entities of the seed and who may see them (the oracle)."""

    def __init__(self, teams: tuple[str, ...], corpus: list[dict[str, Any]]) -> None:
        from batch_ingest.wikilinks import extract_links, wiki_key

        self.teams = teams
        self.corpus = corpus
        # j -> {"team_id", "label", "id", "name", "visibility", "doc": oracle doc or None}
        self.entities: dict[int, dict[str, Any]] = {}
        self.by_key: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.next_marker = 0
        self.upserts: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for doc in corpus:
            for m in GRAPH_MARKER.findall(str(doc)):
                self.next_marker = max(self.next_marker, int(m) + 1)
        for i, doc in enumerate(corpus):
            self.by_key[(doc["team_id"], "Doc", doc["doc_id"])] = {
                "team_id": doc["team_id"],
                "label": "Doc",
                "id": doc["doc_id"],
                "visibility": doc["visibility"],
                "doc": doc,
                "qmk": i,
            }
        for team in teams:
            docs = [d for d in corpus if d["team_id"] == team]
            self._add(team, "MicroDAO", team, team, "public")
            keys = {wiki_key(d[f]) for d in docs for f in ("doc_id", "title")}
            # Entities the documents make (derived): seen through a document only.
            made: dict[tuple[str, str], list[dict[str, Any]]] = {}
            for d in docs:
                refs = [
                    ("Project", d["project_id"]),
                    ("Channel", d["channel_id"]),
                    ("Agent", d["agent_id"]),
                    ("User", d["author_id"]),
                    *(("Topic", t) for t in d["tags"]),
                ]
                for key in refs:
                    if key[1]:
                        made.setdefault(key, []).append(d)
                for link in extract_links(d["text"]):
                    if link not in keys:
                        made.setdefault(("Doc", "wiki:" + link), []).append(d)
            for (label, ident), sources in made.items():
                vis = (
                    "public"
                    if any(d["visibility"] == "public" for d in sources)
                    else ("confidential")
                )
                self._add(team, label, ident, ident, vis, sources=sources)
            nodes, rels = [], []
            fresh = {}
            for label, key, vis in (
                ("User", "member_pub", "public"),
                ("User", "member_conf", "confidential"),
                ("Resource", "res_pub", "public"),
                ("Resource", "res_conf", "confidential"),
                ("Agent", "helper_pub", "public"),
                ("Agent", "helper_conf", "confidential"),
            ):
                j = self._take()
                ident = f"{key}_gmk{j}g"
                name = f"{key.split('_')[0].title()} {key} gmk{j}g"
                self._add(team, label, ident, name, vis, marker=j)
                nodes.append({"label": label, "id": ident, "name": name, "visibility": vis})
                fresh[key] = ident
            user_pub = next(d["author_id"] for d in docs if d["visibility"] == "public")
            for rtype, a, b, vis, props in (
                (
                    "MEMBER_OF",
                    ("User", fresh["member_pub"]),
                    ("MicroDAO", team),
                    "public",
                    {"role": "guardian"},
                ),
                ("MEMBER_OF", ("User", user_pub), ("MicroDAO", team), "public", {"role": "member"}),
                (
                    "MEMBER_OF",
                    ("User", fresh["member_conf"]),
                    ("MicroDAO", team),
                    "confidential",
                    {"role": "member"},
                ),
                ("USES", ("Project", "prj_open"), ("Resource", fresh["res_pub"]), "public", {}),
                ("USES", ("Project", "prj_ops"), ("Resource", fresh["res_pub"]), "public", {}),
                (
                    "USES",
                    ("Project", "prj_board"),
                    ("Resource", fresh["res_conf"]),
                    "confidential",
                    {},
                ),
                (
                    "USES",
                    ("Project", "prj_secret"),
                    ("Resource", fresh["res_pub"]),
                    "confidential",
                    {},
                ),
                (
                    "USES",
                    ("Project", "prj_open"),
                    ("Resource", fresh["res_conf"]),
                    "confidential",
                    {},
                ),
                ("SERVES", ("Agent", fresh["helper_pub"]), ("Project", "prj_open"), "public", {}),
                ("SERVES", ("Agent", fresh["helper_pub"]), ("MicroDAO", team), "public", {}),
                (
                    "SERVES",
                    ("Agent", fresh["helper_conf"]),
                    ("Project", "prj_secret"),
                    "confidential",
                    {},
                ),
                (
                    "SERVES",
                    ("Agent", fresh["helper_conf"]),
                    ("Project", "prj_ops"),
                    "confidential",
                    {},
                ),
            ):
                rels.append(
                    {
                        "type": rtype,
                        "from": {"label": a[0], "id": a[1]},
                        "to": {"label": b[0], "id": b[1]},
                        "visibility": vis,
                        "properties": props,
                    }
                )
            self.upserts[team] = {"nodes": nodes, "relationships": rels}

    def _take(self) -> int:
        self.next_marker += 1
        return self.next_marker - 1

    def _add(
        self, team, label, ident, name, vis, *, doc=None, marker=None, sources=None
    ) -> dict[str, Any]:
        """Register an entity: ``sources`` (the documents naming it) for one documents made,
        none for one written directly."""
        found = GRAPH_MARKER.findall(f"{ident} {name}")
        j = marker if marker is not None else (int(found[-1]) if found else None)
        entry = {
            "team_id": team,
            "label": label,
            "id": ident,
            "name": name,
            "visibility": vis,
            "doc": doc,
            "gmk": j,
            "sources": sources,
        }
        if j is not None:
            self.entities[j] = entry
        self.by_key[(team, label, ident)] = entry
        return entry

    def refs(self, team: str | None = None) -> list[str]:
        """Ids and names of every entity of ``team`` or every team (probe arguments)."""
        out = []
        for e in self.by_key.values():
            if team is not None and e["team_id"] != team:
                continue
            out.append(e["id"])
            if e.get("name"):
                out.append(e["name"])
            if e.get("doc") and e["doc"].get("title"):
                out.append(e["doc"]["title"])
        return out

    # --- the oracle --------------------------------------------------------------------------
    def visible(self, ident: dict[str, Any], team: str, conf: bool, entity: dict[str, Any]) -> bool:
        """Whether ``entity`` (a registry entry or a serialised node) is inside the scope of
        ``ident`` in ``team`` (mode confidential or not): documents by the property tests'
        ``may_read``; an entity documents made when one of them is; one written directly
        by team and visibility, a project also by its project policy."""
        from tests.security.test_tenancy_properties import (
            CONFIDENTIAL_ROLES,
            may_read,
            resource_allowed,
        )

        labels = entity.get("labels") or [entity.get("label")]
        if entity.get("team_id") != team:
            return False
        label = next((lb for lb in labels if lb in NODE_LABELS), labels[0])
        entity = self.by_key.get((team, label, entity.get("id")), entity)
        if entity.get("sources") is not None:
            return any(may_read(ident, team, conf, d) for d in entity["sources"])
        if "Doc" in labels:
            doc = entity.get("doc") or node_doc(entity)
            return may_read(ident, team, conf, doc)
        roles = set(ident["teams"].get(team, ()))
        if not roles or entity.get("team_id") != team:
            return False
        if entity.get("visibility") != "public" and not (
            entity.get("visibility") == "confidential" and conf and roles & CONFIDENTIAL_ROLES
        ):
            return False
        if "Project" in labels:
            project = {"project_id": entity.get("id") or "", "doc_id": "", "tags": []}
            return resource_allowed(project, ident["groups"], ident["permissions"])
        return True

    def visible_markers(
        self, ident: dict[str, Any], team: str, conf: bool
    ) -> tuple[set[int], set[int]]:
        from tests.security.test_tenancy_properties import may_read

        docs = {i for i, d in enumerate(self.corpus) if may_read(ident, team, conf, d)}
        ents = {j for j, e in self.entities.items() if self.visible(ident, team, conf, e)}
        return docs, ents


class GraphGateway:
    """The in-process gateway (TestClient) over fakes for vectors and embeddings and the
    real Neo4j for the graph; the async driver lives in the client's event loop."""

    def __init__(self, auth: dict[str, Any], policy: Any, neo4j: Any, store: Any = None) -> None:
        from fastapi.testclient import TestClient

        from batch_ingest.chunking import whitespace_tokens
        from deployments.graph_store.store import Neo4jGraph
        from deployments.protocols import Backends
        from deployments.testing.fakes import FakeEmbedder, FakeVectorStore
        from serve_app.asgi import create_app
        from serve_app.composition import build_services
        from serve_app.settings import GatewaySettings

        settings = GatewaySettings(environment="test", auth=auth, neo4j=neo4j)
        self.embedder = FakeEmbedder(dim=32)
        self.store = store if store is not None else FakeVectorStore()
        self.graph = Neo4jGraph(settings.neo4j)
        self.services = build_services(
            settings,
            Backends(embedder=self.embedder, store=self.store, graph=self.graph),
            count_tokens=whitespace_tokens,
            policy=policy,
        )
        self.client = TestClient(create_app(self.services), raise_server_exceptions=False)
        # One event loop for the client's lifetime (the async driver is bound to it).
        self.client.__enter__()

    def post(self, path: str, body: Any, headers: dict[str, str]) -> Any:
        response = self.client.post(path, json=body, headers=headers)
        # Kept for the leak report.
        response.request_body = json.dumps(body, ensure_ascii=False, default=str)[:800]
        return response

    def close(self) -> None:
        try:
            self.client.portal.call(self.graph.close)
        finally:
            self.client.__exit__(None, None, None)


class GraphSnapshots:
    """A synchronous driver (outside the gateway) for seeding checks, write detection and
    the final clean-up of the run's teams."""

    def __init__(self, neo4j: Any, teams: tuple[str, ...], tag: str) -> None:
        from neo4j import GraphDatabase

        self.driver = GraphDatabase.driver(neo4j.uri, auth=(neo4j.user, neo4j.password))
        self.database = neo4j.database
        self.teams = list(teams)
        self.tag = tag

    def query(self, cypher: str, **params: Any) -> list[dict[str, Any]]:
        records, _, _ = self.driver.execute_query(cypher, params, database_=self.database)
        return [r.data() for r in records]

    def snapshot(self) -> frozenset[str]:
        """Every node and relationship of the run's teams, with all properties."""
        nodes = self.query(
            "MATCH (n) WHERE n.team_id IN $teams "
            "RETURN elementId(n) AS e, labels(n) AS l, properties(n) AS p",
            teams=self.teams,
        )
        rels = self.query(
            "MATCH (a)-[r]-(b) WHERE a.team_id IN $teams "
            "RETURN DISTINCT elementId(r) AS e, type(r) AS t, properties(r) AS p, "
            "elementId(startNode(r)) AS s, elementId(endNode(r)) AS d",
            teams=self.teams,
        )
        return frozenset(repr(sorted((k, repr(v)) for k, v in row.items())) for row in nodes + rels)

    def counts(self) -> dict[str, int]:
        rows = self.query(
            "MATCH (n) WHERE n.team_id IN $teams RETURN n.team_id AS t, count(n) AS c",
            teams=self.teams,
        )
        return {r["t"]: r["c"] for r in rows}

    def sentinels(self) -> int:
        """Nodes anywhere holding the write sentinel of this run (a Cypher write that
        went through, in any team)."""
        rows = self.query(
            "MATCH (n) WHERE n.id CONTAINS $s OR n.pwned CONTAINS $s RETURN count(n) AS c",
            s="pwn_" + self.tag,
        )
        labels = self.query("CALL db.labels() YIELD label RETURN collect(label) AS l")
        extra = sum(1 for label in labels[0]["l"] if self.tag in label) if labels else 0
        return int(rows[0]["c"]) + extra if rows else extra

    def clean(self) -> None:
        """DETACH DELETE everything of the run's teams (and anything holding its tag)."""
        self.query("MATCH (n) WHERE n.team_id IN $teams DETACH DELETE n", teams=self.teams)
        self.query(
            "MATCH (n) WHERE n.id CONTAINS $tag OR n.pwned CONTAINS $tag DETACH DELETE n",
            tag=self.tag,
        )

    def close(self) -> None:
        self.driver.close()


class GraphProbes:
    """The graph half of ``Prober`` (a mixin: it uses the prober's identities, credentials,
    random values and counters)."""

    rng: random.Random
    teams: tuple[str, ...]
    corpus: list[dict[str, Any]]
    seed_graph: GraphSeed
    graph_gw: GraphGateway
    dev_graph_gw: GraphGateway
    snapshots: GraphSnapshots
    tag: str
    written: int

    # --- set-up ------------------------------------------------------------------------------
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

    # --- probes ------------------------------------------------------------------------------
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


def foreign_of(teams: tuple[str, ...], team: Any) -> str:
    others = [t for t in teams if t != team]
    return others[0] if others else teams[0]


class Prober(GraphProbes):
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

    def close(self) -> None:
        for gw in self.gateways:
            gw.client.close()
            gw.services.recorder.log.close()

    # --- random inputs -----------------------------------------------------------------------
    def adv(self) -> Any:
        r = self.rng.random()
        if r < 0.8:
            return self.rng.choice(self.adversarial)
        if r < 0.9:
            return "".join(chr(self.rng.randint(0, 0x2FFF)) for _ in range(self.rng.randint(0, 20)))
        return self.rng.choice([None, 7, [], {}, True, ["dao_a"], {"$ne": ""}])

    def maybe(self, normal: Any, noisy: bool) -> Any:
        """``normal`` (or a choice of it), else an adversarial value one time in five."""
        value = self.rng.choice(normal) if isinstance(normal, (list, tuple)) else normal
        return self.adv() if noisy and self.rng.random() < 0.2 else value

    def identity(self) -> dict[str, Any]:
        rng = self.rng
        teams: dict[str, list[str]] = {}
        for _ in range(rng.randint(1, 3)):
            team = rng.choice(self.teams) if rng.random() < 0.9 else str(self.adv())
            if 0 < len(team) <= 256 and "\x00" not in team:
                roles = ("member", "guest", "owner", "service", "guardian", "visitor")
                teams[team] = rng.sample(roles, rng.randint(1, 3))
        if not teams:
            teams = {rng.choice(self.teams): ["member"]}
        perms = ["skill:read", "memory:read"] + (["audit:read"] if rng.random() < 0.1 else [])
        return {
            "sub": rng.choice(["alice", "bob"]) if rng.random() < 0.9 else str(self.adv()) or "x",
            "teams": teams,
            "groups": set(rng.sample(["ops", "board", "dev"], rng.randint(0, 2))),
            "permissions": set(rng.sample(perms, rng.randint(0, len(perms)))),
            "agent_id": rng.choice(["", "ag_1", "ag_2"]),
        }

    def credential(self, kind: str, identity: dict[str, Any]) -> tuple[dict[str, str], Any]:
        """``(headers, identity the gateway should see)``; the identity is None for a
        credential that must be refused, and ``"dev"`` for development body trust."""
        from serve_app.testing import claims, hmac_token
        from tests.security.test_tenancy_properties import token_for

        if kind == "dev_body_trust":
            return {}, "dev"
        if kind == "no_credential":
            return {}, None
        if kind == "api_key_valid":
            key, ident = self.rng.choice(self.key_identities)
            return {"x-api-key": key}, ident
        if kind == "api_key_other_team":
            # A valid key of some team; the request will name another team (see team()).
            key, ident = self.rng.choice(self.key_identities)
            return {"authorization": f"Bearer {key}"}, ident
        if kind == "api_key_unknown":
            return {"x-api-key": "rgk_" + "".join(self.rng.choices("abcdef0123", k=40))}, None
        if kind == "jwt_hs256_over_nothing":
            payload = claims(sub=identity["sub"], teams=identity["teams"])
            token = hmac_token(payload, b"", {"alg": "HS256", "typ": "JWT"})
        elif kind == "jwt_garbage":
            token = self.rng.choice(["not.a.token", "a.b.c", "....", str(self.adv())[:100]])
        else:
            # valid, expired, not_yet, wrong_aud, wrong_iss, forged, alg_none, cut: the same
            # token recipes as the property tests.
            token = token_for(identity, kind.removeprefix("jwt_"))
        if not token or any(c in token for c in "\r\n\x00") or not token.isascii():
            token = "not.a.token"
        ok = kind == "jwt_valid"
        return {"authorization": f"Bearer {token}"}, identity if ok else None

    def team(self, identity: Any, noisy: bool, other: bool) -> Any:
        granted = sorted(identity["teams"]) if isinstance(identity, dict) else []
        if other:
            foreign = [t for t in self.teams if t not in granted]
            return self.rng.choice(foreign or list(self.teams))
        if not granted or self.rng.random() < 0.15:
            return self.rng.choice(self.teams)
        return self.maybe(granted, noisy)

    # --- checks ------------------------------------------------------------------------------
    def record(self, endpoint: str, category: str, response: Any, problem: str | None) -> None:
        self.runs[(endpoint, category)] += 1
        self.statuses[(endpoint, response.status_code)] += 1
        if response.status_code >= 500:
            self.server_errors.append(
                {
                    "endpoint": endpoint,
                    "category": category,
                    "body": response.text[:300],
                    "request": getattr(response, "request_body", None),
                }
            )
        if problem:
            self.leaks.append(
                {
                    "endpoint": endpoint,
                    "category": category,
                    "status": response.status_code,
                    "problem": problem,
                    "request": getattr(response, "request_body", None),
                    "body": response.text[:800],
                }
            )

    def common_failure(self, expected: Any, response: Any) -> str | None:
        from tests.security.test_tenancy_properties import MARKER

        if expected is None and response.status_code != 401:
            return f"bad credential answered {response.status_code}"
        if response.status_code != 200 and MARKER.findall(response.text):
            return f"markers in a {response.status_code} body"
        return None

    # --- probes ------------------------------------------------------------------------------
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

    def probe_ingest(self, kind: str) -> None:
        from tests.security.test_tenancy_properties import may_write

        rng = self.rng
        identity = self.identity()
        headers, expected = self.credential(kind, identity)
        noisy = rng.random() < 0.5
        docs = []
        for _ in range(rng.randint(1, 3)):
            doc: dict[str, Any] = {
                "team_id": self.team(expected, noisy, kind == "api_key_other_team"),
                "doc_id": self.maybe(["d1", "dao_a_pub_doc", "SKILL-deploy", "d2"], noisy),
                "text": self.maybe(["Milvus notes", "budget plan"], noisy),
            }
            for name, values in (
                ("visibility", ["confidential", "public"]),
                ("doc_type", ["transaction", "doc", "wiki", "message", "file"]),
                ("project_id", ["prj_ops", "", "prj_board", "prj_open"]),
                ("title", ["A title"]),
                ("channel_id", ["ch_1"]),
            ):
                if rng.random() < 0.6:
                    doc[name] = self.maybe(values, noisy)
            if rng.random() < 0.3:
                doc["tags"] = [self.maybe(["skill:SKILL-deploy", "rag"], noisy)]
            docs.append(doc)
        gw = self.dev_ingest_gw if expected == "dev" else self.ingest_gw
        before = dict(gw.store.rows)
        response = gw.ingest(docs, **headers)
        problem = self.common_failure(expected, response)
        changed = {cid: r for cid, r in gw.store.rows.items() if before.get(cid) is not r}
        if problem is None and response.status_code != 200 and changed:
            problem = f"a {response.status_code} changed {len(changed)} rows"
        if problem is None and response.status_code == 200:
            if expected == "dev":
                teams = {str(d["team_id"]).strip() for d in docs}
                ident = {
                    "teams": {t: ["owner"] for t in teams},
                    "groups": set(),
                    "permissions": set(),
                }
            else:
                ident = expected
            for doc in docs:
                normalized = {**doc, "team_id": str(doc["team_id"]).strip()}
                if not may_write(ident, normalized):
                    problem = f"wrote {doc.get('doc_id')!r} in {doc['team_id']!r}"
                    break
            written = {row.team_id for row in changed.values()}
            if problem is None and not written <= set(ident["teams"]):
                problem = f"rows written in teams {sorted(written - set(ident['teams']))}"
        self.record(ENDPOINTS[1], kind, response, problem)

    def probe_audit(self, kind: str) -> None:
        rng = self.rng
        identity = self.identity()
        headers, expected = self.credential(kind, identity)
        if expected == "dev":
            # Development body trust reads every team's audit outside production (documented);
            # probe it with a valid token instead.
            kind, (headers, expected) = "jwt_valid", self.credential("jwt_valid", identity)
        noisy = rng.random() < 0.5
        params: dict[str, Any] = {}
        if rng.random() < 0.85:
            params["team_id"] = self.team(expected, noisy, kind == "api_key_other_team")
        if rng.random() < 0.3:
            params["decision"] = self.maybe(["allow", "deny"], noisy)
        if rng.random() < 0.3:
            params["limit"] = self.maybe([1, 10, 500, 0, -1], noisy)
        if rng.random() < 0.2:
            params["subject"] = self.maybe(["alice", "bob"], noisy)
        params = {k: v for k, v in params.items() if isinstance(v, (str, int)) and v is not True}
        response = self.search_gw.client.get("/audit/decisions", params=params, headers=headers)
        problem = self.common_failure(expected, response)
        if problem is None and response.status_code == 200:
            team = params.get("team_id")
            everything = "audit:read" in expected["permissions"]
            roles = set(expected["teams"].get(str(team), ())) if team is not None else set()
            if not everything and not (team and "owner" in roles):
                problem = f"audit of team {team!r} readable without a reader role"
            elif not everything:
                others = {d.get("team_id") for d in response.json()["decisions"]} - {team}
                if others:
                    problem = f"audit records of teams {sorted(map(str, others))}"
        self.record(ENDPOINTS[2], kind, response, problem)

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
