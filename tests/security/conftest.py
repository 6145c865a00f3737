"""Security tests: attacks on one door each, and tenancy properties, against the real
services (docs/LAYOUT: out of the tests root's feature folders). They share the integration
suite's fixtures (the real Milvus, Neo4j and settings of this run)."""

from tests.integration.conftest import graph, settings

__all__ = ["graph", "settings"]
