"""Test support for the gateway, used by the tests and the benchmarks: HS256/RS256/ES256
tokens, JWKS documents and a tiny local JWKS server, API key files, an in-process gateway over
the fakes of ``deployments.testing.fakes`` (no Ray) with authentication on, a multi-team corpus, and
an environment without the surrounding shell's gateway variables. Never used by the gateway
itself."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import os
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
import yaml
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from fastapi.testclient import TestClient
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from batch_ingest.chunking import whitespace_tokens
from batch_ingest.documents import SourceDocument
from batch_ingest.source_store import SourceStore
from deployments.protocols import Backends
from deployments.testing.fakes import FakeEmbedder, FakeGraphStore, FakeVectorStore
from serve_app.access.policy import Policy
from serve_app.asgi import create_app
from serve_app.auth.api_keys import hash_key, new_key
from serve_app.composition import Services, build_services
from serve_app.settings import GatewaySettings

SECRET = "unit-test-hs256-shared-secret-0123456789"
ISSUER = "https://id.example.test/application/o/rag/"
AUDIENCE = "rag-gateway"
PEPPER = "unit-test-api-key-pepper"

RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def claims(**overrides: Any) -> dict[str, Any]:
    """Claims of a valid token for ``alice``, member of dao_greenfood; ``None`` drops a claim.

    Valid for an hour: test modules mint their callers' tokens when they are collected, and
    the suite may reach them twenty minutes later (a 5-minute token expired there in CI)."""
    now = int(time.time())
    base: dict[str, Any] = {
        "sub": "alice",
        "iss": ISSUER,
        "aud": AUDIENCE,
        "iat": now,
        "nbf": now,
        "exp": now + 3600,
        "teams": {"dao_greenfood": ["member"]},
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def mint(
    payload: dict[str, Any] | None = None,
    *,
    key: Any = SECRET,
    alg: str = "HS256",
    kid: str | None = None,
) -> str:
    headers = {"kid": kid} if kid else None
    return jwt.encode(payload if payload is not None else claims(), key, alg, headers=headers)


def unsigned_token(payload: dict[str, Any], header: dict[str, Any]) -> str:
    """A token assembled by hand (``alg: none``, or an HMAC over a public key)."""
    head = b64url(json.dumps(header).encode())
    body = b64url(json.dumps(payload).encode())
    return f"{head}.{body}."


def hmac_token(payload: dict[str, Any], secret: bytes, header: dict[str, Any]) -> str:
    head = b64url(json.dumps(header).encode())
    body = b64url(json.dumps(payload).encode())
    signature = hmac.new(secret, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{b64url(signature)}"


def public_jwk(private_key: Any, kid: str, alg: str) -> dict[str, Any]:
    algorithm = RSAAlgorithm if isinstance(private_key, rsa.RSAPrivateKey) else ECAlgorithm
    jwk = algorithm.to_jwk(private_key.public_key(), as_dict=True)
    return {**jwk, "kid": kid, "alg": alg, "use": "sig"}


def jwks(*keys: tuple[Any, str, str]) -> dict[str, Any]:
    """``{"keys": [...]}`` of ``(private_key, kid, alg)`` triples (public parts only)."""
    return {"keys": [public_jwk(k, kid, alg) for k, kid, alg in keys]}


class JwksServer:
    """Serves a JWKS document on 127.0.0.1 and counts fetches; ``down`` answers 500."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self.fetches = 0
        self.down = False
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server API)
                server.fetches += 1
                if server.down:
                    self.send_response(500)
                    self.end_headers()
                    return
                body = json.dumps(server.document).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/jwks.json"
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def __enter__(self) -> JwksServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def write_api_keys(path: Path, entries: list[dict[str, Any]], pepper: str = PEPPER) -> list[str]:
    """Write a key file; each entry gets a fresh key (returned in order) unless it has one."""
    keys, rows = [], []
    for given in entries:
        entry = dict(given)
        key = entry.pop("key", None) or new_key()[1]
        rows.append({"id": key.split("_")[1], "hash": hash_key(key, pepper), **entry})
        keys.append(key)
    path.write_text(yaml.safe_dump({"keys": rows}), encoding="utf-8")
    return keys


def jwt_auth(**overrides: Any) -> dict[str, Any]:
    """Auth settings of a gateway that verifies HS256 tokens (and whatever ``overrides`` add)."""
    return {
        "mode": "jwt",
        "hs256_secret": SECRET,
        "issuer": ISSUER,
        "audience": AUDIENCE,
        **overrides,
    }


@dataclass
class AuthGateway:
    client: TestClient
    services: Services
    store: FakeVectorStore
    embedder: FakeEmbedder

    def search(self, body: Any, token: str | None = None, **headers: str) -> Any:
        if token is not None:
            headers["authorization"] = f"Bearer {token}"
        return self.client.post("/rag/search_docs", json=body, headers=headers)

    def ingest(self, documents: Any, token: str | None = None, **headers: str) -> Any:
        if token is not None:
            headers["authorization"] = f"Bearer {token}"
        return self.client.post("/ingest/documents", json={"documents": documents}, headers=headers)


def build_gateway(
    *,
    auth: dict[str, Any] | None = None,
    policy: Policy | None = None,
    corpus: Sequence[dict[str, Any]] = (),
    environment: str = "test",
    store: FakeVectorStore | None = None,
    state_url: str = "",
    **sections: Any,
) -> AuthGateway:
    """An in-process gateway over fakes; ``corpus`` is indexed directly (no HTTP, no auth).
    ``store``: another vector store fake (e.g. ``MemoryIndexStore``). ``state_url``: a state
    database (source registry and index generations), which turns the semantic cache on;
    ``sections``: other settings sections (``cache={...}``, ``profiles={...}``)."""
    settings = GatewaySettings(environment=environment, auth=auth or jwt_auth(), **sections)
    embedder, graph = FakeEmbedder(dim=32), FakeGraphStore()
    store = store if store is not None else FakeVectorStore()
    services = build_services(
        settings,
        Backends(embedder=embedder, store=store, graph=graph),
        count_tokens=whitespace_tokens,
        policy=policy,
        sources=SourceStore(state_url) if state_url else None,
    )
    if corpus:
        docs = [SourceDocument.model_validate(d) for d in corpus]
        report = asyncio.run(services.pipeline.ingest(docs))
        assert not report.failed, report
    client = TestClient(create_app(services), raise_server_exceptions=False)
    return AuthGateway(client, services, store, embedder)


# --- a multi-team corpus with both visibilities, several doc types, projects and a skill ----

TEAMS = ("dao_a", "dao_b", "dao_c")
TENANCY_POLICY = Policy(
    # The default roles, but a service may only read and write messages, docs and wikis.
    doc_types={
        "owner": ["*"],
        "guardian": ["*"],
        "service": ["message", "doc", "wiki"],
        "member": ["message", "doc", "file", "wiki", "rwa"],
        "guest": ["doc", "wiki"],
    },
    projects=[
        {"project": "prj_ops", "access_level": "group", "allowed_groups": ["ops"]},
        {"project": "prj_board", "access_level": "private", "owner_group": "board"},
    ],
    skills=[
        {"skill": "SKILL-deploy", "access_level": "public", "required_permission": "skill:read"}
    ],
)
# (doc_id suffix, visibility, doc_type, project_id)
TENANCY_LAYOUT = (
    ("pub_doc", "public", "doc", ""),
    ("conf_doc", "confidential", "doc", ""),
    ("pub_tx", "public", "transaction", ""),
    ("conf_wiki", "confidential", "wiki", "prj_open"),
    ("pub_msg", "public", "message", "prj_open"),
    ("ops_doc", "public", "doc", "prj_ops"),
    ("board_doc", "public", "doc", "prj_board"),
    ("board_conf", "confidential", "file", "prj_board"),
    ("acl_dev_doc", "public", "doc", ""),
    ("acl_alice_wiki", "public", "wiki", ""),
    ("acl_not_ops", "public", "message", ""),
    ("acl_mixed_conf", "confidential", "doc", "prj_open"),
)
# Document ACLs of some layout rows (by doc_id suffix); the others have none.
TENANCY_ACLS: dict[str, dict[str, list[str]]] = {
    "acl_dev_doc": {"allowed_groups": ["dev"]},
    "acl_alice_wiki": {"allowed_users": ["alice"]},
    "acl_not_ops": {"denied_groups": ["ops"]},
    "acl_mixed_conf": {
        "allowed_groups": ["dev"],
        "allowed_users": ["bob"],
        "denied_groups": ["board"],
    },
}


def marker(index: int) -> str:
    """A token that occurs only in the text of corpus document ``index``."""
    return f"qmk{index}q"


def tenancy_corpus() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for team in TEAMS:
        rows = [(f"{team}_{s}", v, t, p, TENANCY_ACLS.get(s)) for s, v, t, p in TENANCY_LAYOUT]
        rows.append(("SKILL-deploy", "public", "wiki", "", None))
        for doc_id, visibility, doc_type, project, acl in rows:
            index = len(docs)
            docs.append(
                {
                    "team_id": team,
                    "doc_id": doc_id,
                    "title": f"{doc_id} title {marker(index)}",
                    "text": f"Milvus gateway search notes of {team} about {doc_type} "
                    f"{marker(index)} deploy budget",
                    "visibility": visibility,
                    "doc_type": doc_type,
                    "project_id": project,
                    "channel_id": "ch_1",
                    "agent_id": "ag_1",
                    "tags": ["milvus", "rag"],
                    **({"acl": acl} if acl else {}),
                }
            )
    return docs


@contextlib.contextmanager
def isolated_env(audit_url: str) -> Iterator[None]:
    """No gateway variable of the surrounding shell, and the audit log in ``audit_url``."""
    sections = tuple(GatewaySettings.model_fields)
    saved = dict(os.environ)
    try:
        for name in list(os.environ):
            lowered = name.lower()
            if any(lowered == s or lowered.startswith(s + "__") for s in sections):
                del os.environ[name]
        os.environ["AUDIT__URL"] = audit_url
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
