"""The graph store backend: Neo4j, its Cypher guard and scope, and the Serve shell."""
