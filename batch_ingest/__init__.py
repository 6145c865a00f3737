"""Ingestion: source-document contracts, structure-aware chunking and the idempotent
pipeline that embeds chunks, upserts them into Milvus and merges the graph in Neo4j."""
