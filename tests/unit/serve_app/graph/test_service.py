"""graph.query_context / explain_path / entity upsert over HTTP with a fake graph store:
access checks, the scope handed to the store, the result filter, 4xx mapping and audit.
The queries themselves run against the real Neo4j in tests/integration/test_graph_queries.py.
"""

from __future__ import annotations

import pytest

from deployments.errors import InvalidQuery, QueryLimitExceeded
from deployments.graph_store.intents import INTENTS
from deployments.protocols import GraphScope
from serve_app.audit.log import sha256_text
from serve_app.testing import TENANCY_POLICY, build_gateway, claims, mint, tenancy_corpus

# The document-ACL tokens of the tokens' subject without groups.
ALICE = ("*", "user:alice")


def token(teams=None, **overrides) -> str:
    return mint(claims(teams=teams or {"dao_a": ["member"]}, **overrides))


def OWNER_OF_EVERYTHING() -> str:  # noqa: N802 (reads as a constant)
    """An owner of dao_a whom no project or skill policy restricts (may send Cypher)."""
    return token({"dao_a": ["owner"]}, groups=["ops", "board"], permissions=["skill:read"])


def auth(tok: str) -> dict[str, str]:
    return {"authorization": f"Bearer {tok}"}


def node(label: str, id_: str, team: str = "dao_a", visibility: str = "public", **props):
    return {
        "_type": "node",
        "labels": [label],
        "id": id_,
        "team_id": team,
        "visibility": visibility,
        **props,
    }


@pytest.fixture
def gw():
    return build_gateway(policy=TENANCY_POLICY, corpus=tenancy_corpus())


def test_intent_gets_the_callers_scope_and_rows_outside_it_are_dropped(gw):
    graph = gw.services.backends.graph
    graph.results["FIND_PROJECTS_BY_TECH"] = {
        "columns": ["project", "evidence"],
        "rows": [
            [node("Project", "prj_open"), [node("Resource", "milvus")]],
            [node("Project", "prj_x", team="dao_b"), []],
            [node("Project", "prj_open"), [node("Doc", "d", visibility="confidential")]],
            [node("Project", "prj_ops"), []],  # group policy: the caller is not in "ops"
        ],
    }
    r = gw.client.post(
        "/graph/query",
        json={"team_id": "dao_a", "intent": "FIND_PROJECTS_BY_TECH", "args": {"tech": "Milvus"}},
        headers=auth(token()),
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["filtered_rows"] == 3
    assert [row["project"]["id"] for row in body["rows"]] == ["prj_open"]
    name, args, scope = graph.calls[-1]
    assert name == "FIND_PROJECTS_BY_TECH" and args == {"tech": "Milvus", "limit": 20}
    assert scope == GraphScope("dao_a", ("public",), acl_principals=ALICE)


def test_intent_names_are_case_insensitive_and_dao_id_is_the_team(gw):
    r = gw.client.post(
        "/graph/query",
        json={"dao_id": "dao_a", "intent": "members_of_dao", "args": {}},
        headers=auth(token()),
    )
    assert r.status_code == 200, r.text
    assert r.json()["intent"] == "MEMBERS_OF_DAO"


def test_unknown_intent_is_404_and_bad_args_422_naming_the_field(gw):
    r = gw.client.post(
        "/graph/query", json={"team_id": "dao_a", "intent": "NOPE"}, headers=auth(token())
    )
    assert r.status_code == 404 and "FIND_PROJECTS_BY_TECH" in r.json()["message"]
    r = gw.client.post(
        "/graph/query",
        json={"team_id": "dao_a", "intent": "FIND_PROJECTS_BY_TECH", "args": {"tek": "x"}},
        headers=auth(token()),
    )
    assert r.status_code == 422
    assert "args.tech" in r.json()["message"] and "args.tek" in r.json()["message"]
    r = gw.client.post(
        "/graph/query",
        json={
            "team_id": "dao_a",
            "intent": "DOCS_MENTIONING_TOPIC",
            "args": {"topic": "x", "limit": 0},
        },
        headers=auth(token()),
    )
    assert r.status_code == 422 and "args.limit" in r.json()["message"]


@pytest.mark.parametrize(
    "body, problem",
    [
        ({"team_id": "dao_a"}, "exactly one of"),
        ({"team_id": "dao_a", "intent": "X", "cypher": "RETURN 1"}, "exactly one of"),
        (
            {"team_id": "dao_a", "cypher": "RETURN 1", "params": {"team_id": "dao_b"}},
            "set by the gateway",
        ),
        (
            {
                "team_id": "dao_a",
                "cypher": "RETURN 1",
                "params": {"visibilities": ["confidential"]},
            },
            "set by the gateway",
        ),
        ({"team_id": "dao_a", "intent": "X", "params": {"a": 1}}, "`params` go with `cypher`"),
        ({"team_id": "dao_a", "intent": "X", "limit": 1}, "limit"),
    ],
)
def test_malformed_graph_queries_are_422(gw, body, problem):
    r = gw.client.post("/graph/query", json=body, headers=auth(token()))
    assert r.status_code == 422, r.text
    assert problem in r.text


def test_cypher_needs_a_cypher_role(gw):
    body = {"team_id": "dao_a", "cypher": "MATCH (n) RETURN n"}
    r = gw.client.post("/graph/query", json=body, headers=auth(token()))
    assert r.status_code == 403 and r.json()["reason"] == "cypher_not_granted"
    assert not gw.services.backends.graph.calls
    gw.services.backends.graph.results["cypher"] = {"columns": ["n"], "rows": [[1]]}
    # An owner whom project policies keep out of prj_ops / prj_board sees less than the
    # whole team: the plan check cannot apply those policies, so Cypher is refused.
    r = gw.client.post(
        "/graph/query",
        json={**body, "mode": "confidential"},
        headers=auth(token({"dao_a": ["owner"]})),
    )
    assert r.status_code == 403 and r.json()["reason"] == "cypher_restricted_by_policy"
    assert "prj_board" in r.json()["message"] and not gw.services.backends.graph.calls
    everything = token({"dao_a": ["owner"]}, groups=["ops", "board"], permissions=["skill:read"])
    r = gw.client.post(
        "/graph/query", json={**body, "mode": "confidential"}, headers=auth(everything)
    )
    assert r.status_code == 200, r.text
    assert r.json()["rows"] == [{"n": 1}]
    _, (query, params), scope = gw.services.backends.graph.calls[-1]
    assert scope == GraphScope(
        "dao_a", ("public", "confidential"), acl_principals=(*ALICE, "group:board", "group:ops")
    )


def test_cypher_in_another_team_is_403_before_the_store_is_asked(gw):
    r = gw.client.post(
        "/graph/query",
        json={"team_id": "dao_b", "cypher": "MATCH (n) RETURN n"},
        headers=auth(token({"dao_a": ["owner"]})),
    )
    assert r.status_code == 403 and r.json()["reason"] == "team_not_granted"
    assert not gw.services.backends.graph.calls


@pytest.mark.parametrize(
    "error, status, code",
    [
        (InvalidQuery("Neo4j rejected the query: Invalid input 'X'"), 400, "invalid_query"),
        (QueryLimitExceeded("too many rows", reason="row_limit"), 422, "query_limit_exceeded"),
        (QueryLimitExceeded("timeout", reason="timeout"), 422, "query_limit_exceeded"),
    ],
)
def test_store_errors_keep_their_status_and_message(gw, error, status, code):
    gw.services.backends.graph.results["cypher"] = error
    r = gw.client.post(
        "/graph/query",
        json={"team_id": "dao_a", "cypher": "RETURN 1"},
        headers=auth(OWNER_OF_EVERYTHING()),
    )
    assert r.status_code == status
    assert r.json()["error"] == code and r.json()["message"] == error.message


def test_graph_down_is_503_while_search_keeps_working(gw):
    gw.services.backends.graph.down = True
    r = gw.client.post(
        "/graph/query",
        json={"team_id": "dao_a", "intent": "MEMBERS_OF_DAO"},
        headers=auth(token()),
    )
    assert r.status_code == 503 and "neo4j" in r.json()["message"]
    r = gw.client.post(
        "/graph/explain_path",
        json={"team_id": "dao_a", "from": "a", "to": "b"},
        headers=auth(token()),
    )
    assert r.status_code == 503
    r = gw.search({"team_id": "dao_a", "query": "qmk0q"}, token())
    assert r.status_code == 200 and r.json()["matches"]


def test_graph_disabled_is_503_with_a_reason(gw):
    gw.services.graph.graph = None
    r = gw.client.post(
        "/graph/query",
        json={"team_id": "dao_a", "intent": "MEMBERS_OF_DAO"},
        headers=auth(token()),
    )
    assert r.status_code == 503 and "disabled" in r.json()["message"]


def test_intents_catalogue_lists_every_intent_with_its_schema(gw):
    r = gw.client.get("/graph/intents", headers=auth(token()))
    assert r.status_code == 200
    intents = r.json()["intents"]
    assert len(intents) >= 8 and {i["intent"] for i in intents} == set(INTENTS)
    for entry in intents:
        assert entry["args_schema"]["type"] == "object"
        assert entry["example"]["intent"] == entry["intent"]
    assert gw.client.get("/graph/intents").status_code == 401


def test_explain_path_writes_a_sentence_and_drops_paths_outside_the_scope(gw):
    alice, milvus = node("User", "alice", name="Alice"), node("Resource", "milvus", name="Milvus")
    proj = node("Project", "prj_open", name="Open")
    secret = node("Project", "prj_secret", visibility="confidential")

    def rel(kind, a, b, visibility="public"):
        return {
            "_type": "relationship",
            "type": kind,
            "start": {"label": a["labels"][0], "id": a["id"]},
            "end": {"label": b["labels"][0], "id": b["id"]},
            "team_id": "dao_a",
            "visibility": visibility,
        }

    gw.services.backends.graph.results["path"] = {
        "source": [alice],
        "target": [milvus],
        "paths": [
            {
                "_type": "path",
                "nodes": [alice, proj, milvus],
                "relationships": [rel("MEMBER_OF", alice, proj), rel("USES", proj, milvus)],
            },
            {
                "_type": "path",
                "nodes": [alice, secret, milvus],
                "relationships": [rel("MEMBER_OF", alice, secret), rel("USES", secret, milvus)],
            },
        ],
    }
    r = gw.client.post(
        "/graph/explain_path",
        json={"team_id": "dao_a", "from": "alice", "to": {"name": "Milvus", "label": "Resource"}},
        headers=auth(token()),
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["filtered_paths"] == 1 and len(body["paths"]) == 1
    assert body["explanation"] == (
        "User 'Alice' is a member of Project 'Open'; Project 'Open' uses Resource 'Milvus'."
    )
    _, (source, target, hops, paths), scope = gw.services.backends.graph.calls[-1]
    assert source == {"ref": "alice", "label": None}
    assert target == {"ref": "Milvus", "label": "Resource"}
    assert (hops, paths) == (4, 3)
    assert scope == GraphScope("dao_a", ("public",), acl_principals=ALICE)


def test_explain_path_not_found_and_bounds(gw):
    r = gw.client.post(
        "/graph/explain_path",
        json={"team_id": "dao_a", "from": "alice", "to": "bob"},
        headers=auth(token()),
    )
    assert r.status_code == 404 and r.json()["fields"][0]["field"] == "from"
    r = gw.client.post(
        "/graph/explain_path",
        json={"team_id": "dao_a", "from": "a", "to": "b", "max_hops": 11},
        headers=auth(token()),
    )
    assert r.status_code == 422 and "max_hops" in r.text
    r = gw.client.post(
        "/graph/explain_path",
        json={"team_id": "dao_a", "from": "a", "to": "b", "max_hops": 8},
        headers=auth(token()),
    )
    assert r.status_code == 422 and "at most 6" in r.json()["message"]


UPSERT = {
    "team_id": "dao_a",
    "nodes": [{"label": "Resource", "id": "milvus", "name": "Milvus"}],
    "relationships": [
        {
            "type": "USES",
            "from": {"label": "Project", "id": "prj_open"},
            "to": {"label": "Resource", "id": "milvus"},
            "properties": {"since": 2024},
        },
        {
            "type": "MEMBER_OF",
            "from": {"label": "User", "id": "alice"},
            "to": {"label": "MicroDAO", "id": "dao_a"},
            "properties": {"role": "guardian"},
        },
    ],
}


def test_upsert_needs_a_write_role_and_passes_validated_entities(gw):
    r = gw.client.post("/graph/entities", json=UPSERT, headers=auth(token()))
    assert r.status_code == 403 and r.json()["reason"] == "write_not_granted"
    r = gw.client.post("/graph/entities", json=UPSERT, headers=auth(token({"dao_a": ["owner"]})))
    assert r.status_code == 200, r.text
    assert (r.json()["nodes"], r.json()["relationships"]) == (1, 2)
    team, nodes, rels = gw.services.backends.graph.entities[-1]
    assert team == "dao_a" and nodes[0]["label"] == "Resource"
    assert rels[0] == {
        "type": "USES",
        "from_label": "Project",
        "from_id": "prj_open",
        "to_label": "Resource",
        "to_id": "milvus",
        "visibility": "public",
        "properties": {"since": 2024},
    }


def test_upsert_hands_the_writers_scope_to_the_store(gw):
    r = gw.client.post("/graph/entities", json=UPSERT, headers=auth(token({"dao_a": ["service"]})))
    assert r.status_code == 200, r.text
    name, _, scope = gw.services.backends.graph.calls[-1]
    assert name == "upsert" and scope.team_id == "dao_a" and scope.visibilities == ("public",)


def test_an_upsert_the_store_refuses_is_403_naming_what_is_out_of_reach(gw):
    gw.services.backends.graph.results["upsert"] = {
        "nodes": 0,
        "relationships": 0,
        "refused": [
            {"label": "Resource", "id": "vault"},
            {"type": "USES", "from_id": "u", "to_id": "vault"},
        ],
    }
    r = gw.client.post("/graph/entities", json=UPSERT, headers=auth(token({"dao_a": ["owner"]})))
    assert r.status_code == 403, r.text
    body = r.json()
    assert body["reason"] == "entity_out_of_reach"
    assert "Resource 'vault'" in body["message"] and "USES 'u'->'vault'" in body["message"]
    assert "nothing was written" in body["message"]


def test_every_visibility_change_is_audited_and_returned(gw):
    gw.services.backends.graph.results["upsert"] = {
        "changes": [
            {"label": "Resource", "id": "milvus", "before": "confidential", "after": "public"},
            {
                "label": "Topic",
                "id": "t",
                "before": "public",
                "after": "public",
                "was_derived": True,
            },
            {
                "type": "USES",
                "from_id": "p",
                "to_id": "milvus",
                "before": "public",
                "after": "confidential",
            },
        ],
        "derived_ends": [{"label": "Project", "id": "prj_open"}],
    }
    r = gw.client.post("/graph/entities", json=UPSERT, headers=auth(token({"dao_a": ["owner"]})))
    assert r.status_code == 200, r.text
    assert len(r.json()["visibility_changes"]) == 3
    assert r.json()["derived_ends"] == [{"label": "Project", "id": "prj_open"}]
    gw.services.recorder.log.flush()
    rows = gw.services.recorder.log.query(team_id="dao_a", limit=20)
    changes = {(x["resource"], x["reason"]) for x in rows if x["action"] == "graph.visibility"}
    assert changes == {
        ("team:dao_a/entity:Resource:milvus", "visibility:confidential->public"),
        ("team:dao_a/entity:Topic:t", "visibility:derived->public"),
        ("team:dao_a/rel:USES:p->milvus", "visibility:public->confidential"),
    }


def test_upsert_of_confidential_entities_needs_confidential_mode(gw):
    body = {**UPSERT, "nodes": [{"label": "Resource", "id": "x", "visibility": "confidential"}]}
    owner = auth(token({"dao_a": ["owner"]}))
    r = gw.client.post("/graph/entities", json=body, headers=owner)
    assert r.status_code == 403 and r.json()["reason"] == "confidential_not_granted"
    r = gw.client.post("/graph/entities", json={**body, "mode": "confidential"}, headers=owner)
    assert r.status_code == 200


@pytest.mark.parametrize(
    "change, problem",
    [
        ({"nodes": [{"label": "Doc", "id": "d"}]}, "label"),
        (
            {"nodes": [{"label": "Resource", "id": "x", "properties": {"team_id": "dao_b"}}]},
            "set by the gateway",
        ),
        ({"nodes": [{"label": "Resource", "id": "x", "properties": {"a b": 1}}]}, "must match"),
        ({"nodes": [{"label": "MicroDAO", "id": "dao_b"}]}, "MicroDAO"),
        (
            {
                "relationships": [
                    {
                        "type": "OWNS",
                        "from": {"label": "User", "id": "u"},
                        "to": {"label": "Project", "id": "p"},
                    }
                ]
            },
            "type",
        ),
        (
            {
                "relationships": [
                    {
                        "type": "MEMBER_OF",
                        "from": {"label": "User", "id": "u"},
                        "to": {"label": "MicroDAO", "id": "dao_b"},
                    }
                ]
            },
            "MicroDAO",
        ),
        ({"nodes": [], "relationships": []}, "at least one"),
        ({"nodes": [{"label": "Resource", "id": ""}]}, "nodes.0.id"),
    ],
)
def test_bad_upserts_are_422(gw, change, problem):
    r = gw.client.post(
        "/graph/entities", json={**UPSERT, **change}, headers=auth(token({"dao_a": ["owner"]}))
    )
    assert r.status_code == 422, r.text
    assert problem in r.text


def test_graph_decisions_are_audited(gw):
    gw.client.post(
        "/graph/query",
        json={"team_id": "dao_a", "cypher": "MATCH (n) RETURN n"},
        headers=auth(token()),
    )
    gw.client.post(
        "/graph/query",
        json={"team_id": "dao_a", "intent": "MEMBERS_OF_DAO"},
        headers=auth(token()),
    )
    gw.services.recorder.log.flush()
    rows = gw.services.recorder.log.query(team_id="dao_a", limit=10)
    graph_rows = [r for r in rows if r["action"].startswith("graph.")]
    assert {(r["decision"], r["reason"]) for r in graph_rows} >= {
        ("deny", "cypher_not_granted"),
        ("allow", "granted"),
    }
    denied = next(r for r in graph_rows if r["decision"] == "deny")
    assert denied["query_sha256"] == sha256_text("MATCH (n) RETURN n")
    assert denied["subject"] == "alice" and denied["resource"] == "team:dao_a/cypher"


# --- graph-scoped retrieval (search_docs "graph" option) ---------------------------------

GRAPH_CORPUS = [
    {
        "team_id": "dao_a",
        "doc_id": f"d{i}",
        "title": f"Note {i}",
        "text": text,
        "visibility": "public",
        "doc_type": "doc",
    }
    for i, text in enumerate(
        [
            "deploy the vector store with helm and check the pods",
            "the vector store keeps embeddings of every chunk",
            "weekly meeting notes about the budget and the vector store",
        ]
    )
]


@pytest.fixture
def small():
    return build_gateway(policy=TENANCY_POLICY, corpus=GRAPH_CORPUS)


def linked(docs, entity=None):
    return {
        "entities": [{"node": entity or node("Resource", "milvus", name="Milvus"), "score": 2.0}],
        "docs": docs,
    }


def search(gw, **body):
    r = gw.search({"team_id": "dao_a", "query": "vector store", "top_k": 3, **body}, token())
    assert r.status_code == 200, r.text
    return r.json()


def test_graph_boost_lifts_linked_documents(small):
    plain = [m["source_ref"]["id"] for m in search(small)["matches"]]
    assert plain[0] != "d2"
    small.services.backends.graph.results["related"] = linked({"d2": 2.0})
    body = search(small, graph={"mode": "boost", "weight": 2.0})
    assert [m["source_ref"]["id"] for m in body["matches"]][0] == "d2"
    assert body["graph"] == {
        "mode": "boost",
        "entities": [{"label": "Resource", "id": "milvus", "name": "Milvus", "score": 2.0}],
        "linked_docs": 1,
        "applied": True,
    }
    _, text, scope = small.services.backends.graph.calls[-1]
    assert text == "vector store"
    assert scope == GraphScope("dao_a", ("public",), acl_principals=ALICE)


def test_graph_scope_narrows_the_search_to_linked_documents(small):
    small.services.backends.graph.results["related"] = linked({"d1": 1.0, "d2": 1.0})
    body = search(small, graph="scope")
    assert {m["source_ref"]["id"] for m in body["matches"]} == {"d1", "d2"}


def test_graph_option_without_entities_leaves_the_search_alone(small):
    plain = search(small)["matches"]
    body = search(small, graph="scope")
    assert [m["source_ref"]["id"] for m in body["matches"]] == [
        m["source_ref"]["id"] for m in plain
    ]
    assert body["graph"]["applied"] is False and "no entity" in body["graph"]["note"]


def test_entities_outside_the_scope_are_ignored(small):
    secret = node("Project", "atlas", visibility="confidential")
    small.services.backends.graph.results["related"] = linked({"d2": 1.0}, entity=secret)
    body = search(small, graph="scope")
    assert body["graph"]["entities"] == [] and body["graph"]["applied"] is False
    assert len(body["matches"]) == 3


def test_graph_down_degrades_the_search_but_answers(small):
    small.services.backends.graph.down = True
    body = search(small, graph="boost")
    assert body["degraded"] is True and "graph unavailable" in body["degraded_reasons"][0]
    assert len(body["matches"]) == 3


def test_no_graph_field_without_the_option_and_bad_modes_are_422(small):
    assert "graph" not in search(small)
    r = small.search({"team_id": "dao_a", "query": "x", "graph": "everywhere"}, token())
    assert r.status_code == 422 and "graph" in r.text
    r = small.search(
        {"team_id": "dao_a", "query": "x", "graph": {"mode": "boost", "hops": 2}}, token()
    )
    assert r.status_code == 422 and "hops" in r.text


def test_tools_lists_the_four_agent_tools_with_schemas(gw):
    # With authentication on the catalogue needs a credential (serve_app/ops/surface.py).
    r = gw.client.get("/tools", headers=auth(token()))
    assert r.status_code == 200
    tools = {t["name"]: t for t in r.json()["tools"]}
    assert set(tools) == {
        "rag.search_docs",
        "rag.enrich_answer",
        "graph.query_context",
        "graph.explain_path",
    }
    search = tools["rag.search_docs"]["input_schema"]
    assert "query" in search["properties"] and "graph" in search["properties"]
    assert tools["graph.query_context"]["endpoint"] == "POST /graph/query"
