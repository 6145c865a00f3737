"""The unit suite's fixtures (tests/gateway_env.py, shared with tests/security/)."""

from tests.gateway_env import audit_in_tmp, clean_gateway_env

__all__ = ["audit_in_tmp", "clean_gateway_env"]
