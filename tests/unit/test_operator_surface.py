"""The operator surface closed in production (serve_app/api/surface.py): the catalogue needs a
credential, /readyz names no path or URI without the details permission, and every 401/403
body has the one error shape."""

from __future__ import annotations

import time

import pytest

from serve_app.contracts import ErrorBody
from serve_app.testing import build_gateway, claims, mint, unsigned_token

CATALOG = ("/openapi.json", "/docs", "/redoc", "/tools", "/tools?format=openai")


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def bad_credentials() -> dict[str, dict[str, str]]:
    now = int(time.time())
    return {
        "none": {},
        "expired": bearer(mint(claims(iat=now - 600, nbf=now - 600, exp=now - 300))),
        "alg_none": bearer(unsigned_token(claims(), {"alg": "none", "typ": "JWT"})),
        "wrong_key": bearer(mint(key="another-secret-of-at-least-thirty-two-bytes!")),
        "api_key_lookalike": {"x-api-key": "rgk_notakey_0123456789abcdef"},
    }


def production_gateway(**sections):
    """A production gateway over fakes (production refuses placeholder secrets)."""
    return build_gateway(
        environment="production", neo4j={"password": "not-the-placeholder"}, **sections
    )


@pytest.fixture(scope="module")
def production():
    return production_gateway()


@pytest.mark.parametrize("path", CATALOG)
def test_the_catalogue_needs_a_credential_in_production(production, path):
    for name, headers in bad_credentials().items():
        r = production.client.get(path, headers=headers)
        assert r.status_code == 401, (name, r.status_code, r.text[:200])
        assert r.json()["error"] == "unauthorized", name
    r = production.client.get(path, headers=bearer(mint()))
    assert r.status_code == 200, r.text[:300]


def test_the_closed_schema_is_the_whole_schema(production):
    body = production.client.get("/openapi.json", headers=bearer(mint())).json()
    assert "/rag/search_docs" in body["paths"] and "securitySchemes" in body["components"]
    page = production.client.get("/docs", headers=bearer(mint())).text
    assert "/openapi.json" in page and "swagger" in page.lower()


@pytest.mark.parametrize("path", CATALOG)
def test_the_catalogue_stays_open_in_development(path):
    gateway = build_gateway(environment="development")
    assert gateway.client.get(path).status_code == 200


def test_the_catalogue_can_be_closed_outside_production_and_opened_in_it():
    closed = build_gateway(environment="test", surface={"catalog": "credential"})
    assert closed.client.get("/openapi.json").status_code == 401
    assert closed.client.get("/tools").status_code == 401
    opened = production_gateway(surface={"catalog": "open"})
    assert opened.client.get("/openapi.json").status_code == 200


def _strings(node) -> list[str]:
    if isinstance(node, dict):
        return [s for v in node.values() for s in _strings(v)] + [str(k) for k in node]
    if isinstance(node, list):
        return [s for v in node for s in _strings(v)]
    return [str(node)]


def test_readyz_shows_no_paths_or_uris_in_production(production):
    r = production.client.get("/readyz")
    body = r.json()
    assert set(body["components"]) >= {"embedder", "milvus"}
    assert all(set(part) == {"ready"} for part in body["components"].values()), body
    assert "ops:read" in body["details"]
    text = " ".join(_strings(body))
    assert "/" not in text.replace("ops:read", ""), text
    # A verified caller without the permission sees the same; the status code never changes.
    member = production.client.get("/readyz", headers=bearer(mint()))
    assert member.status_code == r.status_code
    assert member.json()["components"] == body["components"]


def test_readyz_details_need_the_details_permission(production):
    full = production.client.get("/readyz", headers=bearer(mint(claims(permissions=["ops:read"]))))
    assert full.status_code == 200
    parts = full.json()["components"]
    assert "details" not in full.json()
    assert any(len(part) > 1 for part in parts.values()), parts
    # A credential that does not verify is refused like on any route.
    bad = production.client.get("/readyz", headers=bad_credentials()["wrong_key"])
    assert bad.status_code == 401 and bad.json()["error"] == "unauthorized"


def test_readyz_details_stay_open_in_development():
    body = build_gateway(environment="development").client.get("/readyz").json()
    assert "details" not in body
    assert any(len(part) > 1 for part in body["components"].values()), body


def test_every_401_and_403_has_the_same_shape(production):
    client = production.client
    answers = []
    for headers in bad_credentials().values():
        answers.append(client.get("/tools", headers=headers))
        answers.append(client.get("/openapi.json", headers=headers))
        answers.append(
            client.post(
                "/rag/search_docs",
                json={"team_id": "dao_greenfood", "query": "q"},
                headers=headers,
            )
        )
        answers.append(client.get("/admin/usage", headers=headers))
    # 403: a team the token does not grant, and a right it lacks.
    answers.append(
        client.post(
            "/rag/search_docs",
            json={"team_id": "dao_other", "query": "q"},
            headers=bearer(mint()),
        )
    )
    answers.append(client.get("/admin/usage", headers=bearer(mint())))
    statuses = {a.status_code for a in answers}
    assert statuses == {401, 403}, [(a.status_code, a.text[:100]) for a in answers]
    for a in answers:
        body = a.json()
        assert {"error", "message", "trace_id"} <= set(body), body
        assert set(body) <= set(ErrorBody.model_fields), body
        assert "detail" not in body
        assert body["error"] == ("unauthorized" if a.status_code == 401 else "forbidden"), body
