"""Contract fuzzing of the running gateway with schemathesis: every operation of
``GET /openapi.json``, sent with the suite's API key, must answer below 500, and every 4xx in
the gateway's one error shape (serve_app/errors.py).

What is fuzzed: every operation the live OpenAPI document lists (the search, enrich, graph,
ingest, audit, admin, tools and health routes; a route added later is picked up by itself),
in schemathesis' examples, coverage and fuzzing phases, valid (positive) and invalid
(negative) data: at most ``MAX_EXAMPLES`` fuzzed cases per operation, plus the deterministic
coverage cases (boundary values, missing and wrong-typed fields, malformed bodies,
unexpected HTTP methods). Every request carries ``Authorization: Bearer <api_key>`` (the
``bearer`` security scheme of serve_app/openapi.py; the key is a member of ``KEY_TEAM``).
Security parameters are not generated, so no case sends a second credential (``X-API-Key``
beside it is a 401 by design) or none at all (dev mode would trust the body then). To get
past the tenancy check into the routes' own logic, ``steer`` gives the requests' ``team_id``
the example ``KEY_TEAM`` (the coverage cases are built around it) and the fuzzing phase
draws it in about half of the cases; the tool name of ``POST /tools/{function}`` is one of
the four tools in most cases.

What is not fuzzed, and why:

- ``/mcp`` (the MCP Streamable HTTP endpoint) and the second app under ``/rr``: neither is
  in the OpenAPI document (the MCP route is mounted with ``include_in_schema=False``), so
  schemathesis has nothing to generate from; tests/serve/test_mcp_serve.py covers /mcp.
- Writes into ``KEY_TEAM``'s documents: a ``POST /ingest/documents`` or
  ``POST /ingest/events`` case whose body names ``KEY_TEAM`` anywhere is not sent.
  tests/serve/test_mcp_serve.py relies on nothing being indexed in that team. The same
  operations are still fuzzed for every other body: a document or event of any other team
  is refused by the key's tenancy (403) before anything is written.
- Nothing else is skipped. ``POST /admin/reindex`` is fuzzed too: the key is a member, not
  an owner, of its team and has no ``admin:reindex`` permission, so every reindex is
  refused (403 reindex_not_granted) and no job starts; a 2xx there fails the test (a
  tenancy bug, and a slow Ray job left running). ``POST /graph/entities`` is fuzzed with
  ``KEY_TEAM`` too: a member may not write the graph (403 write_not_granted under the
  default policy), and no test reads that team's graph should the policy change.

The run is seeded (``SEED``), shrinking is off (a failing case is reported as found, with
its curl command and response) and the example database is not used, so a CI run sends the
same requests each time (~1,800 over 16 operations) in a bounded time (~60 s on 2 cores).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any

import httpx
import pytest
import schemathesis
from schemathesis.checks import not_a_server_error

from tests.serve.conftest import KEY_TEAM

pytestmark = pytest.mark.serve

# RAG_TEST_FUZZ_SEED=<int> explores other cases (a failure prints the curl command to replay).
SEED = int(os.environ.get("RAG_TEST_FUZZ_SEED") or 20260101)
MAX_EXAMPLES = 15
REQUEST_TIMEOUT_S = 60
TOOLS = ("rag_search_docs", "rag_enrich_answer", "graph_query_context", "graph_explain_path")
# Operations that would index documents in the team the request names.
INGEST_PATHS = ("/ingest/documents", "/ingest/events")
# The optional keys of the gateway's error body (serve_app/errors.py) and their types.
OPTIONAL_ERROR_KEYS: dict[str, type | tuple[type, ...]] = {
    "hint": (str, type(None)),
    "reason": str,
    "fields": list,
}

# Responses per (operation, status), and the cases not sent (writes_key_team), for the
# summary printed at the end of the module (pytest -s shows it).
SEEN: Counter[tuple[str, int]] = Counter()
NOT_SENT: Counter[str] = Counter()


def fuzz_config(base_url: str, api_key: str) -> schemathesis.Config:
    """The schemathesis configuration of the run (the keys of a ``schemathesis.toml``)."""
    return schemathesis.Config.from_dict(
        {
            "seed": SEED,
            "base-url": base_url,
            "headers": {"Authorization": f"Bearer {api_key}"},
            "request-timeout": REQUEST_TIMEOUT_S,
            "generation": {
                "max-examples": MAX_EXAMPLES,
                "with-security-parameters": False,
                "no-shrink": True,
                "database": "none",
            },
            # Stateful links: the API has none worth following (no created resources).
            "phases": {"stateful": {"enabled": False}},
            "dictionaries": {"teams": {"values": [KEY_TEAM]}, "tools": {"values": list(TOOLS)}},
            "parameters": {
                "body.team_id": {"dictionary": "teams", "probability": 0.5},
                "query.team_id": {"dictionary": "teams", "probability": 0.5},
                "path.function": {"dictionary": "tools", "probability": 0.8},
            },
        }
    )


def steer(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with ``examples`` that steer the fuzzer past the tenancy check: ``KEY_TEAM``
    for the ``team_id`` of every request but the ingest ones (their bodies stay random, see
    the module docstring), the four tool names for ``/tools/{function}``, and a search
    query as the tools' arguments. The coverage and examples phases build their cases around
    a schema's examples; without them nearly every valid case is a 403 team_not_granted."""
    schemas = doc.get("components", {}).get("schemas", {})
    for path, item in doc.get("paths", {}).items():
        for operation in item.values():
            if not isinstance(operation, dict):
                continue
            for parameter in operation.get("parameters", []):
                if parameter.get("name") == "team_id":
                    parameter.setdefault("schema", {})["examples"] = [KEY_TEAM]
                elif path == "/tools/{function}" and parameter.get("name") == "function":
                    parameter.setdefault("schema", {})["examples"] = list(TOOLS)
            body = (
                operation.get("requestBody", {})
                .get("content", {})
                .get("application/json", {})
                .get("schema", {})
            )
            if path == "/tools/{function}":
                body["examples"] = [{"query": "Milvus hybrid search"}]
            if path in INGEST_PATHS:
                continue
            model = schemas.get(str(body.get("$ref", "")).rsplit("/", 1)[-1], {})
            team = model.get("properties", {}).get("team_id")
            if isinstance(team, dict):
                team["examples"] = [KEY_TEAM]
    return doc


@pytest.fixture(scope="module")
def gateway_schema(gateway: str, api_key: str):
    """The live app's OpenAPI document (``steer``-ed), loaded by schemathesis."""
    r = httpx.get(f"{gateway}/openapi.json", timeout=30)
    assert r.status_code == 200, r.text
    yield schemathesis.openapi.from_dict(steer(r.json()), config=fuzz_config(gateway, api_key))
    if SEEN:
        per_status = Counter[int]()
        for (_, status), count in SEEN.items():
            per_status[status] += count
        operations = len({label for label, _ in SEEN})
        print(
            f"\ncontract fuzz: {sum(SEEN.values())} requests over {operations} operations, "
            f"statuses {dict(sorted(per_status.items()))}; not sent (KEY_TEAM writes): "
            f"{sum(NOT_SENT.values())}"
        )


schema = schemathesis.pytest.from_fixture("gateway_schema")


@pytest.fixture(autouse=True)
def node_id_for_schemathesis(request: pytest.FixtureRequest) -> None:
    """schemathesis 4.32.5 reads and rewrites ``item._nodeid`` around each operation of a
    ``from_fixture`` schema, an attribute pytest 9.2 no longer has (``item._id`` now): give
    it one so the run starts (its rewrite only renamed the report of each operation)."""
    if not hasattr(request.node, "_nodeid"):
        request.node._nodeid = request.node.nodeid


def writes_key_team(case: schemathesis.Case) -> bool:
    """Whether ``case`` would index documents in ``KEY_TEAM`` (see the module docstring)."""
    if case.operation.path not in INGEST_PATHS:
        return False
    try:
        return KEY_TEAM in json.dumps(case.body, default=str)
    except (TypeError, ValueError):
        return KEY_TEAM in repr(case.body)


def gateway_error_shape(ctx: Any, response: schemathesis.Response, case: schemathesis.Case):
    """A 4xx/5xx answer is ``application/json`` with the body of serve_app/errors.py:
    ``{"error": <code>, "message": <text>, "trace_id": <id>, "hint"?, "reason"?, "fields"?}``."""
    if response.status_code < 400:
        return None
    content_type = (response.headers.get("content-type") or [""])[0]
    assert content_type.split(";")[0].strip() == "application/json", (
        f"error answer {response.status_code} with content-type {content_type!r}, not "
        f"application/json: {response.text_lossy()[:500]!r}"
    )
    try:
        body = response.json()
    except ValueError as exc:
        detail = f"error answer is not JSON ({exc}): {response.text_lossy()[:500]!r}"
        raise AssertionError(detail) from None
    assert isinstance(body, dict), f"error body is not a JSON object: {body!r}"
    for key in ("error", "message", "trace_id"):
        assert isinstance(body.get(key), str) and body[key], (
            f"error body without a non-empty string {key!r} (serve_app/errors.py shape): {body!r}"
        )
    for key, kind in OPTIONAL_ERROR_KEYS.items():
        if key in body:
            assert isinstance(body[key], kind), f"error body's {key!r} is {body[key]!r}: {body!r}"
    for item in body.get("fields") or []:
        assert isinstance(item, dict) and isinstance(item.get("field"), str), (
            f"error body's fields[] entry without a 'field': {body!r}"
        )
    return None


def reindex_refused(ctx: Any, response: schemathesis.Response, case: schemathesis.Case):
    """The suite's key (a member, no ``admin:reindex``) never starts a reindex."""
    if case.operation.path == "/admin/reindex" and case.method.upper() == "POST":
        assert response.status_code >= 400, (
            f"POST /admin/reindex with a member's key answered {response.status_code}: "
            f"{response.text_lossy()[:500]!r}"
        )
    return None


@schema.parametrize()
def test_every_operation_answers_in_the_gateway_contract(case: schemathesis.Case):
    if writes_key_team(case):
        NOT_SENT[case.operation.label] += 1
        return
    response = case.call()
    SEEN[(case.operation.label, response.status_code)] += 1
    case.validate_response(
        response, checks=[not_a_server_error, gateway_error_shape, reindex_refused]
    )
