"""The graph's Cypher text and vocabulary (docs/graph_schema.md): node labels, relationship
types, the schema statements, the trusted statements ingestion and search run, and the
Lucene escaping of full-text queries."""

from __future__ import annotations

from deployments.graph_intents import acl_allowed, doc_allowed, entity_allowed

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


# One statement for a batch of documents. An entity node (project, channel, agent, user,
# topic) is public as soon as one public document names it; a confidential-only entity stays
# confidential. MERGE on (team_id, id) makes re-ingestion a no-op; a re-sent document first
# loses the edges it wrote before, so removed tags, links or a changed project leave no trace.
# Its access list (acl_allow, acl_deny; acl_restricted true, or removed for an open list) is
# always set, so a re-sent document with another ACL is re-permissioned.
# Every relationship joins two nodes of the same team (cypher_guard relies on it).
# Deleting a document (bus event doc.deleted): the Doc node and its edges only. Notes that
# [[link]] to it keep their links, now to a placeholder under the deleted note's key, so a
# note re-created later (same id or title) takes them back as MERGE_DOCUMENTS hands over.
DELETE_DOCUMENTS = """
MATCH (doc:Doc {team_id: $team_id})
WHERE doc.id IN $ids AND NOT coalesce(doc.stub, false)
CALL (doc) {
  WITH doc, coalesce(doc.wiki_id, doc.wiki_title) AS key WHERE key IS NOT NULL
  MATCH (src:Doc)-[old:LINKS_TO]->(doc) WHERE src <> doc AND NOT src.id IN $ids
  MERGE (s:Doc {team_id: doc.team_id, id: 'wiki:' + key})
    ON CREATE SET s.stub = true, s.title = key, s.visibility = old.visibility,
                  s.doc_type = 'wiki'
  SET s.visibility = CASE WHEN old.visibility = 'public' THEN 'public' ELSE s.visibility END
  MERGE (src)-[r:LINKS_TO]->(s)
  SET r.team_id = old.team_id, r.visibility = old.visibility
}
DETACH DELETE doc
RETURN count(*) AS deleted
"""

MERGE_DOCUMENTS = """
UNWIND $docs AS d
MERGE (dao:MicroDAO {team_id: d.team_id, id: d.team_id})
  ON CREATE SET dao.name = d.team_id, dao.visibility = 'public'
MERGE (doc:Doc {team_id: d.team_id, id: d.doc_id})
SET doc.title = d.title, doc.visibility = d.visibility, doc.doc_type = d.doc_type,
    doc.url = d.url, doc.created_at = d.created_at, doc.tags = d.tags,
    doc.project_id = d.project_id, doc.wiki_id = d.wiki_id, doc.wiki_title = d.wiki_title,
    doc.stub = false, doc.acl_allow = d.acl_allow, doc.acl_deny = d.acl_deny,
    doc.acl_restricted = d.acl_restricted
WITH d, doc
CALL (doc) {
  OPTIONAL MATCH (doc)-[old:PART_OF|POSTED_IN|MENTIONS|LINKS_TO]->()
  DELETE old
}
CALL (doc) {
  OPTIONAL MATCH ()-[old:AUTHORED]->(doc)
  DELETE old
}
CALL (d, doc) {
  WITH d, doc WHERE d.project_id <> ''
  MERGE (p:Project {team_id: d.team_id, id: d.project_id})
    ON CREATE SET p.name = d.project_id, p.visibility = d.visibility
  SET p.visibility = CASE WHEN d.visibility = 'public' THEN 'public' ELSE p.visibility END
  MERGE (doc)-[r:PART_OF]->(p)
  SET r.team_id = d.team_id, r.visibility = d.visibility
}
CALL (d, doc) {
  WITH d, doc WHERE d.channel_id <> ''
  MERGE (c:Channel {team_id: d.team_id, id: d.channel_id})
    ON CREATE SET c.name = d.channel_id, c.visibility = d.visibility
  SET c.visibility = CASE WHEN d.visibility = 'public' THEN 'public' ELSE c.visibility END
  MERGE (doc)-[r:POSTED_IN]->(c)
  SET r.team_id = d.team_id, r.visibility = d.visibility
}
CALL (d, doc) {
  WITH d, doc WHERE d.agent_id <> ''
  MERGE (a:Agent {team_id: d.team_id, id: d.agent_id})
    ON CREATE SET a.name = d.agent_id, a.visibility = d.visibility
  SET a.visibility = CASE WHEN d.visibility = 'public' THEN 'public' ELSE a.visibility END
  MERGE (a)-[r:AUTHORED]->(doc)
  SET r.team_id = d.team_id, r.visibility = d.visibility
}
CALL (d, doc) {
  WITH d, doc WHERE d.author_id <> ''
  MERGE (u:User {team_id: d.team_id, id: d.author_id})
    ON CREATE SET u.name = d.author_id, u.visibility = d.visibility
  SET u.visibility = CASE WHEN d.visibility = 'public' THEN 'public' ELSE u.visibility END
  MERGE (u)-[r:AUTHORED]->(doc)
  SET r.team_id = d.team_id, r.visibility = d.visibility
}
CALL (d, doc) {
  UNWIND d.tags AS tag
  MERGE (t:Topic {team_id: d.team_id, id: tag})
    ON CREATE SET t.name = tag, t.visibility = d.visibility
  SET t.visibility = CASE WHEN d.visibility = 'public' THEN 'public' ELSE t.visibility END
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
      ON CREATE SET s.stub = true, s.title = key, s.visibility = d.visibility,
                    s.doc_type = 'wiki'
    SET s.visibility = CASE WHEN d.visibility = 'public' THEN 'public' ELSE s.visibility END
    RETURN s AS placeholder
    UNION
    WITH target WHERE target IS NOT NULL
    RETURN target AS placeholder
  }
  WITH d, doc, placeholder
  MERGE (doc)-[r:LINKS_TO]->(placeholder)
  SET r.team_id = d.team_id, r.visibility = d.visibility
}
RETURN count(doc) AS merged
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
    team ``$team_id``. ``label`` must be one of ``NODE_LABELS`` (the caller checks)."""
    return f"""
UNWIND $nodes AS n
MERGE (x:{label} {{team_id: $team_id, id: n.id}})
SET x += n.properties, x.name = coalesce(n.name, x.name, n.id), x.visibility = n.visibility
RETURN count(x) AS c
"""


def merge_relationships(rtype: str, from_label: str, to_label: str) -> str:
    """MERGE ``$rels`` of one type between two labels in team ``$team_id``; missing ends are
    created with the relationship's visibility, and a public relationship makes its ends
    public. Type and labels must come from the vocabulary (the caller checks)."""
    return f"""
UNWIND $rels AS r
MERGE (a:{from_label} {{team_id: $team_id, id: r.from_id}})
  ON CREATE SET a.name = r.from_id, a.visibility = r.visibility
SET a.visibility = CASE WHEN r.visibility = 'public' THEN 'public' ELSE a.visibility END
MERGE (b:{to_label} {{team_id: $team_id, id: r.to_id}})
  ON CREATE SET b.name = r.to_id, b.visibility = r.visibility
SET b.visibility = CASE WHEN r.visibility = 'public' THEN 'public' ELSE b.visibility END
MERGE (a)-[x:{rtype}]->(b)
SET x += r.properties, x.team_id = $team_id, x.visibility = r.visibility
RETURN count(x) AS c
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
