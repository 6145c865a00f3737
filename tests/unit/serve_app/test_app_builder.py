"""The typed app builder: settings from env plus args, and a Serve Application without Ray."""

from __future__ import annotations

import pytest
import ray
from pydantic import ValidationError
from ray.serve import Application

from serve_app.app import AppArgs, build_app

pytestmark = pytest.mark.usefixtures("clean_gateway_env")


def test_args_deep_merge_over_env(monkeypatch):
    monkeypatch.setenv("MILVUS__URI", "http://from-env:19530")
    monkeypatch.setenv("MILVUS__TOKEN", "env-token")
    settings = AppArgs(settings={"milvus": {"collection": "from_args"}}).gateway_settings()
    assert settings.milvus.uri == "http://from-env:19530"
    assert settings.milvus.token == "env-token"
    assert settings.milvus.collection == "from_args"


def test_args_win_over_env_for_the_same_key(monkeypatch):
    monkeypatch.setenv("MILVUS__URI", "http://from-env:19530")
    settings = AppArgs(settings={"milvus": {"uri": "http://from-args:19530"}}).gateway_settings()
    assert settings.milvus.uri == "http://from-args:19530"


def test_args_override_nested_values_and_keep_siblings():
    settings = AppArgs(
        settings={"search": {"max_top_k": 20}, "reranker": {"enabled": True}}
    ).gateway_settings()
    assert settings.search.max_top_k == 20
    assert settings.search.default_top_k == 5
    assert settings.reranker.enabled is True
    assert settings.reranker.model_name == "bge-reranker-v2-m3"


def test_empty_args_give_env_settings(monkeypatch):
    monkeypatch.setenv("SEARCH__MODE", "bm25")
    assert AppArgs().gateway_settings().search.mode == "bm25"


def test_invalid_args_settings_raise_validation_error():
    args = AppArgs(settings={"chunking": {"max_tokens": 50, "overlap_tokens": 60}})
    with pytest.raises(ValidationError, match="overlap_tokens"):
        args.gateway_settings()


def test_production_placeholder_secret_from_args_raises():
    args = AppArgs(settings={"environment": "production"})
    with pytest.raises(ValidationError, match="placeholder"):
        args.gateway_settings()


def test_args_can_complete_settings_that_env_alone_leaves_invalid(monkeypatch):
    monkeypatch.setenv("ENVIRONMENT", "production")
    monkeypatch.setenv("AUTH__MODE", "jwt")
    monkeypatch.setenv("AUTH__ISSUER", "https://id.example.org/")
    monkeypatch.setenv("AUTH__AUDIENCE", "rag-gateway")
    args = AppArgs(
        settings={
            "neo4j": {"password": "a-real-secret"},
            "auth": {"jwks_url": "https://id.example.org/jwks"},
        }
    )
    settings = args.gateway_settings()
    assert settings.neo4j.password == "a-real-secret"
    assert settings.auth.jwks_url == "https://id.example.org/jwks"
    assert settings.auth.audience == "rag-gateway"


def test_build_app_returns_application_without_starting_ray():
    assert not ray.is_initialized()
    app = build_app(AppArgs(settings={"milvus": {"uri": "http://127.0.0.1:1"}}))
    assert isinstance(app, Application)
    assert not ray.is_initialized()


@pytest.mark.parametrize(
    "args",
    [
        {},
        {"graph_enabled": False},
        {"settings": {"reranker": {"enabled": True, "model_path": "/models/reranker"}}},
    ],
)
def test_build_app_accepts_plain_dict_args(args):
    assert isinstance(build_app(args), Application)
    assert not ray.is_initialized()


def test_build_app_rejects_unknown_arg_types():
    with pytest.raises(ValidationError):
        build_app({"graph_enabled": "sometimes"})


def test_build_app_rejects_invalid_settings():
    with pytest.raises(ValidationError):
        build_app({"settings": {"search": {"mode": "semantic"}}})


def test_each_shell_owns_its_deployment_options():
    from deployments.graph_store import deployment as graph
    from deployments.models import embedder, reranker
    from deployments.vector_store import deployment as retriever
    from serve_app.settings import GatewaySettings

    settings = GatewaySettings(
        embedder={"max_batch_size": 100, "query_batch_wait_timeout_s": 0.002},
        reranker={"max_batch_size": 20},
    )
    emb = embedder.deployment_options(settings.embedder)
    assert (emb["name"], emb["max_ongoing_requests"]) == ("Embedder", 400)
    assert emb["user_config"] == {
        "max_batch_size": 100,
        "batch_wait_timeout_s": 0.005,
        "query_batch_wait_timeout_s": 0.002,
    }
    rr = reranker.deployment_options(settings.reranker)
    assert (rr["name"], rr["max_ongoing_requests"], rr["user_config"]["max_batch_size"]) == (
        "Reranker",
        80,
        20,
    )
    assert retriever.deployment_options(settings.milvus)["name"] == "Retriever"
    assert graph.deployment_options(settings.neo4j)["name"] == "Graph"
