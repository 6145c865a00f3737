"""The operator surface closed whenever authentication is on (serve_app/ops/surface.py): in
production and with ``AUTH__MODE=jwt`` in any environment — the shipped serve_config.yaml
included — the catalogue needs a credential and /readyz names no path or URI without the
details permission; only dev mode (a laptop) leaves them open, or an explicit setting. Every
401/403 body has the one error shape."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient

from batch_ingest.chunking import whitespace_tokens
from deployments.protocols import Backends
from deployments.testing.fakes import FakeEmbedder, FakeGraphStore, FakeVectorStore
from serve_app.app import AppArgs
from serve_app.asgi import create_app
from serve_app.composition import build_services
from serve_app.contracts import ErrorBody
from serve_app.testing import AUDIENCE, ISSUER, SECRET, build_gateway, claims, mint, unsigned_token

pytestmark = pytest.mark.usefixtures("clean_gateway_env")
SERVE_CONFIG = Path(__file__).resolve().parents[4] / "serve_config.yaml"

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


def dev_gateway(**sections):
    """A laptop: authentication off (a request without credentials is trusted)."""
    return build_gateway(environment="development", auth={"mode": "dev"}, **sections)


@pytest.mark.parametrize("environment", ["development", "test"])
@pytest.mark.parametrize("path", CATALOG)
def test_the_catalogue_needs_a_credential_whenever_jwt_is_on(environment, path):
    gateway = build_gateway(environment=environment)  # AUTH__MODE=jwt, HS256
    r = gateway.client.get(path)
    assert r.status_code == 401 and r.json()["error"] == "unauthorized", r.text[:200]
    assert gateway.client.get(path, headers=bearer(mint())).status_code == 200


@pytest.mark.parametrize("path", CATALOG)
def test_the_catalogue_stays_open_in_dev_mode(path):
    assert dev_gateway().client.get(path).status_code == 200


def test_the_catalogue_is_opened_only_by_an_explicit_setting():
    for opened in (
        production_gateway(surface={"catalog": "open"}),
        build_gateway(environment="development", surface={"catalog": "open"}),
    ):
        assert opened.client.get("/openapi.json").status_code == 200
        assert opened.client.get("/tools").status_code == 200


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


def test_readyz_details_stay_open_in_dev_mode():
    body = dev_gateway().client.get("/readyz").json()
    assert "details" not in body
    assert any(len(part) > 1 for part in body["components"].values()), body


def test_readyz_shows_only_ready_flags_whenever_jwt_is_on():
    gateway = build_gateway(environment="development")
    body = gateway.client.get("/readyz").json()
    assert all(set(part) == {"ready"} for part in body["components"].values()), body
    full = build_gateway(environment="development", surface={"readyz": "full"})
    assert any(len(part) > 1 for part in full.client.get("/readyz").json()["components"].values())


def shipped_app(monkeypatch: pytest.MonkeyPatch, **env: str) -> TestClient:
    """The Ingress's app over the settings of the shipped serve_config.yaml (its ``args``,
    with ``env`` as the Ray nodes' environment), over fake backends instead of the Serve
    deployments."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    raw = yaml.safe_load(SERVE_CONFIG.read_text())
    settings = AppArgs.model_validate(raw["applications"][0]["args"]).gateway_settings()
    backends = Backends(
        embedder=FakeEmbedder(dim=32), store=FakeVectorStore(), graph=FakeGraphStore()
    )
    services = build_services(settings, backends, count_tokens=whitespace_tokens)
    return TestClient(create_app(services), raise_server_exceptions=False)


JWT_ENV = {
    "AUTH__MODE": "jwt",
    "AUTH__HS256_SECRET": SECRET,
    "AUTH__ISSUER": ISSUER,
    "AUTH__AUDIENCE": AUDIENCE,
}


def test_the_shipped_config_with_jwt_closes_the_catalogue_and_readyz_details(monkeypatch):
    client = shipped_app(monkeypatch, **JWT_ENV)
    for path in CATALOG:
        r = client.get(path)
        assert r.status_code == 401 and r.json()["error"] == "unauthorized", (path, r.text[:200])
        assert client.get(path, headers=bearer(mint())).status_code == 200, path
    # The fakes report no URIs; what counts is that nothing but ``ready`` is shown.
    ready = client.get("/readyz").json()
    assert all(set(part) == {"ready"} for part in ready["components"].values()), ready
    assert "ops:read" in ready["details"]
    ops = client.get("/readyz", headers=bearer(mint(claims(permissions=["ops:read"]))))
    assert any(len(part) > 1 for part in ops.json()["components"].values()), ops.json()


def test_the_shipped_config_in_dev_mode_keeps_the_laptop_surface_open(monkeypatch):
    client = shipped_app(monkeypatch)  # no AUTH__MODE: dev, as scripts/start.sh runs it
    for path in CATALOG:
        assert client.get(path).status_code == 200, path
    ready = client.get("/readyz").json()
    assert any(len(part) > 1 for part in ready["components"].values()), ready


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
