"""Document ACLs in the graph with fakes: the tokens every graph statement binds, the Cypher
text that carries the ACL predicate, the result filter on ACL'd ``Doc`` nodes, the rows the
graph store writes, and the refusal of caller Cypher when the team holds documents the
caller's ACL does not admit. The predicates run against the real Neo4j in
tests/integration/test_graph_acl.py."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import pytest

from deployments.config import Neo4jSettings
from deployments.graph_store.client import Neo4jClient
from deployments.graph_store.cypher import ACL_HIDDEN, ENTITIES, MERGE_DOCUMENTS, RELATED_DOCS
from deployments.graph_store.intents import INTENTS, acl_allowed, doc_allowed, entity_allowed
from deployments.graph_store.params import bundled
from deployments.graph_store.store import Neo4jGraph
from deployments.protocols import GraphDocument, GraphScope
from serve_app.access import graph as graph_access
from serve_app.access.context import AccessContext
from serve_app.testing import TENANCY_POLICY, build_gateway, claims, mint

HR_ONLY = {"acl_allow": ["group:hr", "user:alice"], "acl_deny": ["group:contractors"]}


def ctx(user: str = "bob", groups: tuple[str, ...] = ()) -> AccessContext:
    return AccessContext(team_id="dao_a", user_id=user, groups=frozenset(groups))


def doc_node(id_: str = "d1", **props: Any) -> dict[str, Any]:
    return {
        "_type": "node",
        "labels": ["Doc"],
        "id": id_,
        "team_id": "dao_a",
        "visibility": "public",
        "doc_type": "doc",
        **props,
    }


# --- the scope every statement binds -----------------------------------------------------


def test_graph_scope_binds_the_callers_acl_tokens():
    scope = graph_access.graph_scope(ctx("alice", ("hr", "contractors")))
    assert scope.acl_principals == ("*", "user:alice", "group:contractors", "group:hr")
    assert scope.params["acl_principals"] == ["*", "user:alice", "group:contractors", "group:hr"]
    assert graph_access.graph_scope(ctx("", ())).params["acl_principals"] == ["*"]


# --- the Cypher text ---------------------------------------------------------------------


def test_the_doc_predicate_carries_the_acl():
    assert acl_allowed("d") in doc_allowed("d")
    assert acl_allowed("x") in entity_allowed("x")
    assert "coalesce(d.acl_allow, ['*'])" in acl_allowed("d")
    assert "coalesce(d.acl_deny, [])" in acl_allowed("d")


# Variables without a label that may be documents, by intent.
UNLABELLED = {"AGENTS_SERVING": ("x",), "ENTITY_NEIGHBOURS": ("e", "n")}


@pytest.mark.parametrize("name", sorted(INTENTS))
def test_every_doc_variable_of_every_intent_carries_the_acl(name):
    cypher = INTENTS[name].cypher
    docs = re.findall(r"\((\w+):Doc\)", cypher) + list(UNLABELLED.get(name, ()))
    for v in docs:
        assert acl_allowed(v) in cypher, (name, v)


def test_the_stores_own_queries_bind_the_acl():
    for cypher in (RELATED_DOCS, ENTITIES, ACL_HIDDEN):
        assert "$acl_principals" in cypher
    assert "doc.acl_allow = d.acl_allow" in MERGE_DOCUMENTS
    assert "doc.acl_deny = d.acl_deny" in MERGE_DOCUMENTS


# --- the result filter -------------------------------------------------------------------


@pytest.mark.parametrize(
    "user, groups, seen",
    [
        ("bob", (), False),
        ("bob", ("hr",), True),
        ("bob", ("hr", "contractors"), False),
        ("alice", (), True),
        ("alice", ("contractors",), False),
    ],
)
def test_may_see_entity_applies_a_docs_acl(user, groups, seen):
    assert graph_access.may_see_entity(ctx(user, groups), doc_node(**HR_ONLY)) is seen


def test_a_doc_without_an_acl_is_open_and_other_labels_ignore_acl_properties():
    assert graph_access.may_see_entity(ctx(), doc_node())
    assert graph_access.may_see_entity(ctx(), doc_node(acl_allow=None, acl_deny=None))
    assert graph_access.may_see_entity(ctx(), doc_node(acl_allow=["*"], acl_deny=[]))
    topic = {**doc_node(**HR_ONLY), "labels": ["Topic"]}
    assert graph_access.may_see_entity(ctx(), topic)
    path = {"_type": "path", "nodes": [doc_node(), doc_node("d2", **HR_ONLY)]}
    assert not graph_access.may_see_value(ctx(), path)
    assert graph_access.may_see_value(ctx("bob", ("hr",)), path)


# --- what the graph store writes and asks ------------------------------------------------


class RecordingClient(Neo4jClient):
    """Stands in for Neo4jClient's I/O: records statements, answers ``rows``."""

    def __init__(self, rows: list[list[Any]] | None = None) -> None:
        super().__init__(Neo4jSettings())
        self.rows = rows or []
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def run(self, query: str, params: dict[str, Any], write: bool = False):
        self.calls.append((query, params))
        return [{"merged": len(params.get("docs", [])), "affected": []}]

    async def write_transaction(self, work):
        client = self

        class Tx:
            async def run(self, query: str, params: dict[str, Any]):
                # The gateway's own statements arrive with their parameters in one map.
                assert list(params) == ["p"], params
                rows = await client.run(query, params["p"], write=True)

                async def records():
                    for row in rows:
                        yield SimpleNamespace(data=lambda row=row: row)

                return records()

        return await work(Tx())

    async def read(self, query: str, params: dict[str, Any], *, max_rows: int, trusted=True):
        self.calls.append((query, params))
        return ["doc_id"], self.rows[:max_rows]


def gdoc(doc_id: str, **kw: Any) -> GraphDocument:
    return GraphDocument("dao_a", doc_id, doc_id, "public", "doc", **kw)


def graph_with(client: RecordingClient) -> Neo4jGraph:
    graph = Neo4jGraph(Neo4jSettings())
    graph.client = client  # type: ignore[assignment]
    return graph


async def test_merge_documents_stores_each_docs_acl():
    client = RecordingClient()
    docs = [
        gdoc("hr.md", acl_allow=("group:hr",), acl_deny=("group:c",)),
        gdoc("open.md"),
        gdoc("empty.md", acl_allow=()),
    ]
    assert await graph_with(client).merge_documents(docs) == 3
    query, params = client.calls[-1]
    assert query == bundled(MERGE_DOCUMENTS)
    acls = [(d["acl_allow"], d["acl_deny"], d["acl_restricted"]) for d in params["docs"]]
    assert acls == [
        (["group:hr"], ["group:c"], True),
        (["*"], [], None),  # an open document has no acl_restricted property
        (["*"], [], None),  # an empty allow list is open, stored as such
    ]


@pytest.mark.parametrize("rows, hidden", [([], False), ([["hr.md"]], True)])
async def test_acl_hidden_asks_one_row_in_the_scope(rows, hidden):
    client = RecordingClient(rows)
    scope = GraphScope("dao_a", ("public",), acl_principals=("*", "user:bob"))
    assert await graph_with(client).acl_hidden(scope) is hidden
    query, params = client.calls[-1]
    # The gateway's own read: its parameters in one map (one Neo4j plan for all callers).
    assert query == bundled(ACL_HIDDEN) and list(params) == ["p"]
    params = params["p"]
    assert params["acl_principals"] == ["*", "user:bob"]
    assert params["team_id"] == "dao_a" and params["visibilities"] == ["public"]


# --- over HTTP: intents filtered, caller Cypher refused ----------------------------------


@pytest.fixture
def gw():
    return build_gateway(policy=TENANCY_POLICY)


def owner(**overrides: Any) -> dict[str, str]:
    """An owner of dao_a whom no project or skill policy restricts (may send Cypher)."""
    tok = mint(
        claims(
            teams={"dao_a": ["owner"]},
            groups=["ops", "board"],
            permissions=["skill:read"],
            **overrides,
        )
    )
    return {"authorization": f"Bearer {tok}"}


def member(groups: list[str]) -> dict[str, str]:
    tok = mint(claims(sub="bob", teams={"dao_a": ["member"]}, groups=groups))
    return {"authorization": f"Bearer {tok}"}


CYPHER = {"team_id": "dao_a", "cypher": "MATCH (d:Doc) WHERE d.team_id = $team_id RETURN d"}


def test_caller_cypher_is_refused_when_the_acl_hides_a_document(gw):
    graph = gw.services.backends.graph
    graph.hidden = True
    graph.results["cypher"] = {"columns": ["n"], "rows": [[1]]}
    r = gw.client.post("/graph/query", json=CYPHER, headers=owner())
    assert r.status_code == 403, r.text
    assert r.json()["reason"] == "cypher_restricted_by_policy"
    assert "access lists" in r.json()["message"]
    assert [name for name, _, _ in graph.calls] == ["acl_hidden"]
    scope = graph.calls[-1][2]
    assert scope.team_id == "dao_a" and scope.acl_principals == (
        "*",
        "user:alice",
        "group:board",
        "group:ops",
    )
    gw.services.recorder.log.flush()
    rows = gw.services.recorder.log.query(team_id="dao_a", limit=10)
    assert ("deny", "cypher_restricted_by_policy") in {(r["decision"], r["reason"]) for r in rows}


def test_caller_cypher_runs_when_the_caller_sees_every_document(gw):
    graph = gw.services.backends.graph
    graph.results["cypher"] = {"columns": ["n"], "rows": [[1]]}
    r = gw.client.post("/graph/query", json=CYPHER, headers=owner())
    assert r.status_code == 200, r.text
    assert r.json()["rows"] == [{"n": 1}]
    assert [name for name, _, _ in graph.calls] == ["acl_hidden", "cypher"]


def test_the_acl_check_comes_after_the_role_check(gw):
    gw.services.backends.graph.hidden = True
    r = gw.client.post("/graph/query", json=CYPHER, headers=member([]))
    assert r.status_code == 403 and r.json()["reason"] == "cypher_not_granted"
    assert not gw.services.backends.graph.calls


@pytest.mark.parametrize("groups, kept", [([], 0), (["hr"], 1), (["hr", "contractors"], 0)])
def test_intent_rows_with_an_acld_doc_are_filtered(gw, groups, kept):
    gw.services.backends.graph.results["DOCS_MENTIONING_TOPIC"] = {
        "columns": ["doc"],
        "rows": [[doc_node("hr.md", **HR_ONLY)]],
    }
    r = gw.client.post(
        "/graph/query",
        json={"team_id": "dao_a", "intent": "DOCS_MENTIONING_TOPIC", "args": {"topic": "x"}},
        headers=member(groups),
    )
    assert r.status_code == 200, r.text
    assert len(r.json()["rows"]) == kept and r.json()["filtered_rows"] == 1 - kept
    scope = gw.services.backends.graph.calls[-1][2]
    assert scope.acl_principals == ("*", "user:bob", *(f"group:{g}" for g in sorted(groups)))


def test_access_properties_are_removed_at_every_depth_and_cypher_naming_them_is_refused():
    from deployments.errors import Forbidden
    from serve_app.access.graph import check_cypher_names, without_access_properties

    doc = {
        "_type": "node",
        "labels": ["Doc"],
        "id": "hr.md",
        "acl_allow": ["group:hr"],
        "acl_deny": ["group:contractors"],
        "acl_restricted": True,
    }
    value = [{"d": doc, "p": {"nodes": [doc], "props": {"acl_allow": ["user:alice"], "x": 1}}}]
    assert without_access_properties(value) == [
        {
            "d": {"_type": "node", "labels": ["Doc"], "id": "hr.md"},
            "p": {
                "nodes": [{"_type": "node", "labels": ["Doc"], "id": "hr.md"}],
                "props": {"x": 1},
            },
        }
    ]
    assert doc["acl_allow"] == ["group:hr"]  # the checks' input is left as it was
    check_cypher_names("MATCH (d:Doc) RETURN d.title")
    for cypher in ("RETURN d.acl_allow", "WHERE x IN d.Acl_Deny", "RETURN d.`acl_restricted`"):
        with pytest.raises(Forbidden):
            check_cypher_names(cypher)
