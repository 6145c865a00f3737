"""The shipped configuration with authentication on, over HTTP on the suite's Ray cluster:
contract fuzzing with schemathesis, the closed operator surface, and the request limits.

The app under test is ``serve_config.yaml``'s application (its ``args`` — the settings of the
shipped file — with ``AUTH__MODE=jwt`` and an HS256 secret, as the issue's probe ran it),
deployed as ``rag_jwt`` under ``/jwt`` beside the suite's dev-mode apps and deleted at the end
of the module. Changed beyond the shipped args, for the test only: the suite's Milvus
collection, and the rate limits raised (the fuzz run sends ~50 requests/s with one credential,
over the default limit, which tests/unit/serve_app/http/test_rate_limits.py covers).

**Fuzzing.** Every operation of the app's ``GET /openapi.json`` (fetched with a credential:
the catalogue is closed) in schemathesis' examples, coverage and fuzzing phases, valid
(positive) and invalid (negative) data: at most ``MAX_EXAMPLES`` fuzzed cases per operation,
plus the deterministic coverage cases. Every request carries ``Authorization: Bearer <JWT>``
of a member of ``KEY_TEAM`` who may read the audit log and the usage ledger
(``audit:read``, so those operations get past the permission check). Security parameters are
not generated, so no case sends a second credential or none at all. Each answer must

- be no 5xx (``not_a_server_error``);
- be in the gateway's one error shape when it is a 4xx (``gateway_error_shape``);
- accept what the schema calls valid (``positive_data_acceptance``, ST202): the OpenAPI
  document may not promise more than the server takes. A JSON Schema cannot compare two
  fields; the rules that do are in the fields' descriptions and listed in
  ``DOCUMENTED_RULES``, and a 422 naming only those is counted, not failed;
- not answer a 2xx when the credential is removed or replaced by an invalid one
  (``ignored_auth``, ST401: schemathesis resends the request after a 2xx);
- never start a reindex (``reindex_refused``: the member has no ``admin:reindex``).

Schema-violating data the server accepts anyway (``negative_data_rejection``, ST201: the
server is more lenient than the schema, e.g. a number for a date) is counted and printed,
not failed. To get past the tenancy check, ``steer`` gives the requests' ``team_id`` the
example ``KEY_TEAM`` and the fuzzing phase draws it in about half of the cases.

Not fuzzed, and why: ``/mcp`` (not in the OpenAPI document; tests/serve/test_mcp_serve.py
covers it); writes into ``KEY_TEAM``'s documents (a ``POST /ingest/documents`` or
``POST /ingest/events`` case whose body names ``KEY_TEAM`` is not sent: the suite's other
tests rely on nothing being indexed in that team; any other team is refused by the
credential's tenancy, 403, before anything is written). ``POST /admin/reindex`` and
``POST /graph/entities`` are fuzzed: a member may do neither (403).

The run is seeded (``SEED``), shrinking is off and the example database is not used, so a CI
run sends the same requests each time (~3,800 over 20 operations, ~2 min on 2 cores).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
import yaml
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    ignored_auth,
    negative_data_rejection,
    positive_data_acceptance,
)

from serve_app.testing import AUDIENCE, ISSUER, SECRET, claims, mint
from tests.serve.conftest import KEY_TEAM, wait_ready

pytestmark = pytest.mark.serve

SERVE_CONFIG = Path(__file__).resolve().parents[2] / "serve_config.yaml"
PREFIX = "/jwt"
# RAG_TEST_FUZZ_SEED=<int> explores other cases (a failure prints the curl command to replay).
SEED = int(os.environ.get("RAG_TEST_FUZZ_SEED") or 20260101)
MAX_EXAMPLES = 15
REQUEST_TIMEOUT_S = 60
# Operations that would index documents in the team the request names.
INGEST_PATHS = ("/ingest/documents", "/ingest/events")
# The optional keys of the gateway's error body (serve_app/http/errors.py) and their types.
OPTIONAL_ERROR_KEYS: dict[str, type | tuple[type, ...]] = {
    "hint": (str, type(None)),
    "reason": str,
    "fields": list,
}
# 422s for rules between two values, which no JSON Schema states (each is in the
# description of its field or operation): a problem text starting like one of these.
DOCUMENTED_RULES = (
    "since must not be after until",  # GET /audit/decisions, GET /admin/usage
    "Value error, created_from must not be after created_to",  # search and enrich filters
    "created_from must not be after created_to",  # the same through a tool's arguments
)
DUPLICATE_DOCUMENT = "is already documents."  # POST /ingest/documents: (team_id, doc_id) once

# Responses per (operation, status); failures per check code (counted or failed); the
# positive cases refused by a documented rule; the cases not sent (writes into KEY_TEAM).
SEEN: Counter[tuple[str, int]] = Counter()
FOUND: Counter[str] = Counter()
EXCUSED: Counter[str] = Counter()
NOT_SENT: Counter[str] = Counter()
# 2xx answers per operation whose credential schemathesis removed and replaced (ST401 probes).
AUTH_CONFIRMED: Counter[str] = Counter()
AUTH_PROBES = 3
# The fuzzing credential (set when the schema is loaded).
CREDENTIAL: dict[str, str] = {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shipped_settings(collection: str) -> dict[str, Any]:
    """serve_config.yaml's settings with JWT on, the suite's collection and high rate limits."""
    raw = yaml.safe_load(SERVE_CONFIG.read_text())
    settings = raw["applications"][0]["args"]["settings"]
    settings["auth"] = {
        "mode": "jwt",
        "hs256_secret": SECRET,
        "issuer": ISSUER,
        "audience": AUDIENCE,
    }
    settings["milvus"]["collection"] = collection
    # A third app on the 2 CPUs start.sh gives Ray: its Embedder asks for none of its own (the
    # suite's gateway holds 1.3 of them, and reindexes beside it).
    settings["embedder"] = {**settings.get("embedder", {}), "num_cpus": 0}
    settings["rate_limit"] = {
        "per_credential_per_s": 10_000,
        "per_credential_burst": 10_000,
        "per_team_per_s": 10_000,
        "per_team_burst": 10_000,
    }
    return settings


@pytest.fixture(scope="module")
def jwt_app(gateway: str, run_id: str):
    """Base URL of the shipped app with JWT on (``rag_jwt`` under ``/jwt``)."""
    from ray import serve

    from serve_app.app import AppArgs, build_app

    raw = yaml.safe_load(SERVE_CONFIG.read_text())
    args = AppArgs.model_validate(
        {**raw["applications"][0]["args"], "settings": shipped_settings(f"serve_{run_id}")}
    )
    serve.run(build_app(args), name="rag_jwt", route_prefix=PREFIX)
    wait_ready(gateway + PREFIX)
    yield gateway + PREFIX
    serve.delete("rag_jwt")


def token(**overrides: Any) -> str:
    """A JWT of the test's identity provider (the HS256 secret above), valid for an hour."""
    now = int(time.time())
    return mint(claims(**{"iat": now, "nbf": now, "exp": now + 3600, **overrides}))


def member_token() -> str:
    return token(sub="svc_fuzz", teams={KEY_TEAM: ["member"]}, permissions=["audit:read"])


def fuzz_config(base_url: str, credential: str) -> schemathesis.Config:
    """The schemathesis configuration of the run (the keys of a ``schemathesis.toml``)."""
    return schemathesis.Config.from_dict(
        {
            "seed": SEED,
            "base-url": base_url,
            "headers": {"Authorization": f"Bearer {credential}"},
            "request-timeout": REQUEST_TIMEOUT_S,
            "generation": {
                "max-examples": MAX_EXAMPLES,
                "with-security-parameters": False,
                "no-shrink": True,
                "database": "none",
            },
            # Stateful links: the API has none worth following (no created resources).
            "phases": {"stateful": {"enabled": False}},
            "dictionaries": {"teams": {"values": [KEY_TEAM]}},
            "parameters": {
                "body.team_id": {"dictionary": "teams", "probability": 0.5},
                "query.team_id": {"dictionary": "teams", "probability": 0.5},
            },
        }
    )


def steer(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with ``examples`` that steer the fuzzer past the tenancy check: ``KEY_TEAM``
    for the ``team_id`` of every request but the ingest ones (their bodies stay random, see
    the module docstring), and a search query for the search tool. The coverage and examples
    phases build their cases around a schema's examples; without them nearly every valid case
    is a 403 team_not_granted."""
    schemas = doc.get("components", {}).get("schemas", {})
    for path, item in doc.get("paths", {}).items():
        for operation in item.values():
            if not isinstance(operation, dict):
                continue
            for parameter in operation.get("parameters", []):
                if parameter.get("name") == "team_id":
                    parameter.setdefault("schema", {})["examples"] = [KEY_TEAM]
            body = (
                operation.get("requestBody", {})
                .get("content", {})
                .get("application/json", {})
                .get("schema", {})
            )
            if path == "/tools/rag_search_docs":
                body["examples"] = [{"query": "Milvus hybrid search"}]
            if path in INGEST_PATHS:
                continue
            model = schemas.get(str(body.get("$ref", "")).rsplit("/", 1)[-1], {})
            team = model.get("properties", {}).get("team_id")
            if isinstance(team, dict):
                team["examples"] = [KEY_TEAM]
    return doc


@pytest.fixture(scope="module")
def gateway_schema(jwt_app: str):
    """The JWT app's OpenAPI document (``steer``-ed), loaded by schemathesis."""
    credential = CREDENTIAL["member"] = member_token()
    r = httpx.get(f"{jwt_app}/openapi.json", headers=bearer(credential), timeout=30)
    assert r.status_code == 200, r.text
    yield schemathesis.openapi.from_dict(steer(r.json()), config=fuzz_config(jwt_app, credential))
    if SEEN:
        per_status = Counter[int]()
        for (_, status), count in SEEN.items():
            per_status[status] += count
        operations = len({label for label, _ in SEEN})
        print(
            f"\ncontract fuzz: {sum(SEEN.values())} requests over {operations} operations, "
            f"statuses {dict(sorted(per_status.items()))}; failures by check "
            f"{dict(sorted(FOUND.items()))}; positive cases refused by a documented rule "
            f"{dict(sorted(EXCUSED.items()))}; credential probes (ST401) after "
            f"{sum(AUTH_CONFIRMED.values())} 2xx over "
            f"{sum(1 for n in AUTH_CONFIRMED.values() if n)} operations; not "
            f"sent (KEY_TEAM writes): {sum(NOT_SENT.values())}"
        )


schema = schemathesis.pytest.from_fixture("gateway_schema")


@pytest.fixture(autouse=True)
def node_id_for_schemathesis(request: pytest.FixtureRequest) -> None:
    """schemathesis 4.32.5 reads and rewrites ``item._nodeid`` around each operation of a
    ``from_fixture`` schema, an attribute pytest 9.2 no longer has (``item._id`` now): give
    it one so the run starts (its rewrite only renamed the report of each operation)."""
    if not hasattr(request.node, "_nodeid"):
        request.node._nodeid = request.node.nodeid


def bearer(credential: str) -> dict[str, str]:
    return {"authorization": f"Bearer {credential}"}


def writes_key_team(case: schemathesis.Case) -> bool:
    """Whether ``case`` would index documents in ``KEY_TEAM`` (see the module docstring)."""
    if case.operation.path not in INGEST_PATHS:
        return False
    try:
        return KEY_TEAM in json.dumps(case.body, default=str)
    except (TypeError, ValueError):
        return KEY_TEAM in repr(case.body)


def gateway_error_shape(ctx: Any, response: schemathesis.Response, case: schemathesis.Case):
    """A 4xx/5xx answer is ``application/json`` with the body of serve_app/http/errors.py:
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
            f"error body without a non-empty string {key!r} "
            f"(serve_app/http/errors.py shape): {body!r}"
        )
    for key, kind in OPTIONAL_ERROR_KEYS.items():
        if key in body:
            assert isinstance(body[key], kind), f"error body's {key!r} is {body[key]!r}: {body!r}"
    for item in body.get("fields") or []:
        assert isinstance(item, dict) and isinstance(item.get("field"), str), (
            f"error body's fields[] entry without a 'field': {body!r}"
        )
    return None


def documented_rule(response: schemathesis.Response) -> str | None:
    """The documented cross-field rule a 422 names (every problem of it one), else None."""
    if response.status_code != 422:
        return None
    try:
        problems = [str(f.get("problem", "")) for f in response.json().get("fields") or []]
    except (ValueError, AttributeError):
        return None
    rules = set()
    for problem in problems:
        rule = next((r for r in DOCUMENTED_RULES if problem.startswith(r)), None)
        if rule is None and DUPLICATE_DOCUMENT in problem:
            rule = DUPLICATE_DOCUMENT
        if rule is None:
            return None
        rules.add(rule)
    return " + ".join(sorted(rules)) if rules else None


def positive_accepted(ctx: Any, response: schemathesis.Response, case: schemathesis.Case):
    """``positive_data_acceptance`` on the cases whose every part is valid, except a 422
    that names only ``DOCUMENTED_RULES``. (schemathesis 4.32.5 marks a coverage case positive
    when the parameter it varies is, even where it kept an invalid body from another
    scenario, such as ``prefer: null`` with the body ``0``: not valid data.)"""
    meta = case.meta
    if meta is None or not all(c.mode.is_positive for c in meta.components.values()):
        return None
    rule = documented_rule(response)
    if rule is not None:
        EXCUSED[f"{case.operation.label}: {rule}"] += 1
        return None
    return positive_data_acceptance(ctx, response, case)


def reindex_refused(ctx: Any, response: schemathesis.Response, case: schemathesis.Case):
    """The suite's member never starts a reindex."""
    if case.operation.path == "/admin/reindex" and case.method.upper() == "POST":
        assert response.status_code >= 400, (
            f"POST /admin/reindex with a member's credential answered {response.status_code}: "
            f"{response.text_lossy()[:500]!r}"
        )
    return None


def code_of(failure: Exception) -> str:
    return str(getattr(failure, "code", "") or type(failure).__name__)


@schema.parametrize()
def test_every_operation_answers_in_the_gateway_contract(case: schemathesis.Case):
    if writes_key_team(case):
        NOT_SENT[case.operation.label] += 1
        return
    response = case.call()
    label = case.operation.label
    SEEN[(label, response.status_code)] += 1
    try:
        case.validate_response(response, checks=[negative_data_rejection])
    except FailureGroup as counted:
        FOUND.update(f"{code_of(f)} (counted)" for f in counted.exceptions)
    checks = [not_a_server_error, gateway_error_shape, positive_accepted, reindex_refused]
    # ignored_auth resends a 2xx without the credential and with an invalid one; as in
    # schemathesis' own runner, a few confirmations per operation are enough.
    probe_auth = response.status_code < 300 and AUTH_CONFIRMED[label] < AUTH_PROBES
    if probe_auth:
        checks.append(ignored_auth)
    try:
        # The credential passed as the check's headers: the check then knows it was sent on
        # purpose (not generated) and probes without it.
        case.validate_response(response, checks=checks, headers=bearer(CREDENTIAL["member"]))
    except FailureGroup as failed:
        FOUND.update(code_of(f) for f in failed.exceptions)
        raise
    AUTH_CONFIRMED[label] += probe_auth


# --- the operator surface and the request limits of the same app -------------------------

CATALOG = ("/docs", "/redoc", "/openapi.json", "/tools", "/tools?format=openai")


def test_the_shipped_config_with_jwt_serves_no_catalogue_or_details_anonymously(jwt_app: str):
    for path in CATALOG:
        r = httpx.get(jwt_app + path, timeout=30)
        assert r.status_code == 401 and r.json()["error"] == "unauthorized", (path, r.text[:200])
        assert httpx.get(jwt_app + path, headers=bearer(member_token()), timeout=30).is_success
    ready = httpx.get(jwt_app + "/readyz", timeout=30)
    assert ready.status_code == 200, ready.text
    body = ready.json()
    assert all(set(part) == {"ready"} for part in body["components"].values()), body
    # The details are there for a caller holding the details permission.
    ops = httpx.get(jwt_app + "/readyz", headers=bearer(token(permissions=["ops:read"])))
    text = json.dumps(ops.json())
    assert "19530" in text and "7687" in text and "timing" in text, text[:500]


def nested(levels: int) -> Any:
    value: Any = "leaf"
    for _ in range(levels):
        value = {"k": value}
    return value


def test_deep_params_are_422_in_the_ingress_not_503_from_the_graph_replica(jwt_app: str):
    owner = token(teams={f"{KEY_TEAM}_graph": ["owner"]})
    body = {
        "team_id": f"{KEY_TEAM}_graph",
        "cypher": "MATCH (n) WHERE n.team_id = $team_id RETURN count(n) AS c",
        "params": {"p": nested(900)},
    }
    r = httpx.post(f"{jwt_app}/graph/query", json=body, headers=bearer(owner), timeout=60)
    assert r.status_code == 422, r.text[:300]
    assert r.json()["fields"][0]["field"] == "params"
    body["params"] = {"p": nested(30)}  # 32 levels in all: answered by the Graph replica
    r = httpx.post(f"{jwt_app}/graph/query", json=body, headers=bearer(owner), timeout=60)
    assert r.status_code == 200, r.text[:300]


def raw_get(base: str, target: str) -> tuple[int, str, bytes]:
    """``GET target`` on a raw socket (no client-side URL limits): status, content type, body."""
    host, port = base.removeprefix("http://").split("/")[0].split(":")
    data = b""
    with socket.create_connection((host, int(port)), timeout=60) as s:
        try:
            s.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            while chunk := s.recv(65536):
                data += chunk
        except (BrokenPipeError, ConnectionResetError):
            # The front answered and closed before reading it all: its answer, if it came.
            with contextlib.suppress(OSError):
                while chunk := s.recv(65536):
                    data += chunk
    if not data:
        return 0, "", b""  # closed without an answer the client could read
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    ctype = next(
        (v for k, _, v in (h.partition(": ") for h in lines[1:]) if k.lower() == "content-type"), ""
    )
    return int(lines[0].split()[1]), ctype, body


def test_long_urls_get_414_in_the_error_shape_up_to_what_the_proxy_parses(jwt_app: str):
    path = PREFIX + "/healthz?q="
    status, ctype, _ = raw_get(jwt_app, path + "a" * (8000 - len(path)))
    assert status == 200, (status, ctype)
    haproxy = os.environ.get("RAY_SERVE_ENABLE_HA_PROXY") == "1"  # the shipped front
    for size in (9000, 12_288) if haproxy else (9000, 12_288, 65_535):
        status, ctype, body = raw_get(jwt_app, path + "a" * (size - len(path)))
        assert status == 414 and ctype == "application/json", (size, status, ctype, body[:200])
        assert json.loads(body)["error"] == "uri_too_long"
    # A request head the HTTP front cannot parse is answered before any ASGI code runs
    # (docs/operations.md, "Request limits"): the one answer outside the error shape.
    for size in (20_000, 1_000_000) if haproxy else (65_536, 1_000_000):
        status, ctype, body = raw_get(jwt_app, path + "a" * (size - len(path)))
        if haproxy:  # over HAProxy's 16 KiB buffer
            if status == 0 and size > 100_000:
                continue  # HAProxy's 400 was lost in the reset of a socket still sending
            assert (status, ctype) == (400, "text/html"), (size, status, ctype, body[:200])
            assert b"400 Bad request" in body
        else:  # over the 16-bit offsets of uvicorn's httptools parser in Serve's proxy
            assert (status, ctype, body) == (
                400,
                "text/plain; charset=utf-8",
                b"Invalid HTTP request received.",
            ), size
