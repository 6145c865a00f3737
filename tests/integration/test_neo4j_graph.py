"""Neo4jGraph against the real Neo4j 5.26 server (no fake graph store)."""

from __future__ import annotations

import uuid

import pytest

from deployments.config import Neo4jSettings
from deployments.graph_store.store import Neo4jGraph
from deployments.protocols import GraphDocument

pytestmark = pytest.mark.integration


@pytest.fixture
async def team(graph: Neo4jGraph):
    team = f"team_{uuid.uuid4().hex[:8]}"
    yield team
    await graph.client.run("MATCH (n {team_id: $t}) DETACH DELETE n", {"t": team}, write=True)


def doc(team: str, doc_id: str, visibility: str = "public", **kw) -> GraphDocument:
    return GraphDocument(
        team_id=team,
        doc_id=doc_id,
        title=f"Title {doc_id}",
        visibility=visibility,
        doc_type="doc",
        **kw,
    )


async def counts(graph: Neo4jGraph, team: str) -> tuple[int, int]:
    nodes = await graph.client.run("MATCH (n {team_id: $t}) RETURN count(n) AS c", {"t": team})
    rels = await graph.client.run(
        "MATCH ()-[r {team_id: $t}]->() RETURN count(r) AS c", {"t": team}
    )
    return nodes[0]["c"], rels[0]["c"]


async def test_merge_twice_creates_no_duplicates(graph: Neo4jGraph, team: str):
    d = doc(team, "d1", project_id="p1", channel_id="c1", agent_id="a1", tags=("milvus", "rag"))
    await graph.merge_documents([d])
    first = await counts(graph, team)
    await graph.merge_documents([d, d])
    assert await counts(graph, team) == first
    # MicroDAO, Doc, Project, Channel, Agent, 2 Topics; PART_OF, POSTED_IN, AUTHORED, 2 MENTIONS
    assert first == (7, 5)


async def test_every_node_and_relationship_carries_tenant_and_visibility(graph, team):
    await graph.merge_documents([doc(team, "d1", "confidential", project_id="p", tags=("t",))])
    missing = await graph.client.run(
        "MATCH (n {team_id: $t}) WHERE n.visibility IS NULL RETURN count(n) AS c", {"t": team}
    )
    assert missing[0]["c"] == 0
    rels = await graph.client.run(
        "MATCH ()-[r {team_id: $t}]->() RETURN collect(DISTINCT r.visibility) AS v", {"t": team}
    )
    assert rels[0]["v"] == ["confidential"]


async def test_entity_becomes_public_only_when_a_public_doc_names_it(graph, team):
    await graph.merge_documents([doc(team, "secret", "confidential", project_id="p1")])
    vis = await graph.client.run(
        "MATCH (p:Project {team_id: $t, id: 'p1'}) RETURN p.visibility AS v", {"t": team}
    )
    assert vis[0]["v"] == "confidential"
    await graph.merge_documents([doc(team, "open", "public", project_id="p1")])
    vis = await graph.client.run(
        "MATCH (p:Project {team_id: $t, id: 'p1'}) RETURN p.visibility AS v", {"t": team}
    )
    assert vis[0]["v"] == "public"


async def test_same_ids_in_two_teams_stay_separate(graph, team):
    other = team + "_b"
    try:
        await graph.merge_documents(
            [doc(team, "d1", project_id="p"), doc(other, "d1", project_id="p")]
        )
        rows = await graph.client.run(
            "MATCH (d:Doc {id: 'd1'})-[:PART_OF]->(p:Project) WHERE d.team_id IN [$a, $b] "
            "RETURN d.team_id AS dt, p.team_id AS pt ORDER BY dt",
            {"a": team, "b": other},
        )
        assert [(r["dt"], r["pt"]) for r in rows] == [(team, team), (other, other)]
    finally:
        await graph.client.run("MATCH (n {team_id: $t}) DETACH DELETE n", {"t": other}, write=True)


async def test_schema_constraints_exist(graph: Neo4jGraph):
    rows = await graph.client.run("SHOW CONSTRAINTS YIELD name RETURN collect(name) AS names")
    assert {"doc_team_id", "project_team_id", "topic_team_id"} <= set(rows[0]["names"])


async def test_every_doc_stores_its_access_list(graph: Neo4jGraph, team: str):
    await graph.merge_documents(
        [
            doc(team, "open"),
            doc(team, "hr", acl_allow=("group:hr", "user:alice"), acl_deny=("group:temps",)),
        ]
    )
    rows = await graph.client.run(
        "MATCH (d:Doc {team_id: $t}) RETURN d.id AS id, d.acl_allow AS allow, "
        "d.acl_deny AS deny, d.acl_restricted AS restricted ORDER BY id",
        {"t": team},
    )
    assert rows == [
        {
            "id": "hr",
            "allow": ["group:hr", "user:alice"],
            "deny": ["group:temps"],
            "restricted": True,
        },
        {"id": "open", "allow": ["*"], "deny": [], "restricted": None},
    ]
    indexes = await graph.client.run("SHOW INDEXES YIELD name RETURN collect(name) AS names")
    assert "doc_acl_restricted" in indexes[0]["names"]


async def test_unreachable_neo4j_reports_not_ready():
    graph = Neo4jGraph(Neo4jSettings(uri="bolt://127.0.0.1:1", timeout_s=1))
    status = await graph.status()
    assert status["ready"] is False and "127.0.0.1:1" in status["error"]
