"""Starlette's own errors (unknown path, wrong method, a body that is not UTF-8 JSON or nests
too deep) answer in the gateway's error shape, not FastAPI's ``{"detail": ...}``; the OpenAPI
document names the security schemes and the configured bounds."""

from __future__ import annotations

import pytest

from serve_app.testing import build_gateway, claims, mint

pytestmark = pytest.mark.usefixtures("clean_gateway_env")
HEADERS = {"authorization": f"Bearer {mint(claims())}", "content-type": "application/json"}


@pytest.fixture(scope="module")
def gw():
    return build_gateway()


def shape(r) -> dict:
    body = r.json()
    assert "detail" not in body, body
    assert {"error", "message", "trace_id"} <= set(body), body
    return body


def test_unknown_path_and_wrong_method(gw):
    r = gw.client.get("/rag/nothing", headers=HEADERS)
    assert r.status_code == 404 and shape(r)["error"] == "not_found"
    r = gw.client.get("/rag/search_docs", headers=HEADERS)
    assert r.status_code == 405 and shape(r)["error"] == "method_not_allowed"
    assert "POST" in r.headers["allow"]


@pytest.mark.parametrize(
    "body",
    [
        b'{"team_id": "dao_greenfood", "query": "\xff\xfe"}',
        b'{"team_id": "dao_greenfood", "query": "x", "filters": '
        + b"[" * 5000
        + b"]" * 5000
        + b"}",
    ],
    ids=["invalid_utf8", "deep_nesting"],
)
def test_a_body_that_cannot_be_parsed_is_400_in_the_gateway_shape(gw, body):
    r = gw.client.post("/rag/search_docs", content=body, headers=HEADERS)
    assert r.status_code == 400
    assert shape(r)["error"] == "invalid_input"


def test_openapi_names_security_and_the_enforced_bounds():
    gw = build_gateway(search={"max_top_k": 20})
    doc = gw.client.get("/openapi.json", headers=HEADERS).json()
    assert set(doc["components"]["securitySchemes"]) == {"bearer", "api_key"}
    search = doc["paths"]["/rag/search_docs"]["post"]
    assert search["security"] == [{"bearer": []}, {"api_key": []}]
    assert {"401", "403", "422", "503"} <= set(search["responses"])
    assert "security" not in doc["paths"]["/healthz"]["get"]
    schemas = doc["components"]["schemas"]
    top_k = schemas["SearchDocsRequest"]["properties"]["top_k"]["anyOf"][0]
    assert top_k["maximum"] == 20
    assert schemas["ExplainPathRequest"]["properties"]["max_paths"]["maximum"] == 10
