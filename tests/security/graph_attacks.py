"""What the graph probes send as an attacker would: injections in place of entity
references (Cypher and Lucene syntax, parameter names, control characters), Lucene queries
for the full-text index, caller Cypher the plan check must refuse (every team, another
team, unions, subqueries, procedures, comments that hide the scope, unbounded paths), Cypher
that writes (creates, sets, deletes, merges, schema and configuration changes, ``LOAD
CSV``) and scoped Cypher that passes the check and must return only the caller's scope.
"""

from __future__ import annotations

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
