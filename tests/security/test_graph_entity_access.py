"""Issue 32's two reproductions, over HTTP against the real Neo4j (the in-process gateway of
tests/security/graph_gateway.py, JWT callers):

1. the entities an ACL'd document makes (its tags, channel and author) reach no caller its
   ACL excludes — not in graph-boosted search, not in any intent, not as an explain_path end
   (answered exactly like a name that does not exist) — before and after the ACL changes,
   and they go with the last document naming them;
2. a writer without the confidential grant cannot declassify a confidential entity through
   a relationship (403, the node untouched), a relationship never changes its ends, and
   every visibility change is audited.
"""

from __future__ import annotations

import functools
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from deployments.graph_store.intents import INTENTS
from serve_app.testing import claims, isolated_env, jwt_auth, mint
from tests.security.graph_gateway import GraphGateway

pytestmark = pytest.mark.integration

CANARIES = ("salary-layoffs-q3", "ch-restructuring", "ceo-jane")


@pytest.fixture
def gw(settings):  # noqa: F811 (the integration conftest's settings fixture)
    with (
        tempfile.TemporaryDirectory(prefix="graph_access_") as tmp,
        isolated_env(f"sqlite:///{Path(tmp) / 'audit.db'}"),
    ):
        gateway = GraphGateway(jwt_auth(), None, settings.neo4j)
        try:
            yield gateway
        finally:
            gateway.close()


@pytest.fixture
def team(gw):
    team = f"dao_ea_{uuid.uuid4().hex[:8]}"
    yield team
    gw.client.portal.call(
        functools.partial(
            gw.graph.client.run, "MATCH (n {team_id: $t}) DETACH DELETE n", {"t": team}, write=True
        )
    )


def headers(team: str, *roles: str, groups: tuple[str, ...] = (), sub: str = "bob") -> dict:
    token = mint(claims(sub=sub, teams={team: list(roles)}, groups=list(groups)))
    return {"authorization": f"Bearer {token}"}


def ingest(gw, team: str, acl: dict[str, Any] | None, doc_id: str = "restructuring.md") -> None:
    doc = {
        "team_id": team,
        "doc_id": doc_id,
        "title": "Restructuring plan",
        "text": "Salary review notes for the restructuring; the ceo signs off in Q3.",
        "tags": ["salary-layoffs-q3"],
        "channel_id": "ch-restructuring",
        "author_id": "ceo-jane",
        **({"acl": acl} if acl is not None else {}),
    }
    r = gw.post("/ingest/documents", {"documents": [doc]}, headers(team, "owner"))
    assert r.status_code == 200 and not r.json().get("degraded"), r.text


def answers(gw, team: str, caller: dict) -> dict[str, str]:
    """Every graph answer a caller can ask about the canaries, by path."""
    out: dict[str, str] = {}
    for query in ("salary review notes", "ceo restructuring", " ".join(CANARIES)):
        r = gw.post(
            "/rag/search_docs",
            {"team_id": team, "query": query, "graph": {"mode": "boost"}},
            caller,
        )
        assert r.status_code == 200, r.text
        out[f"search {query}"] = r.text
    for name in INTENTS:
        args_model = INTENTS[name].args
        for canary in CANARIES:
            args = {f: canary for f in args_model.model_fields if f not in ("limit", "role")}
            r = gw.post("/graph/query", {"team_id": team, "intent": name, "args": args}, caller)
            assert r.status_code == 200, r.text
            out[f"{name} {canary}"] = r.text
    return out


def explain(gw, team: str, caller: dict, source: str, target: str) -> Any:
    return gw.post("/graph/explain_path", {"team_id": team, "from": source, "to": target}, caller)


def test_entities_of_an_acld_document_reach_only_callers_it_admits(gw, team):
    ingest(gw, team, {"allowed_groups": ["hr"]})
    outsider = headers(team, "member")
    insider = headers(team, "member", groups=("hr",))

    for path, text in answers(gw, team, outsider).items():
        assert not any(c in text for c in CANARIES), (path, text[:500])
    # An end the caller may not see is answered like one that does not exist.
    hidden = explain(gw, team, outsider, "ceo-jane", "salary-layoffs-q3")
    absent = explain(gw, team, outsider, "ceo-nobody", "salary-layoffs-q3")
    assert hidden.status_code == absent.status_code == 404
    assert hidden.json()["message"].replace("ceo-jane", "?") == absent.json()["message"].replace(
        "ceo-nobody", "?"
    )

    # The caller the ACL admits finds them all.
    seen = "\n".join(answers(gw, team, insider).values())
    assert all(c in seen for c in CANARIES)
    r = explain(gw, team, insider, "ceo-jane", "salary-layoffs-q3")
    assert r.status_code == 200 and r.json()["paths"], r.text

    # Opening the document opens its entities; deleting it removes them for everyone.
    ingest(gw, team, None)
    assert explain(gw, team, outsider, "ceo-jane", "ch-restructuring").status_code == 200
    ingest(gw, team, {"allowed_groups": ["hr"], "denied_groups": ["contractors"]})
    assert explain(gw, team, outsider, "ceo-jane", "ch-restructuring").status_code == 404
    r = gw.post(
        "/ingest/events",
        {
            "events": [
                {
                    "event_id": uuid.uuid4().hex,
                    "ts": int(time.time()),
                    "domain": "doc",
                    "type": "doc.deleted",
                    "version": "1.0",
                    "actor": {"id": "u_owner", "kind": "user"},
                    "payload": {"doc_id": "restructuring.md", "doc_type": "doc"},
                    "meta": {"team_id": team, "trace_id": "tr-delete"},
                }
            ]
        },
        headers(team, "owner"),
    )
    assert r.status_code in (200, 202), r.text
    for caller in (outsider, insider):
        for path, text in answers(gw, team, caller).items():
            assert not any(c in text for c in CANARIES), (path, text[:500])


def test_the_last_open_document_takes_the_entities_it_opened(gw, team):
    ingest(gw, team, None, doc_id="open.md")
    ingest(gw, team, {"allowed_groups": ["hr"]}, doc_id="closed.md")
    outsider = headers(team, "member")
    assert explain(gw, team, outsider, "ceo-jane", "salary-layoffs-q3").status_code == 200
    # The open document goes: what it opened is seen only through the closed one now.
    ingest(gw, team, {"allowed_users": ["alice"]}, doc_id="open.md")
    assert explain(gw, team, outsider, "ceo-jane", "salary-layoffs-q3").status_code == 404
    alice = headers(team, "member", sub="alice")
    assert explain(gw, team, alice, "ceo-jane", "salary-layoffs-q3").status_code == 200


def test_a_writer_without_the_grant_cannot_declassify_through_a_relationship(gw, team):
    owner = headers(team, "owner")
    r = gw.post(
        "/graph/entities",
        {
            "team_id": team,
            "mode": "confidential",
            "nodes": [
                {
                    "label": "Resource",
                    "id": "vault",
                    "name": "SECRETNAME-merger-acme",
                    "visibility": "confidential",
                }
            ],
        },
        owner,
    )
    assert r.status_code == 200, r.text
    before = node(gw, team, "Resource", "vault")

    attack = {
        "team_id": team,
        "nodes": [{"label": "User", "id": "mallory", "visibility": "public"}],
        "relationships": [
            {
                "type": "USES",
                "from": {"label": "User", "id": "mallory"},
                "to": {"label": "Resource", "id": "vault"},
                "visibility": "public",
            }
        ],
    }
    r = gw.post("/graph/entities", attack, headers(team, "service"))
    assert r.status_code == 403, r.text
    assert r.json()["reason"] == "entity_out_of_reach"
    assert node(gw, team, "Resource", "vault") == before
    assert node(gw, team, "User", "mallory") is None  # nothing of the write landed

    member = headers(team, "member")
    r = gw.post(
        "/graph/query",
        {"team_id": team, "intent": "ENTITY_NEIGHBOURS", "args": {"entity": "mallory"}},
        member,
    )
    assert r.status_code == 200 and "SECRETNAME" not in r.text, r.text

    # A writer who may see it links to it; the relationship changes nothing of its ends and
    # is not visible to whom one end is not.
    r = gw.post("/graph/entities", {**attack, "mode": "confidential"}, owner)
    assert r.status_code == 200, r.text
    assert node(gw, team, "Resource", "vault") == before
    for entity in ("mallory", "vault", "SECRETNAME-merger-acme"):
        r = gw.post(
            "/graph/query",
            {"team_id": team, "intent": "ENTITY_NEIGHBOURS", "args": {"entity": entity}},
            member,
        )
        assert r.status_code == 200 and "SECRETNAME" not in r.text and "vault" not in r.text

    # Declassifying is an explicit write of the node, audited.
    r = gw.post(
        "/graph/entities",
        {
            "team_id": team,
            "mode": "confidential",
            "nodes": [{"label": "Resource", "id": "vault", "visibility": "public"}],
        },
        owner,
    )
    assert r.status_code == 200, r.text
    assert r.json()["visibility_changes"] == [
        {
            "label": "Resource",
            "id": "vault",
            "type": None,
            "from_id": None,
            "to_id": None,
            "before": "confidential",
            "after": "public",
            "was_derived": False,
        }
    ]
    gw.services.recorder.log.flush()
    rows = gw.services.recorder.log.query(team_id=team, limit=50)
    changes = [r for r in rows if r["action"] == "graph.visibility"]
    assert [(c["resource"], c["reason"]) for c in changes] == [
        (f"team:{team}/entity:Resource:vault", "visibility:confidential->public")
    ]


def test_a_writer_cannot_overwrite_an_entity_only_hidden_documents_made(gw, team):
    ingest(gw, team, {"allowed_groups": ["hr"]})
    write = {
        "team_id": team,
        "nodes": [{"label": "Topic", "id": "salary-layoffs-q3", "visibility": "public"}],
    }
    r = gw.post("/graph/entities", write, headers(team, "service"))
    assert r.status_code == 403 and r.json()["reason"] == "entity_out_of_reach", r.text
    assert node(gw, team, "Topic", "salary-layoffs-q3")["derived"] is True
    # A writer its document admits may make it an entity of its own (audited).
    r = gw.post("/graph/entities", write, headers(team, "service", groups=("hr",)))
    assert r.status_code == 200, r.text
    assert r.json()["visibility_changes"][0]["was_derived"] is True
    r = explain(gw, team, headers(team, "member"), "salary-layoffs-q3", "restructuring.md")
    assert r.status_code != 500


def node(gw, team: str, label: str, ident: str) -> dict[str, Any] | None:
    rows = gw.client.portal.call(
        gw.graph.client.run,
        f"MATCH (n:{label} {{team_id: $t, id: $i}}) RETURN properties(n) AS p",
        {"t": team, "i": ident},
    )
    return rows[0]["p"] if rows else None


async def test_the_tool_route_mcp_and_enrich_hide_them_too(settings):
    """The agent doors: POST /tools/{function}, the MCP server (SDK client) and enrich."""
    from batch_ingest.chunking import whitespace_tokens
    from deployments.graph_store.store import Neo4jGraph
    from deployments.protocols import Backends
    from deployments.testing.fakes import FakeEmbedder, FakeVectorStore
    from serve_app.asgi import create_app
    from serve_app.composition import build_services
    from serve_app.settings import GatewaySettings
    from tests.unit.serve_app.tools.test_mcp import mcp, running

    team = f"dao_ea_{uuid.uuid4().hex[:8]}"
    with (
        tempfile.TemporaryDirectory(prefix="graph_access_") as tmp,
        isolated_env(f"sqlite:///{Path(tmp) / 'audit.db'}"),
    ):
        gs = GatewaySettings(environment="test", auth=jwt_auth(), neo4j=settings.neo4j)
        graph = Neo4jGraph(gs.neo4j)
        services = build_services(
            gs,
            Backends(embedder=FakeEmbedder(dim=32), store=FakeVectorStore(), graph=graph),
            count_tokens=whitespace_tokens,
        )
        app = create_app(services)
        owner, outsider, insider = (
            mint(claims(sub="bob", teams={team: [role]}, groups=list(groups)))
            for role, groups in (("owner", ()), ("member", ()), ("member", ("hr",)))
        )
        try:
            async with running(app) as http:
                doc = {
                    "team_id": team,
                    "doc_id": "restructuring.md",
                    "title": "Restructuring plan",
                    "text": "Salary review notes for the restructuring.",
                    "tags": ["salary-layoffs-q3"],
                    "channel_id": "ch-restructuring",
                    "author_id": "ceo-jane",
                    "acl": {"allowed_groups": ["hr"]},
                }
                r = await http.post(
                    "/ingest/documents",
                    json={"documents": [doc]},
                    headers={"authorization": f"Bearer {owner}"},
                )
                assert r.status_code == 200, r.text
                for tok, sees in ((outsider, False), (insider, True)):
                    r = await http.post(
                        "/tools/graph_explain_path",
                        json={"from": "ceo-jane", "to": "salary-layoffs-q3"},
                        headers={"authorization": f"Bearer {tok}"},
                    )
                    assert (r.status_code == 200) is sees, r.text
                    r = await http.post(
                        "/rag/enrich_answer",
                        json={
                            "team_id": team,
                            "draft_answer": "Salary review notes for the restructuring exist.",
                        },
                        headers={"authorization": f"Bearer {tok}"},
                    )
                    assert r.status_code == 200, r.text
                    cited = {s["id"] for s in r.json()["sources"]}
                    assert ("restructuring.md" in cited) is sees, r.text
            for tok, sees in ((outsider, False), (insider, True)):
                async with mcp(app, tok) as client:
                    path = await client.call_tool(
                        "graph_explain_path", {"from": "ceo-jane", "to": "ch-restructuring"}
                    )
                    assert path.is_error is not sees, path.content[0].text
                    for canary in CANARIES:
                        result = await client.call_tool(
                            "graph_query_context",
                            {"intent": "ENTITY_NEIGHBOURS", "args": {"entity": canary}},
                        )
                        text = result.content[0].text
                        assert not result.is_error, text
                        assert bool(result.structured_content["rows"]) is sees, text
                        if not sees:
                            others = [c for c in CANARIES if c != canary]
                            assert not any(c in text for c in others), text
        finally:
            await graph.client.run(
                "MATCH (n {team_id: $t}) DETACH DELETE n", {"t": team}, write=True
            )
            await graph.close()


async def test_a_graph_written_before_derived_is_marked_at_start(graph):
    """Nodes of an older gateway (no ``derived``): a topic only an ACL'd document names
    becomes derived (hidden from whom the ACL excludes), a resource written directly keeps
    its visibility; marked in batches, once."""
    from deployments.protocols import GraphScope

    team = f"dao_ea_{uuid.uuid4().hex[:8]}"
    await graph.client.run(
        """
        CREATE (d:Doc {team_id: $t, id: 'hr.md', title: 'HR', visibility: 'public',
                       acl_allow: ['group:hr'], acl_deny: [], acl_restricted: true})
        CREATE (d)-[:MENTIONS {team_id: $t, visibility: 'public'}]->
               (:Topic {team_id: $t, id: 'old-secret-topic', name: 'old-secret-topic',
                        visibility: 'public'})
        CREATE (:Resource {team_id: $t, id: 'old-resource', name: 'old-resource',
                           visibility: 'public'})
        CREATE (:Doc {team_id: $t, id: 'wiki:gone', title: 'gone', stub: true,
                      visibility: 'public'})
        """,
        {"t": team},
        write=True,
    )
    try:
        await graph.client._mark_derived(batch=2)
        rows = await graph.client.run(
            "MATCH (n {team_id: $t}) RETURN n.id AS id, n.derived AS derived", {"t": team}
        )
        assert {r["id"]: r["derived"] for r in rows} == {
            "hr.md": False,
            "old-secret-topic": True,
            "old-resource": False,
            # A placeholder no document links to any more is gone.
        }
        outsider = GraphScope(team, ("public",))
        found = await graph.related_docs("old-secret-topic old-resource", outsider, 10, 10)
        assert {e["node"]["id"] for e in found["entities"]} == {"old-resource"}
    finally:
        await graph.client.run("MATCH (n {team_id: $t}) DETACH DELETE n", {"t": team}, write=True)


async def test_the_store_never_writes_a_document_or_an_edge_to_one(graph):
    """Every edge at a Doc comes from ingestion (the intents rely on it), whoever calls."""
    from deployments.errors import InvalidInput
    from deployments.protocols import GraphScope

    scope = GraphScope("dao_ea_nowhere", ("public", "confidential"))
    node = {"label": "Doc", "id": "x", "name": "x", "visibility": "public", "properties": {}}
    with pytest.raises(InvalidInput):
        await graph.upsert_entities("dao_ea_nowhere", [node], [], scope)
    rel = {
        "type": "MENTIONS",
        "from_label": "Doc",
        "from_id": "d",
        "to_label": "Topic",
        "to_id": "t",
        "visibility": "public",
        "properties": {},
    }
    with pytest.raises(InvalidInput):
        await graph.upsert_entities("dao_ea_nowhere", [], [rel], scope)


def test_graph_answers_never_carry_access_lists(gw, team):
    """Issue 38, item 6: the document's access list (its tokens name subjects and groups) is
    read by the gateway's checks, never returned: not by any intent, not in an explain_path
    node or path, not through caller Cypher."""
    ingest(gw, team, {"allowed_groups": ["hr"], "denied_groups": ["contractors"]})
    insider = headers(team, "owner", groups=("hr",))
    texts = dict(answers(gw, team, insider))
    for source, target in (("ceo-jane", "salary-layoffs-q3"), ("ceo-jane", "ch-restructuring")):
        r = explain(gw, team, insider, source, target)
        assert r.status_code == 200 and r.json()["paths"], r.text
        texts[f"explain {source} {target}"] = r.text
    # Cypher from an owner who sees the whole team: a whole node, and its properties as a map.
    for cypher in (
        "MATCH (d:Doc {team_id: $team_id}) RETURN d",
        "MATCH (d:Doc {team_id: $team_id}) RETURN properties(d) AS p",
    ):
        r = gw.post("/graph/query", {"team_id": team, "cypher": cypher}, insider)
        assert r.status_code == 200, r.text
        assert r.json()["rows"], r.text
        texts[cypher] = r.text
    for path, text in texts.items():
        for leaked in ("acl_allow", "acl_deny", "acl_restricted", "group:hr", "group:contractors"):
            assert leaked not in text, (path, leaked, text[:500])
    # Naming the properties is refused outright (a plain list would carry the tokens).
    for cypher in (
        "MATCH (d:Doc {team_id: $team_id}) RETURN d.acl_allow AS a",
        "MATCH (d:Doc {team_id: $team_id}) WHERE 'group:hr' IN d.ACL_DENY RETURN d.id",
    ):
        r = gw.post("/graph/query", {"team_id": team, "cypher": cypher}, insider)
        assert r.status_code == 403, r.text
        assert r.json()["reason"] == "cypher_reads_access_lists", r.text
