"""Intents, caller Cypher, explain_path, graph-scoped document lookup and wiki-links against
the real Neo4j 5.26 server (no fake graph store)."""

from __future__ import annotations

import uuid

import pytest

from batch_ingest.wikilinks import extract_links, wiki_key
from deployments.config import Neo4jSettings
from deployments.errors import (
    BackendUnavailable,
    Forbidden,
    InvalidInput,
    InvalidQuery,
    NotFound,
    QueryLimitExceeded,
)
from deployments.graph_store.guard import CypherRejected, check_plan, check_query_type
from deployments.graph_store.intents import INTENTS
from deployments.graph_store.params import bound, bundled, flat_plan
from deployments.graph_store.scope import scope_query
from deployments.graph_store.store import Neo4jGraph
from deployments.graph_store.warmup import own_reads, warm_plans
from deployments.protocols import GraphDocument, GraphScope
from serve_app.graph.text import path_sentence

pytestmark = pytest.mark.integration


def gdoc(team, doc_id, title, visibility="public", text="", **kw) -> GraphDocument:
    return GraphDocument(
        team_id=team,
        doc_id=doc_id,
        title=title,
        visibility=visibility,
        doc_type=kw.pop("doc_type", "wiki"),
        links=extract_links(text),
        wiki_id=wiki_key(doc_id),
        wiki_title=wiki_key(title),
        **kw,
    )


def rel(kind, fl, fi, tl, ti, visibility="public", **props):
    return {
        "type": kind,
        "from_label": fl,
        "from_id": fi,
        "to_label": tl,
        "to_id": ti,
        "visibility": visibility,
        "properties": props,
    }


async def build(graph: Neo4jGraph, team: str) -> None:
    """A small tenant: two projects, a confidential one, wiki notes with links, members."""
    await graph.merge_documents(
        [
            gdoc(
                team,
                "tools/kubectl.md",
                "Kubectl",
                text="see [[debugging]] and [[Runbook]]",
                project_id="poimen",
                tags=("kubernetes",),
                author_id="alice",
            ),
            gdoc(
                team,
                "debugging.md",
                "Debugging",
                project_id="poimen",
                tags=("kubernetes", "milvus"),
                author_id="bob",
            ),
            gdoc(
                team,
                "atlas-plan.md",
                "Atlas plan",
                "confidential",
                project_id="atlas",
                tags=("milvus",),
                author_id="carol",
                agent_id="ag_secret",
            ),
            gdoc(
                team,
                "search.md",
                "Search notes",
                project_id="helios",
                tags=("milvus",),
                author_id="alice",
                channel_id="ch_general",
            ),
        ]
    )
    await graph.upsert_entities(
        team,
        [
            {
                "label": "Resource",
                "id": "milvus",
                "name": "Milvus",
                "visibility": "public",
                "properties": {"kind": "vector-db"},
            }
        ],
        [
            rel("USES", "Project", "poimen", "Resource", "milvus"),
            rel("USES", "Project", "helios", "Resource", "milvus"),
            rel("USES", "Project", "atlas", "Resource", "milvus", "confidential"),
            rel("MEMBER_OF", "User", "alice", "MicroDAO", team, role="guardian"),
            rel("MEMBER_OF", "User", "bob", "MicroDAO", team, role="member"),
            rel("SERVES", "Agent", "ag_helper", "Project", "poimen"),
        ],
        GraphScope(team, ("public", "confidential")),
    )


@pytest.fixture
async def team(graph: Neo4jGraph):
    team = f"gq_{uuid.uuid4().hex[:8]}"
    other = team + "_other"
    await build(graph, team)
    await build(graph, other)  # same ids, another tenant
    yield team
    for t in (team, other):
        await graph.client.run("MATCH (n {team_id: $t}) DETACH DELETE n", {"t": t}, write=True)


def public(team):
    return GraphScope(team, ("public",))


def everything(team):
    return GraphScope(team, ("public", "confidential"))


def ids(values) -> set[str]:
    return {v["id"] for v in values}


def entities(value):
    if isinstance(value, dict):
        if value.get("_type") in ("node", "relationship"):
            yield value
        for v in value.values():
            yield from entities(v)
    elif isinstance(value, list):
        for v in value:
            yield from entities(v)


@pytest.mark.parametrize("name", sorted(INTENTS))
@pytest.mark.parametrize("restrict", [True, False])
async def test_every_intent_passes_the_cypher_guard(graph: Neo4jGraph, name, restrict):
    intent = INTENTS[name]
    args = intent.args.model_validate(intent.example).model_dump()
    scope = public("t") if restrict else everything("t")
    # The text as it runs (its parameters in one map), checked with the caller-Cypher guard.
    summary = await graph.client.explain(bundled(intent.cypher), bound({**args, **scope.params}))
    check_query_type(summary.query_type)
    check_plan(flat_plan(summary.plan), restrict_visibility=restrict)


async def test_the_gateways_own_reads_are_planned_ahead_on_the_server(graph: Neo4jGraph):
    # Each statement the Graph replica plans at start compiles with the warm-up's parameters.
    assert await warm_plans(graph.client) == len(own_reads())


@pytest.mark.parametrize("name", sorted(INTENTS))
async def test_intents_return_only_the_scope(graph: Neo4jGraph, team, name):
    intent = INTENTS[name]
    args = {**intent.example}
    for key, value in (
        ("tech", "Milvus"),
        ("project", "poimen"),
        ("topic", "milvus"),
        ("doc", "Kubectl"),
        ("entity", "Milvus"),
        ("channel", "ch_general"),
    ):
        if key in args:
            args[key] = value
    args = intent.args.model_validate(
        {k: v for k, v in args.items() if k not in ("role", "target")}
    ).model_dump()
    for scope in (public(team), everything(team)):
        result = await graph.run_intent(name, args, scope)
        for entity in entities(result["rows"]):
            assert entity["team_id"] == team
            assert entity["visibility"] in scope.visibilities


async def test_intent_answers(graph: Neo4jGraph, team):
    async def rows(name, scope, **args):
        args = INTENTS[name].args.model_validate(args).model_dump()
        return (await graph.run_intent(name, args, scope))["rows"]

    found = await rows("FIND_PROJECTS_BY_TECH", public(team), tech="milvus")
    assert ids(r[0] for r in found) == {"poimen", "helios"}
    found = await rows("FIND_PROJECTS_BY_TECH", everything(team), tech="MILVUS")
    assert ids(r[0] for r in found) == {"poimen", "helios", "atlas"}
    members = await rows("MEMBERS_OF_DAO", public(team))
    assert {(m["id"], role) for m, role in members} == {("alice", "guardian"), ("bob", "member")}
    assert ids(r[0] for r in await rows("MEMBERS_OF_DAO", public(team), role="member")) == {"bob"}
    assert ids(r[0] for r in await rows("AGENTS_SERVING", public(team), target="poimen")) == {
        "ag_helper"
    }
    docs = await rows("DOCS_MENTIONING_TOPIC", public(team), topic="milvus")
    assert ids(r[0] for r in docs) == {"debugging.md", "search.md"}
    res = await rows("RESOURCES_USED_BY_PROJECT", public(team), project="helios")
    assert ids(r[0] for r in res) == {"milvus"}
    topics = await rows("TOPICS_OF_CHANNEL", public(team), channel="ch_general")
    assert [(t["id"], n) for t, n in topics] == [("milvus", 1)]
    experts = await rows("EXPERTS_ON_TOPIC", public(team), topic="milvus")
    assert {(e["id"], n) for e, n in experts} == {("bob", 1), ("alice", 1)}
    experts = await rows("EXPERTS_ON_TOPIC", everything(team), topic="milvus")
    assert {e["id"] for e, _ in experts} == {"bob", "alice", "carol", "ag_secret"}
    related = await rows("RELATED_PROJECTS", public(team), project="poimen")
    assert {r[0]["id"] for r in related} == {"helios"}
    linked = await rows("LINKED_DOCS", public(team), doc="Kubectl")
    # A link to a note not ingested yet shows as its placeholder.
    assert {(d, x["id"], x["stub"]) for d, x in linked} == {
        ("links_to", "debugging.md", False),
        ("links_to", "wiki:runbook", True),
    }
    neighbours = await rows("ENTITY_NEIGHBOURS", public(team), entity="Milvus")
    assert {n[3]["id"] for n in neighbours} >= {"poimen", "helios"}
    assert "atlas" not in {n[3]["id"] for n in neighbours}


SAFE = [
    "MATCH (p:Project)-[:USES]->(r:Resource) WHERE p.team_id = $team_id RETURN p.id AS id",
    "MATCH (d:Doc)-[:MENTIONS]->(t:Topic) WHERE t.team_id = $team_id "
    "RETURN t.id AS id, count(d) AS n",
    "MATCH (p:Project {team_id: $team_id}) OPTIONAL MATCH (p)<-[:PART_OF]-(d:Doc) "
    "RETURN p.id AS id, collect(d.id) AS docs",
    "CALL db.index.fulltext.queryNodes('entity_names', 'milvus') YIELD node, score "
    "WHERE node.team_id = $team_id RETURN node.id AS id",
]


@pytest.mark.parametrize("query", SAFE)
async def test_scoped_cypher_runs_and_stays_in_the_team(graph: Neo4jGraph, team, query):
    result = await graph.run_cypher(query, {}, everything(team))
    assert result["rows"]
    for row in result["rows"]:
        assert row[0] in {"poimen", "helios", "atlas", "milvus", "kubernetes", "Milvus"} | {
            "debugging.md",
            "tools/kubectl.md",
            "atlas-plan.md",
            "search.md",
        }


async def test_public_scope_cypher_needs_visibility_predicates(graph: Neo4jGraph, team):
    scoped = (
        "MATCH (p:Project)-[u:USES]->(r:Resource) WHERE p.team_id = $team_id "
        "AND p.visibility IN $visibilities AND u.visibility IN $visibilities "
        "AND r.visibility IN $visibilities RETURN p.id AS id"
    )
    rows = (await graph.run_cypher(scoped, {}, public(team)))["rows"]
    assert {r[0] for r in rows} == {"poimen", "helios"}
    # A query the gateway cannot scope itself (a WITH) is refused, naming what is missing.
    unscoped = (
        "MATCH (p:Project) WHERE p.team_id = $team_id WITH p "
        "MATCH (p)-[:USES]->(r:Resource) RETURN p.id AS id"
    )
    with pytest.raises(Forbidden) as err:
        await graph.run_cypher(unscoped, {}, public(team))
    assert err.value.reason == "unscoped_variable" and "visibility" in err.value.message
    # A simple one gets the visibility predicates from the gateway (SAFE[0] names none).
    rows = (await graph.run_cypher(SAFE[0], {}, public(team)))["rows"]
    assert {r[0] for r in rows} == {"poimen", "helios"}


@pytest.mark.parametrize(
    "query",
    [
        bundled(INTENTS["RELATED_PROJECTS"].cypher),
        bundled(INTENTS["DOCS_MENTIONING_TOPIC"].cypher),
        "MATCH (d:Doc) WHERE d.team_id = $p.team_id RETURN d.id AS id, d.team_id AS team",
    ],
)
async def test_caller_cypher_reading_its_own_map_cannot_name_another_team(
    graph: Neo4jGraph, team, query
):
    # The gateway's own reads take the scope from the map $p. A caller who sends such a text
    # with a map of its own naming another team gets nothing of that team: caller Cypher is
    # proven (or scoped) on the flat $team_id the gateway binds, never on $p.
    other = team + "_other"
    forged = {
        "p": {"project": "poimen", "topic": "milvus", "limit": 50, **everything(other).params}
    }
    try:
        result = await graph.run_cypher(query, forged, public(team))
    except Forbidden:
        return
    assert other not in repr(result["rows"])


# (query, reason): each must be refused before anything runs.
REFUSED = [
    ("MATCH (n) RETURN n.id", "unscoped_variable"),
    ("MATCH (p:Project) WHERE p.team_id = $team_id OR true RETURN p.id", "unscoped_variable"),
    (
        "MATCH (p:Project) WHERE NOT p.team_id <> $team_id OR p.id = 'x' RETURN p",
        "unscoped_variable",
    ),
    (
        "MATCH (n) WITH n AS m MATCH (n:Doc) WHERE n.team_id = $team_id RETURN m.title",
        "rebound_variable",
    ),
    (
        "MATCH (n) RETURN n.id AS id UNION "
        "MATCH (n:Doc) WHERE n.team_id = $team_id RETURN n.id AS id",
        "unscoped_variable",
    ),
    (
        "MATCH (n:Doc) WHERE n.team_id = $team_id MATCH (x:Doc) WHERE x.id = n.id RETURN x.title",
        "unscoped_variable",
    ),
    # The name of a scoped node given to an unscoped one.
    (
        "MATCH (s:Doc) WHERE s.team_id = $team_id MATCH (x) WITH x AS y, s AS x "
        "WHERE x.team_id = $team_id RETURN y.title",
        "rebound_variable",
    ),
    (
        "MATCH (s:Doc) WHERE s.team_id = $team_id MATCH (x) WITH x AS y, s AS x "
        "MATCH (x)-[r]->(b:Topic) WHERE b.team_id = $team_id RETURN y.title",
        "rebound_variable",
    ),
    (
        "MATCH (a:Project) WHERE a.team_id = $team_id MATCH (b:Project) WHERE NOT (a)--(b) "
        "RETURN b.id",
        "unscoped_variable",
    ),
    (
        "MATCH (d:Doc) WHERE d.team_id = $team_id "
        "AND EXISTS { MATCH (x:Doc {title: 'Atlas plan'}) } RETURN d.id",
        "unscoped_variable",
    ),
    (
        "MATCH (d:Doc) WHERE d.team_id = $team_id RETURN [(d)-->(x) | x.title] AS t",
        "unscoped_variable",
    ),
    (
        "CALL db.index.fulltext.queryNodes('entity_names', 'milvus') YIELD node RETURN node.id",
        "unscoped_variable",
    ),
    ("MATCH (n) WHERE elementId(n) = '4:x:1' RETURN n", "unscoped_variable"),
    (
        "MATCH (d:Doc) WHERE d.team_id = $team_id RETURN COUNT { MATCH (x) } AS c",
        "unsupported_operator",
    ),
    ("CALL db.labels() YIELD label RETURN label", "procedure_not_allowed"),
    ("CALL dbms.components()", "not_read_only"),
    ("SHOW USERS", "not_read_only"),
    ("LOAD CSV FROM 'file:///etc/passwd' AS line RETURN line", "write"),
    ("CREATE (n:Project {team_id: $team_id, id: 'x'}) RETURN n", "not_read_only"),
    ("MATCH (n:Project) WHERE n.team_id = $team_id SET n.name = 'x'", "not_read_only"),
    ("MATCH (n:Project) WHERE n.team_id = $team_id DETACH DELETE n", "not_read_only"),
    ("MERGE (n:Project {team_id: $team_id, id: 'x'})", "not_read_only"),
    ("MATCH (n:Doc) WHERE n.team_id = $team_id FOREACH (x IN [1] | SET n.y = x)", "not_read_only"),
    # An optional part in the team put the rows before it in the team (every project of
    # every team came back as scalars).
    (
        "MATCH (a:Project) WITH a LIMIT 100 OPTIONAL MATCH (a)-[:USES]-(r:Resource)-[:USES]-"
        "(b:Project) WHERE r.team_id = $team_id AND b.team_id = $team_id "
        "RETURN a.id, a.team_id",
        "unscoped_variable",
    ),
    (
        "MATCH (a:Project) WITH a, 1 AS one OPTIONAL MATCH (a)-[:USES]-(r:Resource) "
        "USING INDEX r:Resource(team_id, visibility) WHERE r.team_id = $team_id "
        "AND r.visibility IN $visibilities RETURN a.team_id",
        "unscoped_variable",
    ),
    (
        "MATCH (a:Project) OPTIONAL MATCH (a)-[:USES]-(r:Resource) WHERE r.team_id = $team_id "
        "WITH a, r RETURN a.team_id",
        "unscoped_variable",
    ),
]


async def plan_check(graph: Neo4jGraph, query: str, scope: GraphScope) -> None:
    summary = await graph.client.explain(query, scope.params)
    check_query_type(summary.query_type)
    check_plan(summary.plan, restrict_visibility="confidential" not in scope.visibilities)


@pytest.mark.parametrize("query, reason", REFUSED)
async def test_unsafe_cypher_is_refused_with_a_reason(graph: Neo4jGraph, team, query, reason):
    before = await graph.client.run("MATCH (n {team_id: $t}) RETURN count(n) AS c", {"t": team})
    # The plan check refuses every one of them as written.
    with pytest.raises(CypherRejected) as refused:
        await plan_check(graph, query, everything(team))
    assert refused.value.reason == reason, refused.value.message
    scoped = scope_query(query, restrict_visibility=False)
    if scoped is None:
        with pytest.raises(Forbidden) as err:
            await graph.run_cypher(query, {}, everything(team))
        assert err.value.reason == reason, err.value.message
    else:
        # A simple read the plan check found unscoped: the gateway runs it with the scope
        # compiled in when that proves scoped, and refuses it as before when not.
        try:
            checked = await graph.check_cypher(query, {}, everything(team))
        except Forbidden as err:
            assert err.reason == reason, err.message
        else:
            assert checked["cypher"] == scoped
            result = await graph.run_cypher(query, {}, everything(team))
            for entity in entities(result["rows"]):
                assert entity["team_id"] == team
    after = await graph.client.run("MATCH (n {team_id: $t}) RETURN count(n) AS c", {"t": team})
    assert after == before


async def test_var_length_is_refused_in_public_scope_only(graph: Neo4jGraph, team):
    query = (
        "MATCH (d:Doc {team_id: $team_id, id: 'tools/kubectl.md'}) "
        "MATCH (d)-[:LINKS_TO*1..2]->(o) RETURN o.id"
    )
    rows = (await graph.run_cypher(query, {}, everything(team)))["rows"]
    assert {r[0] for r in rows} == {"debugging.md", "wiki:runbook"}
    with pytest.raises(Forbidden) as err:
        await graph.run_cypher(query, {}, public(team))
    assert err.value.reason == "var_length_in_public_scope"


async def test_syntax_error_keeps_neo4js_message(graph: Neo4jGraph, team):
    with pytest.raises(InvalidQuery) as err:
        await graph.run_cypher("MATCH (p:Project WHERE RETURN p", {}, everything(team))
    assert "Invalid input" in err.value.message and err.value.status_code == 400


async def test_row_limit_and_timeout_are_4xx(settings):
    graph = Neo4jGraph(settings.neo4j.model_copy(update={"max_rows": 10, "query_timeout_s": 1.0}))
    try:
        with pytest.raises(QueryLimitExceeded) as err:
            await graph.run_cypher("UNWIND range(1, 11) AS x RETURN x", {}, everything("t"))
        assert err.value.reason == "row_limit" and err.value.status_code == 422
        with pytest.raises(QueryLimitExceeded) as err:
            await graph.run_cypher(
                "UNWIND range(1, 200000000) AS x WITH x WHERE x < 0 RETURN count(*)",
                {},
                everything("t"),
            )
        assert err.value.reason == "timeout"
    finally:
        await graph.close()


async def test_explain_path_inside_the_scope(graph: Neo4jGraph, team):
    result = await graph.explain_path(
        {"ref": "alice"}, {"ref": "Milvus", "label": "Resource"}, public(team), 4, 5
    )
    assert result["paths"]
    for path in result["paths"]:
        for entity in [*path["nodes"], *path["relationships"]]:
            assert entity["team_id"] == team and entity["visibility"] == "public"
    sentences = [path_sentence(p) for p in result["paths"]]
    assert (
        "User 'alice' authored Doc 'Kubectl'; Doc 'Kubectl' is part of Project 'poimen'; "
        "Project 'poimen' uses Resource 'Milvus'." in sentences
    ), sentences
    # carol wrote only a confidential document: invisible in public scope.
    with pytest.raises(NotFound):
        await graph.explain_path({"ref": "carol"}, {"ref": "Milvus"}, public(team), 4, 5)
    result = await graph.explain_path({"ref": "carol"}, {"ref": "Milvus"}, everything(team), 4, 5)
    assert any("atlas" in path_sentence(p) for p in result["paths"])


async def test_explain_path_with_no_connection_is_empty(graph: Neo4jGraph, team):
    await graph.upsert_entities(
        team,
        [
            {
                "label": "Resource",
                "id": "lonely",
                "name": "Lonely",
                "visibility": "public",
                "properties": {},
            }
        ],
        [],
        public(team),
    )
    result = await graph.explain_path({"ref": "alice"}, {"ref": "lonely"}, public(team), 4, 5)
    assert result["paths"] == []


async def test_related_docs_follow_named_entities(graph: Neo4jGraph, team):
    found = await graph.related_docs("which projects use Milvus?", public(team), 5, 50)
    assert "milvus" in {e["node"]["id"] for e in found["entities"]}
    assert set(found["docs"]) >= {"debugging.md", "search.md"}
    assert "atlas-plan.md" not in found["docs"]
    found = await graph.related_docs("milvus", everything(team), 5, 50)
    assert "atlas-plan.md" in found["docs"]
    # Lucene syntax in the text is escaped, not interpreted.
    assert (await graph.related_docs('milvus" OR *:* AND -(', public(team), 5, 50))["docs"]
    assert (await graph.related_docs("   ", public(team), 5, 50)) == {"entities": [], "docs": {}}


async def test_wiki_links_resolve_late_and_follow_edits(graph: Neo4jGraph, team):
    async def links(doc_id):
        rows = await graph.client.run(
            "MATCH (:Doc {team_id: $t, id: $d})-[:LINKS_TO]->(x) RETURN x.id AS id",
            {"t": team, "d": doc_id},
        )
        return {r["id"] for r in rows}

    assert await links("tools/kubectl.md") == {"debugging.md", "wiki:runbook"}
    # The runbook arrives: the placeholder hands its links over and disappears.
    await graph.merge_documents([gdoc(team, "ops/runbook.md", "Runbook")])
    assert await links("tools/kubectl.md") == {"debugging.md", "ops/runbook.md"}
    stubs = await graph.client.run(
        "MATCH (d:Doc {team_id: $t}) WHERE d.stub RETURN count(d) AS c", {"t": team}
    )
    assert stubs[0]["c"] == 0
    # Re-sending the same note changes nothing; an edit that drops a link removes it.
    before = await graph.client.run("MATCH (n {team_id: $t}) RETURN count(n) AS c", {"t": team})
    await graph.merge_documents(
        [
            gdoc(
                team,
                "tools/kubectl.md",
                "Kubectl",
                text="see [[debugging]] and [[Runbook]]",
                project_id="poimen",
                tags=("kubernetes",),
                author_id="alice",
            )
        ]
    )
    after = await graph.client.run("MATCH (n {team_id: $t}) RETURN count(n) AS c", {"t": team})
    assert after == before
    await graph.merge_documents(
        [
            gdoc(
                team,
                "tools/kubectl.md",
                "Kubectl",
                text="only [[debugging|the debugging note]]",
                project_id="poimen",
                tags=("kubernetes",),
                author_id="alice",
            )
        ]
    )
    assert await links("tools/kubectl.md") == {"debugging.md"}


async def test_upsert_is_idempotent(graph: Neo4jGraph, team):
    async def count():
        rows = await graph.client.run(
            "MATCH (n {team_id: $t}) OPTIONAL MATCH (n)-[r]->() RETURN count(DISTINCT n) AS n, "
            "count(r) AS r",
            {"t": team},
        )
        return rows[0]["n"], rows[0]["r"]

    before = await count()
    await build(graph, team)
    assert await count() == before


async def test_neo4j_down_is_backend_unavailable():
    graph = Neo4jGraph(Neo4jSettings(uri="bolt://127.0.0.1:1", timeout_s=1))
    with pytest.raises(BackendUnavailable):
        await graph.run_intent("MEMBERS_OF_DAO", {"role": None, "limit": 5}, public("t"))
    with pytest.raises(BackendUnavailable):
        await graph.run_cypher("RETURN 1", {}, public("t"))


async def test_intents_apply_doc_type_project_and_skill_policies(graph: Neo4jGraph, team):
    from serve_app.access.policy import Policy

    policy = Policy(
        projects=[{"project": "poimen", "access_level": "private", "owner_group": "board"}],
        skills=[{"skill": "debugging.md", "access_level": "public", "required_permission": "x"}],
    )

    def scope(groups=(), permissions=(), doc_types=None):
        params = policy.graph_params(team, ("member",), set(groups), set(permissions), doc_types)
        return GraphScope(team, ("public",), policy=params)

    async def rows(name, scope, **args):
        args = INTENTS[name].args.model_validate(args).model_dump()
        return (await graph.run_intent(name, args, scope))["rows"]

    # Outside the board: poimen and its documents are gone, helios stays.
    found = await rows("FIND_PROJECTS_BY_TECH", scope(), tech="milvus")
    assert ids(r[0] for r in found) == {"helios"}
    assert await rows("DOCS_MENTIONING_TOPIC", scope(), topic="kubernetes") == []
    found = await rows("FIND_PROJECTS_BY_TECH", scope(groups=["board"]), tech="milvus")
    assert ids(r[0] for r in found) == {"poimen", "helios"}
    # debugging.md is a skill needing permission x; doc types limit what is seen too.
    docs = await rows("DOCS_MENTIONING_TOPIC", scope(groups=["board"]), topic="kubernetes")
    assert ids(r[0] for r in docs) == {"tools/kubectl.md"}
    docs = await rows(
        "DOCS_MENTIONING_TOPIC", scope(groups=["board"], permissions=["x"]), topic="kubernetes"
    )
    assert ids(r[0] for r in docs) == {"tools/kubectl.md", "debugging.md"}
    docs = await rows(
        "DOCS_MENTIONING_TOPIC",
        scope(groups=["board"], permissions=["x"], doc_types=frozenset({"doc"})),
        topic="kubernetes",
    )
    assert docs == []
    # Counts only count what the caller may see.
    experts = await rows("EXPERTS_ON_TOPIC", scope(), topic="milvus")
    assert {(e["id"], n) for e, n in experts} == {("alice", 1)}
    # Graph-scoped search and explain_path hold to it too.
    found = await graph.related_docs("kubernetes milvus", scope(), 5, 50)
    assert set(found["docs"]) == {"search.md"}
    with pytest.raises(NotFound):
        await graph.explain_path({"ref": "Kubectl"}, {"ref": "Milvus"}, scope(), 4, 5)


async def test_deleting_a_linked_note_leaves_a_placeholder(graph: Neo4jGraph, team):
    async def links(doc_id):
        rows = await graph.client.run(
            "MATCH (:Doc {team_id: $t, id: $d})-[:LINKS_TO]->(x) "
            "RETURN x.id AS id, coalesce(x.stub, false) AS stub",
            {"t": team, "d": doc_id},
        )
        return {(r["id"], r["stub"]) for r in rows}

    await graph.merge_documents(
        [
            gdoc(team, "notes/source.md", "Source", text="see [[Target Note]]"),
            gdoc(team, "notes/target-note.md", "Target Note", text="see [[Source]]"),
        ]
    )
    assert await links("notes/source.md") == {("notes/target-note.md", False)}
    assert await graph.delete_documents(team, ["notes/target-note.md"]) == 1
    # The incoming link now waits at a placeholder; the deleted note's own links are gone.
    assert await links("notes/source.md") == {("wiki:target-note", True)}
    # The note comes back: the placeholder hands the link over and disappears.
    await graph.merge_documents([gdoc(team, "notes/target-note.md", "Target Note")])
    assert await links("notes/source.md") == {("notes/target-note.md", False)}
    stubs = await graph.client.run(
        "MATCH (d:Doc {team_id: $t, id: 'wiki:target-note'}) RETURN count(d) AS c", {"t": team}
    )
    assert stubs[0]["c"] == 0
    # Deleting both ends at once leaves no placeholder behind.
    assert await graph.delete_documents(team, ["notes/source.md", "notes/target-note.md"]) == 2
    rows = await graph.client.run(
        "MATCH (d:Doc {team_id: $t}) WHERE d.id STARTS WITH 'wiki:target' RETURN count(d) AS c",
        {"t": team},
    )
    assert rows[0]["c"] == 0


async def test_the_gateways_own_query_past_its_timeout_is_neo4j_trouble(settings):
    """A named intent (trusted) timing out means Neo4j is slow or restarting: 503, not the
    422 a caller's own Cypher gets (a fault run saw intents answer 422 around a restart)."""
    graph = Neo4jGraph(settings.neo4j.model_copy(update={"query_timeout_s": 1.0}))
    try:
        with pytest.raises(BackendUnavailable) as err:
            await graph.client.read(
                "UNWIND range(1, 200000000) AS x WITH x WHERE x < 0 RETURN count(*)",
                {},
                max_rows=10,
            )
        assert err.value.status_code == 503 and "timeout" in err.value.message
    finally:
        await graph.close()


async def test_start_heals_an_index_left_by_an_unfinished_constraint(settings):
    """A cut-off schema setup once left an index named like a constraint, after which
    ``CREATE CONSTRAINT ... IF NOT EXISTS`` failed forever (IndexWithNameAlreadyExists) and the
    graph stayed down across replica restarts."""
    from deployments.graph_store.client import Neo4jClient

    client = Neo4jClient(settings.neo4j)
    await client.start()
    await client.run("DROP CONSTRAINT topic_team_id IF EXISTS", write=True)
    await client.run("CREATE INDEX topic_team_id FOR (n:Topic) ON (n.team_id, n.id)", write=True)
    await client.close()
    fresh = Neo4jClient(settings.neo4j)
    try:
        await fresh.start()
        rows = await fresh.run(
            "SHOW CONSTRAINTS YIELD name WHERE name = 'topic_team_id' RETURN name"
        )
        assert rows == [{"name": "topic_team_id"}]
    finally:
        await fresh.close()


async def test_a_callers_query_failing_while_it_runs_is_422_not_503(graph: Neo4jGraph, team):
    """Neo4j compiles these shortestPath queries but fails them while they run (both ends
    are one node: Neo.DatabaseError.Statement.ExecutionFailed). The caller's own Cypher is
    then the caller's fault, a 422 with Neo4j's message (not 503 as if Neo4j were down); the
    same failure of a gateway query stays Neo4j's trouble (re-raised, the ingress answers
    503)."""
    from neo4j.exceptions import DatabaseError

    for query in (
        "MATCH (a:Project {team_id: $team_id, id: 'poimen'}) "
        "MATCH (b:Project {team_id: $team_id, id: 'poimen'}) "
        "MATCH p = shortestPath((a)-[*]-(b)) RETURN p",
        "MATCH p = shortestPath((a)-[*]-(b)) WHERE a.team_id = $team_id RETURN p LIMIT 5",
    ):
        with pytest.raises(InvalidInput) as err:
            await graph.run_cypher(query, {}, everything(team))
        error = err.value
        assert (error.status_code, error.reason, error.field) == (422, "query_failed", "cypher")
        assert error.message.startswith("the query failed while it ran: ")
        assert "start and end nodes are the same" in error.message
        for internal in ("neo4j_code", "gql_status", "Neo.DatabaseError", "\n"):
            assert internal not in error.message
        with pytest.raises(DatabaseError):
            await graph.client.read(query, everything(team).params, max_rows=5)


# Walks from an already bound node (undirected, OPTIONAL MATCH, and the hash joins the
# planner picks for them on other data, forced here by USING JOIN), each in the scope whose
# predicates it carries: the plan check proves them as written.
WALKS = [
    (
        "everything",
        "MATCH (a:Project {team_id: $team_id}) OPTIONAL MATCH (a)-[:USES]-(r:Resource) "
        "WHERE r.team_id = $team_id RETURN a, r",
    ),
    (
        "everything",
        "MATCH (a:Project) WHERE a.team_id = $team_id MATCH (a)-[:USES]-(b) "
        "WHERE b.team_id = $team_id RETURN a, b",
    ),
    (
        "public",
        "MATCH (a:Project {team_id: $team_id}) WHERE a.visibility IN $visibilities "
        "OPTIONAL MATCH (a)-[u:USES]-(r:Resource) WHERE r.team_id = $team_id "
        "AND r.visibility IN $visibilities AND u.visibility IN $visibilities RETURN a, u, r",
    ),
    (
        "everything",
        "MATCH (a:Doc {team_id: $team_id}) OPTIONAL MATCH (a)-[:MENTIONS]-(t:Topic) "
        "USING JOIN ON a WHERE t.team_id = $team_id RETURN a, t",
    ),
    (
        "public",
        "MATCH (a:Doc {team_id: $team_id}) WHERE a.visibility IN $visibilities "
        "OPTIONAL MATCH (a)-[m:MENTIONS]-(t:Topic) USING JOIN ON a WHERE t.team_id = $team_id "
        "AND t.visibility IN $visibilities AND m.visibility IN $visibilities RETURN a, m, t",
    ),
    (
        "everything",
        "MATCH (a:Resource {team_id: $team_id, id: 'milvus'}) "
        "OPTIONAL MATCH (a)-[:USES]-(p:Project) USING JOIN ON a WHERE p.team_id = $team_id "
        "RETURN a, p",
    ),
    (
        "everything",
        "MATCH (a:Project) WHERE a.team_id = $team_id MATCH (a)-[:USES]-(b:Resource) "
        "USING JOIN ON a WHERE b.team_id = $team_id RETURN a, b",
    ),
]


@pytest.mark.parametrize("kind, query", WALKS)
async def test_walking_from_a_bound_node_is_scoped(graph: Neo4jGraph, team, kind, query):
    scope = everything(team) if kind == "everything" else public(team)
    checked = await graph.check_cypher(query, {}, scope)
    assert checked["cypher"] == query  # proven as written, not rewritten
    rows = (await graph.run_cypher(query, {}, scope))["rows"]
    found = list(entities(rows))
    assert found
    for entity in found:
        assert entity["team_id"] == team and entity["visibility"] in scope.visibilities


async def test_a_simple_unscoped_query_gets_the_scope_from_the_gateway(graph: Neo4jGraph, team):
    """The spec's own example names no scope: the gateway compiles the team (and, in public
    scope, the visibility) predicate into it, proves the result and runs it. The other
    tenant holds the same projects and resource under the same ids and names."""
    query = "MATCH (p:Project)-[:USES]->(r:Resource {name:$name}) RETURN p LIMIT 10"
    for scope, expected in (
        (everything(team), {"poimen", "helios", "atlas"}),
        (public(team), {"poimen", "helios"}),
    ):
        restrict = "confidential" not in scope.visibilities
        checked = await graph.check_cypher(query, {"name": "Milvus"}, scope)
        assert checked["cypher"] == scope_query(query, restrict_visibility=restrict)
        assert "p.team_id = $team_id AND" in checked["cypher"]
        rows = (await graph.run_cypher(query, {"name": "Milvus"}, scope))["rows"]
        assert len(rows) == len(expected)
        assert {row[0]["id"] for row in rows} == expected
        for entity in entities(rows):
            assert entity["team_id"] == team and entity["visibility"] in scope.visibilities
    # OPTIONAL MATCH: its new nodes get the predicates in its own WHERE (null, not dropped).
    query = (
        "MATCH (p:Project {id: 'poimen'}) OPTIONAL MATCH (p)<-[:PART_OF]-(d) "
        "OPTIONAL MATCH (p)-[:USES]->(x:Topic) RETURN p, d, x"
    )
    for scope in (everything(team), public(team)):
        rows = (await graph.run_cypher(query, {}, scope))["rows"]
        assert {row[1]["id"] for row in rows} == {"tools/kubectl.md", "debugging.md"}
        assert all(row[0]["team_id"] == team and row[2] is None for row in rows)
        for entity in entities(rows):
            assert entity["team_id"] == team and entity["visibility"] in scope.visibilities


async def test_a_note_linking_to_itself_links_to_itself(graph: Neo4jGraph, team):
    """[[Own title]] inside the note "Own title" is a link to that note (a LINKS_TO
    self-loop), by its title or its file name, not a placeholder of a note still to come."""

    async def links(doc_id):
        rows = await graph.client.run(
            "MATCH (:Doc {team_id: $t, id: $d})-[:LINKS_TO]->(x) "
            "RETURN x.id AS id, coalesce(x.stub, false) AS stub",
            {"t": team, "d": doc_id},
        )
        return {(r["id"], r["stub"]) for r in rows}

    async def stubs():
        rows = await graph.client.run(
            "MATCH (d:Doc {team_id: $t}) WHERE d.stub RETURN collect(d.id) AS ids", {"t": team}
        )
        return set(rows[0]["ids"])

    before = await stubs()
    notes = [
        gdoc(team, "notes/own-title.md", "Own title", text="see [[Own title]] and [[#Part]]"),
        gdoc(team, "misc/x1.md", "Other Name", text="[[Other Name|me]], [[x1]], [[debugging]]"),
        # Its title's key is another note's file name: that note wins, as for any link.
        gdoc(team, "misc/kube.md", "Kubectl", text="[[Kubectl]]"),
    ]
    await graph.merge_documents(notes)
    assert await links("notes/own-title.md") == {("notes/own-title.md", False)}
    assert await links("misc/x1.md") == {("misc/x1.md", False), ("debugging.md", False)}
    assert await links("misc/kube.md") == {("tools/kubectl.md", False)}
    assert await stubs() == before
    # Re-sending changes nothing; deleting leaves no placeholder for the note's own link.
    count = "MATCH (n {team_id: $t}) OPTIONAL MATCH (n)-[r]->() RETURN count(r) AS c"
    edges = await graph.client.run(count, {"t": team})
    await graph.merge_documents(notes)
    assert await graph.client.run(count, {"t": team}) == edges
    assert await graph.delete_documents(team, ["notes/own-title.md", "misc/x1.md"]) == 2
    assert await stubs() == before
