"""The catalogue of named graph intents: ``graph.query_context`` with ``intent`` + ``args``.

Each intent is a parameterised Cypher template over the schema of docs/graph_schema.md, with
its arguments validated by a pydantic model. Every node and relationship variable of every
template carries the tenant and visibility predicates (``$team_id``, ``$visibilities``), which
the gateway binds from the caller's AccessContext, and every ``Doc`` the caller's document ACL
tokens and policies (``doc_allowed``); the integration tests prove each template with the
same plan check as caller Cypher (deployments.graph_store.guard). Arguments are only ever bound as
parameters, never formatted into the text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]
Limit = Annotated[int, Field(ge=1, le=200, description="most rows returned")]


def acl_allowed(v: str) -> str:
    """The document ACL of a ``Doc`` (deployments/acl.py, ``admits``): one of the caller's
    ``$acl_principals`` in its ``acl_allow`` and none in its ``acl_deny``. A node without
    them (written before ACLs, or a placeholder) is open: ``*`` allowed, nobody denied."""
    return (
        f"any(acl_p IN coalesce({v}.acl_allow, ['*']) WHERE acl_p IN $acl_principals)"
        f" AND none(acl_g IN coalesce({v}.acl_deny, []) WHERE acl_g IN $acl_principals)"
    )


def doc_allowed(v: str) -> str:
    """The caller's document ACL and doc-type, project and skill policies on a ``Doc``
    (parameters of ``GraphScope.params``; with none given only documents without an ACL
    are seen and no policy restricts)."""
    return (
        f"{acl_allowed(v)}"
        f" AND ($doc_types IS NULL OR {v}.doc_type IN $doc_types)"
        f" AND (coalesce({v}.project_id, '') = ''"
        f" OR ({v}.project_id IN $projects) <> $projects_deny)"
        f" AND NOT {v}.id IN $denied_skill_ids"
        f" AND CASE WHEN $skill_tags_deny"
        f" THEN none(tag_t IN coalesce({v}.tags, []) WHERE tag_t IN $skill_tags)"
        f" ELSE all(tag_t IN coalesce({v}.tags, []) WHERE NOT tag_t STARTS WITH 'skill:'"
        f" OR tag_t IN $skill_tags) END"
    )


def project_allowed(v: str) -> str:
    return f"({v}.id IN $projects) <> $projects_deny"


def source_visible(v: str) -> str:
    """A node that exists only because of documents (``derived``: the projects, channels,
    agents, authors and topics ingestion names, and the placeholders of wiki-links) is seen
    only through a document the caller may see: one ``Doc`` in scope (team, visibility,
    ACL and policies) linked to it by a relationship in scope. A node written through
    ``/graph/entities`` (``derived`` false) keeps its own visibility. Checked when the
    node is matched (query time): ingestion keeps only ``derived`` and the node's
    visibility up to date (deployments/graph_store/cypher.py, ``RECOMPUTE_DERIVED``)."""
    rel, doc = f"{v}_via", f"{v}_src"
    # The label is tested through labels(): a label in the pattern would let the planner
    # start from an index over all of the team's documents instead of walking from the node.
    return (
        f"(NOT coalesce({v}.derived, false) OR EXISTS {{ MATCH ({v})-[{rel}]-({doc})"
        f" WHERE 'Doc' IN labels({doc})"
        f" AND {doc}.team_id = $team_id AND {doc}.visibility IN $visibilities"
        f" AND {rel}.visibility IN $visibilities AND NOT coalesce({doc}.stub, false)"
        f" AND {doc_allowed(doc)} }})"
    )


def entity_allowed(v: str) -> str:
    """For a node of any label: the document ACL and policies, or the project policy, when
    it is one, and for a node made by documents one of them in scope (``source_visible``)."""
    return (
        f"(NOT {v}:Doc OR ({doc_allowed(v)})) AND (NOT {v}:Project OR {project_allowed(v)})"
        f" AND {source_visible(v)}"
    )


# Relationships only ingestion writes, from a real (not placeholder) document to what it
# names: /graph/entities cannot write a relationship with a Doc end, and a placeholder has
# only incoming links.
DOCUMENT_EDGES = ("PART_OF", "POSTED_IN", "AUTHORED", "MENTIONS")


def scoped(
    nodes: str,
    rels: str = "",
    *,
    docs: str = "",
    projects: str = "",
    any_: str = "",
    via_docs: str = "",
) -> str:
    """``WHERE`` conjuncts putting each node (team and visibility, and a visible source
    document when documents made it) and each relationship (visibility) inside the caller's
    scope, and the caller's policies on the variables that are documents (``docs``),
    projects (``projects``) or may be either (``any_``).

    ``via_docs``: node variables the same pattern joins to one of ``docs`` by a relationship
    in ``rels`` of a ``DOCUMENT_EDGES`` type (or as the head of a ``LINKS_TO`` from it):
    that document is a visible source of theirs already, so they skip the ``EXISTS`` of
    ``source_visible`` (which the planner may otherwise evaluate for every candidate)."""
    parts = []
    for v in nodes.split():
        parts.append(f"{v}.team_id = $team_id AND {v}.visibility IN $visibilities")
    for r in rels.split():
        parts.append(f"{r}.visibility IN $visibilities")
    parts += [doc_allowed(v) for v in docs.split()]
    parts += [project_allowed(v) for v in projects.split()]
    parts += [entity_allowed(v) for v in any_.split()]
    skip = set(any_.split()) | set(via_docs.split())
    parts += [source_visible(v) for v in nodes.split() if v not in skip]
    return " AND ".join(parts)


def named(var: str, param: str, *props: str) -> str:
    """``var`` is the entity ``$param`` names: by id, or case-insensitively by name/title."""
    alts = [f"{var}.id = ${param}"] + [f"toLower({var}.{p}) = toLower(${param})" for p in props]
    return "(" + " OR ".join(alts) + ")"


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TechArgs(_Args):
    tech: Name = Field(description="a technology, resource or topic name, e.g. 'Milvus'")
    limit: Limit = 20


class DaoMembersArgs(_Args):
    role: Name | None = Field(None, description="only members with this role")
    limit: Limit = 50


class AgentsServingArgs(_Args):
    target: Name | None = Field(
        None, description="a project or DAO id/name; all agents serving anything when omitted"
    )
    limit: Limit = 50


class TopicArgs(_Args):
    topic: Name
    limit: Limit = 20


class ProjectArgs(_Args):
    project: Name = Field(description="a project id or name")
    limit: Limit = 20


class ChannelArgs(_Args):
    channel: Name = Field(description="a channel id or name")
    limit: Limit = 20


class DocArgs(_Args):
    doc: Name = Field(description="a document id or title")
    limit: Limit = 50


class EntityArgs(_Args):
    entity: Name = Field(description="any entity's id, name or title")
    limit: Limit = 50


@dataclass(frozen=True)
class Intent:
    name: str
    description: str
    args: type[_Args]
    cypher: str
    example: dict[str, Any]

    def catalogue_entry(self) -> dict[str, Any]:
        return {
            "intent": self.name,
            "description": self.description,
            "args_schema": self.args.model_json_schema(),
            "example": {"intent": self.name, "args": self.example},
        }


_INTENTS = [
    Intent(
        "FIND_PROJECTS_BY_TECH",
        "Projects that use a technology (USES a Resource of that name) or whose documents "
        "mention it as a topic.",
        TechArgs,
        f"""
CALL () {{
  MATCH (p:Project)-[u:USES]->(r:Resource)
  WHERE {scoped("p r", "u", projects="p")} AND {named("r", "tech", "name")}
  RETURN p AS project, 'uses' AS via, r AS evidence
  UNION
  MATCH (p2:Project)<-[po:PART_OF]-(d:Doc)-[m:MENTIONS]->(t:Topic)
  WHERE {scoped("p2 d t", "po m", docs="d", projects="p2", via_docs="p2 t")}
    AND {named("t", "tech", "name")}
  RETURN p2 AS project, 'mentioned_in' AS via, d AS evidence
}}
WITH project, collect(via) AS via, collect(evidence)[..5] AS evidence
RETURN project, via, evidence ORDER BY size(evidence) DESC, project.name LIMIT $limit
""",
        {"tech": "Milvus"},
    ),
    Intent(
        "MEMBERS_OF_DAO",
        "Users who are members of the caller's DAO, optionally with one role.",
        DaoMembersArgs,
        f"""
MATCH (u:User)-[m:MEMBER_OF]->(dao:MicroDAO)
WHERE {scoped("u dao", "m")} AND dao.id = $team_id AND ($role IS NULL OR m.role = $role)
RETURN u AS member, m.role AS role ORDER BY u.name LIMIT $limit
""",
        {"role": "guardian"},
    ),
    Intent(
        "AGENTS_SERVING",
        "Agents that serve a project or the DAO (SERVES).",
        AgentsServingArgs,
        f"""
MATCH (a:Agent)-[s:SERVES]->(x)
WHERE {scoped("a x", "s", any_="x")} AND ($target IS NULL OR {named("x", "target", "name")})
RETURN a AS agent, x AS serves ORDER BY a.name LIMIT $limit
""",
        {"target": "prj_x"},
    ),
    Intent(
        "DOCS_MENTIONING_TOPIC",
        "Documents that mention a topic (their tags), newest first.",
        TopicArgs,
        f"""
MATCH (d:Doc)-[m:MENTIONS]->(t:Topic)
WHERE {scoped("d t", "m", docs="d", via_docs="t")} AND {named("t", "topic", "name")}
RETURN d AS doc, t AS topic ORDER BY d.created_at DESC, d.id LIMIT $limit
""",
        {"topic": "milvus"},
    ),
    Intent(
        "RESOURCES_USED_BY_PROJECT",
        "Resources (technologies, datasets, services) a project uses.",
        ProjectArgs,
        f"""
MATCH (p:Project)-[u:USES]->(r:Resource)
WHERE {scoped("p r", "u", projects="p")} AND {named("p", "project", "name")}
RETURN r AS resource, p AS project ORDER BY r.name LIMIT $limit
""",
        {"project": "prj_x"},
    ),
    Intent(
        "TOPICS_OF_CHANNEL",
        "Topics discussed in a channel, by how many of its documents mention them.",
        ChannelArgs,
        f"""
MATCH (c:Channel)<-[pi:POSTED_IN]-(d:Doc)-[m:MENTIONS]->(t:Topic)
WHERE {scoped("c d t", "pi m", docs="d", via_docs="c t")} AND {named("c", "channel", "name")}
RETURN t AS topic, count(DISTINCT d) AS docs ORDER BY docs DESC, t.name LIMIT $limit
""",
        {"channel": "ch_general"},
    ),
    Intent(
        "EXPERTS_ON_TOPIC",
        "Users and agents who authored documents mentioning a topic, by number of documents.",
        TopicArgs,
        f"""
MATCH (x)-[a:AUTHORED]->(d:Doc)-[m:MENTIONS]->(t:Topic)
WHERE {scoped("x d t", "a m", docs="d", via_docs="x t")} AND (x:User OR x:Agent)
  AND {named("t", "topic", "name")}
RETURN x AS expert, count(DISTINCT d) AS docs ORDER BY docs DESC, x.name LIMIT $limit
""",
        {"topic": "milvus"},
    ),
    Intent(
        "RELATED_PROJECTS",
        "Projects related to a project by a shared resource or a topic their documents share.",
        ProjectArgs,
        f"""
CALL () {{
  MATCH (p:Project)-[u1:USES]->(r:Resource)<-[u2:USES]-(q:Project)
  WHERE {scoped("p r q", "u1 u2", projects="p q")} AND {named("p", "project", "name")} AND q <> p
  RETURN q AS project, 'shared_resource' AS via, r AS shared
  UNION
  MATCH (p2:Project)<-[a1:PART_OF]-(d1:Doc)-[m1:MENTIONS]->(t:Topic)<-[m2:MENTIONS]-(d2:Doc)
        -[a2:PART_OF]->(q2:Project)
  WHERE {scoped("p2 d1 t d2 q2", "a1 m1 m2 a2", docs="d1 d2", projects="p2 q2", via_docs="p2 t q2")}
        AND {named("p2", "project", "name")} AND q2 <> p2
  RETURN q2 AS project, 'shared_topic' AS via, t AS shared
}}
WITH project, collect(DISTINCT via) AS via, collect(DISTINCT shared) AS shared
RETURN project, via, size(shared) AS strength, shared[..5] AS shared
ORDER BY strength DESC, project.name LIMIT $limit
""",
        {"project": "prj_x"},
    ),
    Intent(
        "LINKED_DOCS",
        "Documents a document links to with [[wiki-links]], and documents linking to it.",
        DocArgs,
        f"""
CALL () {{
  MATCH (d:Doc)-[l:LINKS_TO]->(o:Doc)
  WHERE {scoped("d o", "l", docs="d o", via_docs="o")} AND {named("d", "doc", "title")}
  RETURN 'links_to' AS direction, o AS doc
  UNION
  MATCH (d2:Doc)<-[l2:LINKS_TO]-(i:Doc)
  WHERE {scoped("d2 i", "l2", docs="d2 i", via_docs="d2")} AND {named("d2", "doc", "title")}
  RETURN 'linked_from' AS direction, i AS doc
}}
RETURN direction, doc ORDER BY direction DESC, doc.title LIMIT $limit
""",
        {"doc": "tools/kubectl.md"},
    ),
    Intent(
        "ENTITY_NEIGHBOURS",
        "Everything one relationship away from an entity named by id, name or title.",
        EntityArgs,
        f"""
MATCH (e)
WHERE {scoped("e", any_="e")} AND {named("e", "entity", "name", "title")}
// DISTINCT keeps the planner from starting at every node of the team as a neighbour.
WITH DISTINCT e
MATCH (e)-[r]-(n)
WHERE {scoped("n", "r", any_="n")}
RETURN e AS entity, type(r) AS relationship, startNode(r) = e AS outgoing, n AS neighbour
ORDER BY relationship, neighbour.id LIMIT $limit
""",
        {"entity": "Milvus"},
    ),
]

INTENTS: dict[str, Intent] = {i.name: i for i in _INTENTS}


def catalogue() -> list[dict[str, Any]]:
    """``GET /graph/intents``: every intent with its argument schema and an example."""
    return [i.catalogue_entry() for i in _INTENTS]
