"""Security tests: attacks on one door each, and tenancy properties, against the real
services (docs/LAYOUT: out of the tests root's feature folders). They share the integration
suite's fixtures (the real Milvus, Neo4j and settings of this run), and the unit suite's
gateway-environment fixtures (tests/gateway_env.py) for the in-process gateway of the leak
probes and tenancy properties, which need no service."""

from tests.gateway_env import audit_in_tmp, clean_gateway_env
from tests.integration.conftest import graph, settings

__all__ = ["audit_in_tmp", "clean_gateway_env", "graph", "settings"]
