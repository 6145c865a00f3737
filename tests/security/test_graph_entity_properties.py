"""Property-based test (hypothesis) of who sees which graph entity, against the real Neo4j.

Each example builds a small world in two fresh teams — documents with random visibility,
ACLs, doc types, projects, channels, authors, agents, tags and [[links]]; entities and
relationships written directly (by a writer who may or may not reach what it names); then
ACL changes, visibility changes and deletes — and asks, as one random caller, every graph
answer path of the store: each intent, the entity search behind ``graph.entities``
(``related_docs``), explain_path (its end lookup and its paths) and caller Cypher where it
is allowed. The oracle (``World``) is written from the rules of issue 32, not from the
gateway's code:

* a document is seen when its visibility is granted and its ACL admits the caller;
* an entity documents made (a ``derived`` one, wiki-link placeholders included) is seen
  when one of the documents naming it is, and is gone when none is left;
* an entity written directly keeps its own visibility; a write touching an existing entity
  its writer may not see changes nothing;
* a relationship is seen when it and both its ends are.

Nothing the caller may not see appears, and what it may see still does (the entity search,
neighbours and paths are checked both ways).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deployments import acl
from deployments.errors import NotFound
from deployments.graph_store.intents import INTENTS
from deployments.graph_store.store import Neo4jGraph
from deployments.protocols import GraphDocument
from serve_app.access import graph as graph_access
from serve_app.access.context import AccessContext

pytestmark = pytest.mark.integration

PROPERTY_SETTINGS = settings(
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

TAGS = ("tagalpha", "tagbeta", "taggamma")
CHANNELS = ("chanred", "chanblue")
AUTHORS = ("userann", "userben")
AGENTS = ("agentzed",)
PROJECTS = ("projmoon", "projsun")
RESOURCES = ("resvault", "resdb")
GROUPS = ("hr", "ops")
ACLS = (
    (acl.OPEN_ALLOW, ()),
    (acl.allow_tokens(groups=["hr"]), ()),
    (acl.allow_tokens(users=["alice"]), ()),
    (acl.OPEN_ALLOW, acl.deny_tokens(["ops"])),
    (acl.allow_tokens(groups=["hr"]), acl.deny_tokens(["ops"])),
)
DERIVED_FIELDS = (
    ("Project", "project_id"),
    ("Channel", "channel_id"),
    ("Agent", "agent_id"),
    ("User", "author_id"),
)
# (type, from label, from pool, to label, to pool)
EXPLICIT_RELS = (
    ("USES", "Project", PROJECTS, "Resource", RESOURCES),
    ("SERVES", "Agent", AGENTS, "Project", PROJECTS),
    ("MEMBER_OF", "User", AUTHORS, "MicroDAO", None),
    ("USES", "User", AUTHORS, "Resource", RESOURCES),
)
EXPLICIT_LABELS = (("Topic", TAGS), ("User", AUTHORS), ("Project", PROJECTS))
EXPLICIT_LABELS += (("Resource", RESOURCES), ("Agent", AGENTS))
Key = tuple[str, str]  # (label, id) within the world's first team


@dataclass
class Caller:
    user: str
    groups: frozenset[str]
    confidential: bool

    @property
    def visibilities(self) -> tuple[str, ...]:
        return ("public", "confidential") if self.confidential else ("public",)

    def context(self, team: str) -> AccessContext:
        return AccessContext(
            team_id=team,
            user_id=self.user,
            allowed_visibilities=self.visibilities,
            roles=("owner",) if self.confidential else ("member",),
            groups=self.groups,
        )

    def reads(self, doc: GraphDocument) -> bool:
        """The document rule, written out: visibility granted, an allowed principal among
        the caller's, no denied group among them."""
        if doc.visibility not in self.visibilities:
            return False
        mine = {"*", f"user:{self.user}", *(f"group:{g}" for g in self.groups)}
        return bool(set(doc.acl_allow) & mine) and not set(doc.acl_deny) & mine


@dataclass
class World:
    """The oracle: what the graph of the first team must hold."""

    team: str
    docs: dict[str, GraphDocument] = field(default_factory=dict)
    explicit: dict[Key, str] = field(default_factory=dict)  # written directly → visibility
    rels: dict[tuple[str, Key, Key], str] = field(default_factory=dict)  # explicit rels

    def sources(self) -> dict[Key, set[str]]:
        """Every node documents made (or link to), with the documents naming it."""
        out: dict[Key, set[str]] = {}
        titles = {d.wiki_title for d in self.docs.values()} | {
            d.wiki_id for d in self.docs.values()
        }
        for doc_id, d in self.docs.items():
            for label, attr in DERIVED_FIELDS:
                if getattr(d, attr):
                    out.setdefault((label, getattr(d, attr)), set()).add(doc_id)
            for tag in d.tags:
                out.setdefault(("Topic", tag), set()).add(doc_id)
            for link in d.links:
                if link not in titles:
                    out.setdefault(("Doc", "wiki:" + link), set()).add(doc_id)
        return out

    def nodes(self) -> set[Key]:
        return set(self.sources()) | set(self.explicit) | {("Doc", d) for d in self.docs}

    def visible(self, caller: Caller, key: Key) -> bool:
        if key in self.explicit:
            return self.explicit[key] in caller.visibilities
        if key[0] == "Doc" and key[1] in self.docs:
            return caller.reads(self.docs[key[1]])
        return any(caller.reads(self.docs[d]) for d in self.sources().get(key, ()))

    def edges(self, caller: Caller) -> set[tuple[str, Key, Key]]:
        """Relationships the caller sees (document edges carry their document's rule)."""
        out = set()
        for doc_id, d in self.docs.items():
            if not caller.reads(d):
                continue
            me: Key = ("Doc", doc_id)
            for label, attr in DERIVED_FIELDS:
                if getattr(d, attr):
                    end = (label, getattr(d, attr))
                    kind = {"Project": "PART_OF", "Channel": "POSTED_IN"}.get(label, "AUTHORED")
                    out.add((kind, end, me) if kind == "AUTHORED" else (kind, me, end))
            out |= {("MENTIONS", me, ("Topic", t)) for t in d.tags}
            for link in d.links:
                target = next(
                    (
                        ("Doc", o.doc_id)
                        for o in self.docs.values()
                        if link in (o.wiki_id, o.wiki_title)
                    ),
                    ("Doc", "wiki:" + link),
                )
                out.add(("LINKS_TO", me, target))
        out |= {rel for rel, vis in self.rels.items() if vis in caller.visibilities}
        return {r for r in out if self.visible(caller, r[1]) and self.visible(caller, r[2])}

    def reachable(self, caller: Caller, a: Key, b: Key, hops: int) -> bool:
        adjacent: dict[Key, set[Key]] = {}
        for _, x, y in self.edges(caller):
            if x[1].startswith("wiki:") or y[1].startswith("wiki:"):
                continue  # explain_path never walks through a placeholder
            adjacent.setdefault(x, set()).add(y)
            adjacent.setdefault(y, set()).add(x)
        seen, todo = {a}, deque([(a, 0)])
        while todo:
            node, depth = todo.popleft()
            if node == b:
                return True
            if depth < hops:
                for nxt in adjacent.get(node, set()) - seen:
                    seen.add(nxt)
                    todo.append((nxt, depth + 1))
        return False


# --- strategies ----------------------------------------------------------------------------
def documents(team: str) -> st.SearchStrategy[list[GraphDocument]]:
    def doc(i: int, draw: Any) -> GraphDocument:
        allow, deny = draw(st.sampled_from(ACLS))
        title = f"note{i}"
        links = draw(
            st.lists(st.sampled_from(["note0", "note1", "note2", "ghostnote"]), max_size=2)
        )
        return GraphDocument(
            team_id=team,
            doc_id=f"doc{i}",
            title=title,
            visibility=draw(st.sampled_from(["public", "confidential"])),
            doc_type="doc",
            project_id=draw(st.sampled_from(("",) + PROJECTS)),
            channel_id=draw(st.sampled_from(("",) + CHANNELS)),
            agent_id=draw(st.sampled_from(("",) + AGENTS)),
            author_id=draw(st.sampled_from(("",) + AUTHORS)),
            tags=tuple(draw(st.lists(st.sampled_from(TAGS), max_size=2, unique=True))),
            links=tuple(dict.fromkeys(links)),
            # Both keys the title: a deleted note's placeholder is the key its links use.
            wiki_id=title,
            wiki_title=title,
            acl_allow=allow,
            acl_deny=deny,
        )

    @st.composite
    def build(draw: Any) -> list[GraphDocument]:
        return [doc(i, draw) for i in range(draw(st.integers(1, 4)))]

    return build()


callers = st.builds(
    Caller,
    user=st.sampled_from(["alice", "bob"]),
    groups=st.frozensets(st.sampled_from(GROUPS)),
    confidential=st.booleans(),
)
writers = st.builds(
    Caller,
    user=st.just("alice"),
    groups=st.sampled_from([frozenset({"hr"}), frozenset()]),
    confidential=st.booleans(),
)


@st.composite
def scenarios(draw: Any) -> dict[str, Any]:
    docs = draw(documents("T"))
    nodes = draw(
        st.lists(
            st.tuples(
                st.sampled_from(EXPLICIT_LABELS).flatmap(
                    lambda lp: st.tuples(st.just(lp[0]), st.sampled_from(lp[1]))
                ),
                st.sampled_from(["public", "confidential"]),
            ),
            max_size=3,
        )
    )
    rels = []
    for rtype, la, pa, lb, pb in draw(st.lists(st.sampled_from(EXPLICIT_RELS), max_size=3)):
        b = draw(st.sampled_from(pb)) if pb else "T"
        rels.append(
            (
                rtype,
                (la, draw(st.sampled_from(pa))),
                (lb, b),
                draw(st.sampled_from(["public", "confidential"])),
            )
        )
    mutations = draw(
        st.lists(
            st.one_of(
                st.tuples(
                    st.just("acl"),
                    st.integers(0, 3),
                    st.sampled_from(ACLS),
                    st.sampled_from(["public", "confidential"]),
                ),
                st.tuples(st.just("delete"), st.integers(0, 3)),
                st.tuples(
                    st.just("write"), st.integers(0, 2), st.sampled_from(["public", "confidential"])
                ),
            ),
            max_size=3,
        )
    )
    other = draw(st.lists(st.sampled_from(TAGS + AUTHORS), max_size=2))
    return {
        "docs": docs,
        "nodes": nodes,
        "rels": rels,
        "writer": draw(writers),
        "mutations": mutations,
        "caller": draw(callers),
        "other_team_tags": other,
        "probes": draw(st.lists(st.integers(0, 10_000), min_size=4, max_size=4)),
    }


# --- applying a scenario to Neo4j and to the oracle ------------------------------------
class Runner:
    """A Neo4j graph in its own event loop (hypothesis drives a plain function)."""

    def __init__(self, neo4j: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.graph = Neo4jGraph(neo4j)
        self.run(self.graph.start())
        self.counter = itertools.count()
        self.cases = 0

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        self.run(self.graph.close())
        self.loop.close()


@pytest.fixture(scope="module")
def runner(settings, run_id):  # noqa: F811 (the integration conftest's settings fixture)
    r = Runner(settings.neo4j)
    r.prefix = f"gp_{run_id}_"
    yield r
    r.run(
        r.graph.client.run(
            "MATCH (n) WHERE n.team_id STARTS WITH $p DETACH DELETE n", {"p": r.prefix}, write=True
        )
    )
    assert r.cases >= 500, r.cases
    r.close()


def retarget(doc: GraphDocument, team: str) -> GraphDocument:
    return replace(doc, team_id=team)


async def write(graph: Neo4jGraph, world: World, writer: Caller, nodes, rels) -> None:
    """An entity write as the store sees it, and what the oracle expects of it."""
    scope = graph_access.graph_scope(writer.context(world.team))

    def team_end(end: Key) -> Key:
        return ("MicroDAO", world.team) if end[0] == "MicroDAO" else end

    # The store merges relationships grouped by (type, labels), in order of first sight.
    groups: dict[tuple[str, str, str], list] = {}
    for t, a, b, v in rels:
        groups.setdefault((t, a[0], b[0]), []).append((t, team_end(a), team_end(b), v))
    rels = [r for group in groups.values() for r in group]
    result = await graph.upsert_entities(
        world.team,
        [
            {"label": lb, "id": i, "name": i, "visibility": v, "properties": {}}
            for (lb, i), v in nodes
        ],
        [
            {
                "type": t,
                "from_label": a[0],
                "from_id": a[1],
                "to_label": b[0],
                "to_id": b[1],
                "visibility": v,
                "properties": {},
            }
            for t, a, b, v in rels
        ],
        scope,
    )
    existing = world.nodes()
    named = {k for k, _ in nodes} | {e for _, a, b, _ in rels for e in (a, b)}
    out_of_reach = {k for k in named if k in existing and not world.visible(writer, k)}
    out_of_reach |= {
        (t, a, b)
        for t, a, b, _ in rels
        if world.rels.get((t, a, b), "public") not in writer.visibilities
    }
    assert bool(result["refused"]) == bool(out_of_reach), (result, out_of_reach)
    if out_of_reach:
        return
    for key, vis in nodes:
        world.explicit[key] = vis
    for t, a, b, vis in rels:
        for end in (a, b):
            if end not in existing and end not in world.explicit:
                world.explicit[end] = vis
        world.rels[(t, a, b)] = vis
    existing.add(("MicroDAO", world.team))


async def apply(graph: Neo4jGraph, world: World, other: str, s: dict[str, Any]) -> None:
    world.explicit[("MicroDAO", world.team)] = "public"
    docs = [retarget(d, world.team) for d in s["docs"]]
    # The same names in another team: never an answer of the first.
    foreign = GraphDocument(
        other,
        "foreign",
        "foreign",
        "public",
        "doc",
        tags=tuple(s["other_team_tags"]),
        author_id="userann",
    )
    await graph.merge_documents([*docs, foreign])
    world.docs = {d.doc_id: d for d in docs}
    await write(graph, world, s["writer"], s["nodes"], s["rels"])
    for m in s["mutations"]:
        ids = sorted(world.docs)
        if m[0] == "acl" and ids:
            d = world.docs[ids[m[1] % len(ids)]]
            d = replace(d, acl_allow=m[2][0], acl_deny=m[2][1], visibility=m[3])
            await graph.merge_documents([d])
            world.docs[d.doc_id] = d
        elif m[0] == "delete" and ids:
            gone = ids[m[1] % len(ids)]
            await graph.delete_documents(world.team, [gone])
            del world.docs[gone]
        elif m[0] == "write" and s["nodes"]:
            key, _ = s["nodes"][m[1] % len(s["nodes"])]
            await write(graph, world, s["writer"], [(key, m[2])], [])
        # A derived node no document names any more is gone, with its relationships.
        alive = world.nodes()
        world.rels = {r: v for r, v in world.rels.items() if r[1] in alive and r[2] in alive}


def node_key(node: dict[str, Any]) -> Key:
    labels = [lb for lb in node["labels"] if lb != "Node"]
    return labels[0], node["id"]


async def check(graph: Neo4jGraph, world: World, caller: Caller, probes: list[int]) -> None:
    ctx = caller.context(world.team)
    scope = graph_access.graph_scope(ctx)
    everything = sorted(world.nodes() - {("Doc", d) for d in world.docs})
    seen = {k for k in world.nodes() if world.visible(caller, k)}
    edges = world.edges(caller)

    def sound(value: Any, where: str) -> None:
        for entity in walk(value):
            if entity["_type"] == "node":
                assert entity["team_id"] == world.team, (where, entity)
                assert node_key(entity) in seen, (where, entity, seen)
            elif entity["_type"] == "relationship":
                assert entity["visibility"] in caller.visibilities, (where, entity)

    # The entity search of a graph-boosted search: exactly the visible named entities.
    names = [i for lb, i in everything if not i.startswith("wiki:") and lb != "MicroDAO"]
    found = await graph.related_docs(" ".join(names), scope, 50, 50)
    sound(found["entities"], "entities")
    got = {node_key(e["node"]) for e in found["entities"]}
    want = {k for k in seen if k[1] in names}
    assert got == want, ("entities", got, want)
    # Three intents (of all, over the examples) with names of the world.
    pool = [i for _, i in everything] or ["nothing"]
    names_of = sorted(INTENTS)
    for k in range(3):
        name = names_of[(probes[0] + k * 3) % len(names_of)]
        intent = INTENTS[name]
        args: dict[str, Any] = {
            f: None if f in ("role", "target") else pool[(probes[k] + k) % len(pool)]
            for f in intent.args.model_fields
            if f != "limit"
        }
        result = await graph.run_intent(name, intent.args.model_validate(args).model_dump(), scope)
        sound(result["rows"], name)
    # Neighbours of a probed entity: exactly the visible ones.
    if everything:
        e = everything[probes[1] % len(everything)]
        rows = (await graph.run_intent("ENTITY_NEIGHBOURS", {"entity": e[1], "limit": 200}, scope))[
            "rows"
        ]
        sound(rows, "neighbours")
        got_n = {(rel, node_key(n)) for _, rel, _, n in rows}
        want_n = (
            {(t, y if x == e else x) for t, x, y in edges if e in (x, y)} if e in seen else set()
        )
        assert got_n == want_n, ("neighbours", e, got_n, want_n)
    # explain_path between two probed entities: hidden ends are missing ends; paths exist
    # exactly where the visible graph connects them.
    ends = [k for k in everything if not k[1].startswith("wiki:")]  # never a placeholder
    if len(ends) > 1:
        a = ends[probes[2] % len(ends)]
        b = ends[probes[3] % len(ends)]
        if a != b:
            try:
                result = await graph.explain_path(
                    {"ref": a[1], "label": a[0]}, {"ref": b[1], "label": b[0]}, scope, 4, 10
                )
            except NotFound:
                assert not (a in seen and b in seen), ("explain_path", a, b)
            else:
                assert a in seen and b in seen, ("explain_path", a, b)
                sound(result, "explain_path")
                assert bool(result["paths"]) == world.reachable(caller, a, b, 4), ("paths", a, b)
    # Caller Cypher (only where nothing of the team is hidden by an ACL): the visibility the
    # store keeps on derived nodes keeps it inside the rule.
    if not await graph.acl_hidden(scope):
        result = await graph.run_cypher(
            "MATCH (n) WHERE n.team_id = $team_id AND n.visibility IN $visibilities RETURN n",
            {},
            scope,
        )
        sound(result["rows"], "cypher")
        assert {node_key(r[0]) for r in result["rows"]} == seen, ("cypher", seen)


def walk(value: Any):
    if isinstance(value, dict):
        if value.get("_type") in ("node", "relationship"):
            yield value
        for v in value.values():
            yield from walk(v)
    elif isinstance(value, list):
        for v in value:
            yield from walk(v)


def test_graph_answers_hold_exactly_what_the_caller_may_see(runner: Runner):
    @PROPERTY_SETTINGS
    @given(scenario=scenarios())
    def case(scenario: dict[str, Any]) -> None:
        n = next(runner.counter)
        world = World(team=f"{runner.prefix}{n}a")
        other = f"{runner.prefix}{n}b"
        try:
            runner.run(apply(runner.graph, world, other, scenario))
            runner.run(check(runner.graph, world, scenario["caller"], scenario["probes"]))
            runner.cases += 1
        finally:
            runner.run(
                runner.graph.client.run(
                    "MATCH (n) WHERE n.team_id IN $t DETACH DELETE n",
                    {"t": [world.team, other]},
                    write=True,
                )
            )

    case()
