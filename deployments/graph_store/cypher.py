"""The graph's Cypher text and vocabulary (docs/graph_schema.md): node labels, relationship
types, the schema statements, the trusted statements ingestion and search run, and the
Lucene escaping of full-text queries."""

from __future__ import annotations

from deployments.graph_store.intents import acl_allowed, doc_allowed, entity_allowed

# The graph vocabulary of docs/graph_schema.md.
NODE_LABELS = (
    "User",
    "Agent",
    "MicroDAO",
    "Project",
    "Channel",
    "Topic",
    "Resource",
    "File",
    "RWAObject",
    "Doc",
)
RELATIONSHIPS = (
    "MEMBER_OF",
    "SERVES",
    "MENTIONS",
    "USES",
    "LINKS_TO",
    "PART_OF",
    "POSTED_IN",
    "AUTHORED",
)


def schema_statements() -> list[str]:
    """Constraints and indexes created idempotently at start."""
    statements = []
    for label in NODE_LABELS:
        low = label.lower()
        statements.append(
            f"CREATE CONSTRAINT {low}_team_id IF NOT EXISTS FOR (n:{label}) "
            "REQUIRE (n.team_id, n.id) IS UNIQUE"
        )
        statements.append(
            f"CREATE INDEX {low}_team_visibility IF NOT EXISTS FOR (n:{label}) "
            "ON (n.team_id, n.visibility)"
        )
    # [[wiki-link]] resolution: a document by the key of its id or of its title.
    # A team's documents with an access list (ACL_HIDDEN): only those carry acl_restricted,
    # so this index stays small and the planner prefers it to (team_id, visibility).
    for prop in ("wiki_id", "wiki_title", "acl_restricted"):
        statements.append(
            f"CREATE INDEX doc_{prop} IF NOT EXISTS FOR (n:Doc) ON (n.team_id, n.{prop})"
        )
    statements.append(
        "CREATE FULLTEXT INDEX entity_names IF NOT EXISTS FOR (n:"
        + "|".join(NODE_LABELS)
        + ") ON EACH [n.name, n.title]"
    )
    return statements


# One statement for a batch of documents. The entities documents name (project, channel,
# agent, author, topics) and the placeholders of their [[links]] are created ``derived``:
# they exist because of documents, and a caller sees one only through a document it may see
# (graph_intents.source_visible). An entity written through /graph/entities (``derived``
# false) is never changed by ingestion: a document only links to it. MERGE on (team_id, id)
# makes re-ingestion a no-op; a re-sent document first loses the edges it wrote before, so
# removed tags, links or a changed project leave no trace. Its access list (acl_allow,
# acl_deny; acl_restricted true, or removed for an open list) is always set, so a re-sent
# document with another ACL is re-permissioned. Both statements return ``affected``: the
# derived nodes around the documents before and after, whose visibility
# ``RECOMPUTE_DERIVED`` then derives again in the same transaction.
# Every relationship joins two nodes of the same team (cypher_guard relies on it).
# Deleting a document (bus event doc.deleted): the Doc node and its edges. Notes that
# [[link]] to it keep their links, now to a placeholder under the deleted note's key, so a
# note re-created later (same id or title) takes them back as MERGE_DOCUMENTS hands over.
DELETE_DOCUMENTS = """
MATCH (doc:Doc {team_id: $team_id})
WHERE doc.id IN $ids AND NOT coalesce(doc.stub, false)
CALL (doc) {
  OPTIONAL MATCH (doc)--(n) WHERE coalesce(n.derived, false)
  RETURN collect(DISTINCT elementId(n)) AS around
}
CALL (doc) {
  WITH doc, coalesce(doc.wiki_id, doc.wiki_title) AS key WHERE key IS NOT NULL
  MATCH (src:Doc)-[old:LINKS_TO]->(doc) WHERE src <> doc AND NOT src.id IN $ids
  MERGE (s:Doc {team_id: doc.team_id, id: 'wiki:' + key})
    ON CREATE SET s.stub = true, s.derived = true, s.title = key,
                  s.visibility = old.visibility, s.doc_type = 'wiki'
  MERGE (src)-[r:LINKS_TO]->(s)
  SET r.team_id = old.team_id, r.visibility = old.visibility
  RETURN collect(DISTINCT elementId(s)) AS placeholders
}
DETACH DELETE doc
WITH count(*) AS deleted, collect(around + placeholders) AS lists
RETURN deleted, reduce(acc = [], l IN lists | acc + l) AS affected
"""

# The visibility of derived nodes, from their documents (non-placeholder ``Doc`` nodes one
# relationship away): public when one is public, else confidential; a derived node no
# document names any more is deleted with its relationships (it existed only because of
# them; write it through /graph/entities to keep it). Keeps caller Cypher, which sees node
# visibility but not sources, inside the rule: a derived node in a caller's visibility has
# a source document in it.
RECOMPUTE_DERIVED = """
UNWIND $affected AS eid
WITH DISTINCT eid
MATCH (n) WHERE elementId(n) = eid AND coalesce(n.derived, false)
WITH n,
  EXISTS { MATCH (n)--(s:Doc) WHERE NOT coalesce(s.stub, false) } AS sourced,
  EXISTS {
    MATCH (n)--(s:Doc) WHERE NOT coalesce(s.stub, false) AND s.visibility = 'public'
  } AS open
CALL (n, sourced, open) {
  WITH n WHERE sourced
  SET n.visibility = CASE WHEN open THEN 'public' ELSE 'confidential' END
}
CALL (n, sourced) {
  WITH n WHERE NOT sourced
  DETACH DELETE n
}
RETURN count(*) AS recomputed
"""

MERGE_DOCUMENTS = """
UNWIND $docs AS d
MERGE (dao:MicroDAO {team_id: d.team_id, id: d.team_id})
  ON CREATE SET dao.name = d.team_id, dao.visibility = 'public', dao.derived = false
MERGE (doc:Doc {team_id: d.team_id, id: d.doc_id})
SET doc.title = d.title, doc.visibility = d.visibility, doc.doc_type = d.doc_type,
    doc.url = d.url, doc.created_at = d.created_at, doc.tags = d.tags,
    doc.project_id = d.project_id, doc.wiki_id = d.wiki_id, doc.wiki_title = d.wiki_title,
    doc.stub = false, doc.derived = false, doc.acl_allow = d.acl_allow,
    doc.acl_deny = d.acl_deny, doc.acl_restricted = d.acl_restricted
WITH d, doc
CALL (doc) {
  CALL (doc) {
    MATCH (doc)-[old:PART_OF|POSTED_IN|MENTIONS|LINKS_TO]->(n) RETURN old, n
    UNION
    MATCH (n)-[old:AUTHORED]->(doc) RETURN old, n
  }
  WITH collect(old) AS edges,
       collect(DISTINCT CASE WHEN coalesce(n.derived, false) THEN elementId(n) END) AS around
  FOREACH (old IN edges | DELETE old)
  RETURN around AS before
}
CALL (d, doc) {
  WITH d, doc WHERE d.project_id <> ''
  MERGE (p:Project {team_id: d.team_id, id: d.project_id})
    ON CREATE SET p.name = d.project_id, p.visibility = d.visibility,
                  p.derived = true
  MERGE (doc)-[r:PART_OF]->(p)
  SET r.team_id = d.team_id, r.visibility = d.visibility
}
CALL (d, doc) {
  WITH d, doc WHERE d.channel_id <> ''
  MERGE (c:Channel {team_id: d.team_id, id: d.channel_id})
    ON CREATE SET c.name = d.channel_id, c.visibility = d.visibility,
                  c.derived = true
  MERGE (doc)-[r:POSTED_IN]->(c)
  SET r.team_id = d.team_id, r.visibility = d.visibility
}
CALL (d, doc) {
  WITH d, doc WHERE d.agent_id <> ''
  MERGE (a:Agent {team_id: d.team_id, id: d.agent_id})
    ON CREATE SET a.name = d.agent_id, a.visibility = d.visibility,
                  a.derived = true
  MERGE (a)-[r:AUTHORED]->(doc)
  SET r.team_id = d.team_id, r.visibility = d.visibility
}
CALL (d, doc) {
  WITH d, doc WHERE d.author_id <> ''
  MERGE (u:User {team_id: d.team_id, id: d.author_id})
    ON CREATE SET u.name = d.author_id, u.visibility = d.visibility,
                  u.derived = true
  MERGE (u)-[r:AUTHORED]->(doc)
  SET r.team_id = d.team_id, r.visibility = d.visibility
}
CALL (d, doc) {
  UNWIND d.tags AS tag
  MERGE (t:Topic {team_id: d.team_id, id: tag})
    ON CREATE SET t.name = tag, t.visibility = d.visibility,
                  t.derived = true
  MERGE (doc)-[r:MENTIONS]->(t)
  SET r.team_id = d.team_id, r.visibility = d.visibility
}
CALL (d, doc) {
  // A placeholder that waited for this document (an earlier [[link]] to it) hands over
  // its incoming links and goes.
  UNWIND [k IN [d.wiki_id, d.wiki_title] WHERE k IS NOT NULL] AS k
  MATCH (stub:Doc {team_id: d.team_id, id: 'wiki:' + k})
  WHERE stub.stub AND stub <> doc
  CALL (stub, doc) {
    MATCH (src:Doc)-[old:LINKS_TO]->(stub)
    MERGE (src)-[r:LINKS_TO]->(doc)
    SET r.team_id = old.team_id, r.visibility = old.visibility
  }
  DETACH DELETE stub
}
CALL (d, doc) {
  // A note's link to its own key ([[Own title]] in "Own title") is a link to itself, first
  // among notes of that key (a self-loop; DELETE_DOCUMENTS leaves no placeholder for it).
  UNWIND d.links AS key
  CALL (d, doc, key) {
    OPTIONAL MATCH (t:Doc {team_id: d.team_id, wiki_id: key})
    WITH doc, t ORDER BY t = doc DESC, t.id LIMIT 1
    RETURN t AS by_id
  }
  CALL (d, doc, key) {
    OPTIONAL MATCH (t:Doc {team_id: d.team_id, wiki_title: key})
    WITH doc, t ORDER BY t = doc DESC, t.id LIMIT 1
    RETURN t AS by_title
  }
  WITH d, doc, key, coalesce(by_id, by_title) AS target
  // A link to a note not ingested yet points at a placeholder until it arrives.
  CALL (d, key, target) {
    WITH d, key, target WHERE target IS NULL
    MERGE (s:Doc {team_id: d.team_id, id: 'wiki:' + key})
      ON CREATE SET s.stub = true, s.derived = true, s.title = key,
                    s.visibility = d.visibility, s.doc_type = 'wiki'
    RETURN s AS placeholder
    UNION
    WITH target WHERE target IS NOT NULL
    RETURN target AS placeholder
  }
  WITH d, doc, placeholder
  MERGE (doc)-[r:LINKS_TO]->(placeholder)
  SET r.team_id = d.team_id, r.visibility = d.visibility
}
CALL (doc) {
  OPTIONAL MATCH (doc)--(n) WHERE coalesce(n.derived, false)
  RETURN collect(DISTINCT elementId(n)) AS after
}
WITH count(doc) AS merged, collect(before + after) AS lists
RETURN merged, reduce(acc = [], l IN lists | acc + l) AS affected
"""

# Readable phrases of the relationship types, for explain_path.
# Entities named in a query (full-text index over names and titles) and the documents one
# relationship away from them, or the documents themselves when a title matched.
RELATED_DOCS = f"""
CALL db.index.fulltext.queryNodes('entity_names', $lucene) YIELD node, score
WHERE node.team_id = $team_id AND node.visibility IN $visibilities
  AND NOT coalesce(node.stub, false) AND {entity_allowed("node")}
WITH node, score ORDER BY score DESC LIMIT $max_entities
CALL (node) {{
  MATCH (node)-[r]-(d:Doc)
  WHERE d.team_id = $team_id AND d.visibility IN $visibilities AND r.visibility IN $visibilities
    AND NOT coalesce(d.stub, false) AND {doc_allowed("d")}
  RETURN d.id AS doc_id
  UNION
  WITH node WHERE node:Doc
  RETURN node.id AS doc_id
}}
WITH doc_id, max(score) AS score, collect(DISTINCT coalesce(node.name, node.title))[..3] AS via
RETURN doc_id, score, via ORDER BY score DESC LIMIT $max_docs
"""

ENTITIES = f"""
CALL db.index.fulltext.queryNodes('entity_names', $lucene) YIELD node, score
WHERE node.team_id = $team_id AND node.visibility IN $visibilities
  AND NOT coalesce(node.stub, false) AND {entity_allowed("node")}
RETURN node, score ORDER BY score DESC LIMIT $max_entities
"""

# The entities an explain_path end names (``$ref``: an id, or a name or title in any case),
# optionally of one label, inside the caller's scope; an exact id first.
RESOLVE = f"""
MATCH (a)
WHERE a.team_id = $team_id AND a.visibility IN $visibilities AND NOT coalesce(a.stub, false)
  AND ($label IS NULL OR $label IN labels(a)) AND {entity_allowed("a")}
  AND (a.id = $ref OR toLower(coalesce(a.name, a.title, '')) = toLower($ref))
RETURN a ORDER BY a.id = $ref DESC, a.id LIMIT $limit
"""

# explain_path's hop bound when the caller names none (the request contract's default; the
# one whose plan a Graph replica makes at start, deployments/graph_store/warmup.py).
DEFAULT_PATH_HOPS = 4


def shortest_paths(hops: int) -> str:
    """Shortest paths of at most ``hops`` relationships between the entities ``$sources``
    and ``$targets`` name (``[label, id]`` pairs), every node and relationship inside the
    caller's scope. The bound is part of the text (Cypher takes no parameter there): one
    plan per bound."""
    return f"""
MATCH (a) WHERE a.team_id = $team_id AND any(k IN $sources WHERE a.id = k[1] AND k[0] IN labels(a))
MATCH (b) WHERE b.team_id = $team_id AND any(k IN $targets WHERE b.id = k[1] AND k[0] IN labels(b))
WITH a, b WHERE a <> b
MATCH p = allShortestPaths((a)-[*..{int(hops)}]-(b))
WHERE all(n IN nodes(p) WHERE n.team_id = $team_id AND n.visibility IN $visibilities
                              AND NOT coalesce(n.stub, false) AND {entity_allowed("n")})
  AND all(r IN relationships(p) WHERE r.visibility IN $visibilities)
RETURN p ORDER BY length(p) LIMIT $max_paths
"""


# Whether some document of the team in the caller's visibility has an access list that does
# not admit the caller (what caller Cypher cannot be trusted with): at most one row.
ACL_HIDDEN = f"""
MATCH (d:Doc)
WHERE d.team_id = $team_id AND d.acl_restricted = true AND d.visibility IN $visibilities
  AND NOT ({acl_allowed("d")})
RETURN d.id AS doc_id LIMIT 1
"""


def merge_nodes(label: str) -> str:
    """MERGE ``$nodes`` (``id``, ``name``, ``properties``, ``visibility``) of one label into
    team ``$team_id``: written directly, so no longer ``derived`` (their visibility is the
    one written from now on). Returns ``changes``: the existing nodes whose visibility the
    write changed or that documents had made (``was_derived``), for the audit log.
    ``label`` must be one of ``NODE_LABELS`` (the caller checks)."""
    return f"""
UNWIND $nodes AS n
OPTIONAL MATCH (old:{label} {{team_id: $team_id, id: n.id}})
WITH n, old IS NOT NULL AS existed, old.visibility AS before,
     coalesce(old.derived, false) AS was_derived
MERGE (x:{label} {{team_id: $team_id, id: n.id}})
SET x += n.properties, x.name = coalesce(n.name, x.name, n.id), x.visibility = n.visibility,
    x.derived = false
WITH x, CASE WHEN existed AND (before <> n.visibility OR was_derived)
  THEN {{id: n.id, before: before, after: n.visibility, was_derived: was_derived}} END AS change
RETURN count(x) AS c, collect(change) AS changes
"""


def merge_relationships(rtype: str, from_label: str, to_label: str) -> str:
    """MERGE ``$rels`` of one type between two labels in team ``$team_id``. A missing end is
    created as written directly, with the relationship's visibility; an existing end is
    never changed (a relationship is visible only where both its ends are). Returns
    ``changes``: existing relationships whose visibility the write changed. Type and labels
    must come from the vocabulary (the caller checks)."""
    return f"""
UNWIND $rels AS r
MERGE (a:{from_label} {{team_id: $team_id, id: r.from_id}})
  ON CREATE SET a.name = r.from_id, a.visibility = r.visibility, a.derived = false
MERGE (b:{to_label} {{team_id: $team_id, id: r.to_id}})
  ON CREATE SET b.name = r.to_id, b.visibility = r.visibility, b.derived = false
WITH r, a, b
OPTIONAL MATCH (a)-[old:{rtype}]->(b)
WITH r, a, b, old.visibility AS before
MERGE (a)-[x:{rtype}]->(b)
SET x += r.properties, x.team_id = $team_id, x.visibility = r.visibility
WITH x, CASE WHEN before IS NOT NULL AND before <> r.visibility
  THEN {{from_id: r.from_id, to_id: r.to_id, before: before, after: r.visibility}} END AS change
RETURN count(x) AS c, collect(change) AS changes
"""


def writable_nodes(label: str) -> str:
    """The existing nodes of one label among ``$ids`` in team ``$team_id``, whether the
    writer's scope holds them (visibility, policies and, for a node documents made, one of
    its documents) and whether documents made them: a write may touch only what its writer
    may see. ``label`` must be one of ``NODE_LABELS``."""
    return f"""
UNWIND $ids AS id
MATCH (x:{label} {{team_id: $team_id, id: id}})
RETURN x.id AS id, x.visibility IN $visibilities AND {entity_allowed("x")} AS writable,
       coalesce(x.derived, false) AS derived
"""


def writable_relationships(rtype: str, from_label: str, to_label: str) -> str:
    """The existing relationships among ``$rels`` whose visibility is outside the writer's
    ``$visibilities`` (a write would change what it may not see). Type and labels must come
    from the vocabulary."""
    return f"""
UNWIND $rels AS r
MATCH (a:{from_label} {{team_id: $team_id, id: r.from_id}})-[x:{rtype}]->
      (b:{to_label} {{team_id: $team_id, id: r.to_id}})
WHERE NOT x.visibility IN $visibilities
RETURN r.from_id AS from_id, r.to_id AS to_id
"""


# Nodes written before ``derived`` existed: those a document links to are taken as made by
# documents (the conservative reading; write them through /graph/entities to keep their own
# visibility), the others as written directly. Run at start in batches of ``$batch`` (each
# its own transaction, so a large graph is marked across starts); a no-op afterwards.
MARK_DERIVED = """
MATCH (n) WHERE n.derived IS NULL
WITH n LIMIT $batch
WITH n, CASE
  WHEN n:Doc THEN coalesce(n.stub, false)
  WHEN n:MicroDAO THEN false
  ELSE EXISTS { MATCH (n)--(:Doc) }
END AS derived
SET n.derived = derived
RETURN count(n) AS marked, collect(CASE WHEN derived THEN elementId(n) END) AS affected
"""


# Lucene's query syntax characters; each is escaped with a backslash.
_LUCENE_SPECIAL = set('+-&|!(){}[]^"~*?:\\/')


def lucene_terms(text: str, max_terms: int = 32) -> str:
    """An OR query of the words of ``text`` for the full-text index, every syntax character
    escaped (no caller text can become a Lucene operator)."""
    words = []
    for raw in text.split():
        word = "".join("\\" + ch if ch in _LUCENE_SPECIAL else ch for ch in raw)
        if word.upper() in ("AND", "OR", "NOT", "TO"):
            word = word.lower()
        if word and word not in words:
            words.append(word)
        if len(words) >= max_terms:
            break
    return " OR ".join(words)
