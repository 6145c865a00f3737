"""The chunk collection's schema and indexes (DDL), the same for every team and version."""

from __future__ import annotations

from typing import Any

from deployments.acl import ACL_FIELDS, ACL_KEY_FIELDS, ACL_KEY_LENGTH, MAX_ACL_TOKENS
from deployments.config import MilvusSettings
from deployments.protocols import MAX_ID, MAX_TAG, MAX_TAGS, MAX_TEXT, MAX_TITLE, MAX_URL
from deployments.vector_store.client import import_pymilvus

# "group:" or "user:" and an identifier.
ACL_TOKEN_LENGTH = MAX_ID + 8


# The learned sparse weights of a BGE-M3 embedder (``token id → weight``), searched by inner
# product: a field only of collections built for such an embedder.
LEXICAL_FIELD = "lexical"


# The collection property naming the embedding model of every vector a version holds.
EMBED_MODEL_PROPERTY = "rag.embed_model"


def collection_definition(
    settings: MilvusSettings, dim: int, *, lexical: bool = False, embed_model: str = ""
) -> dict[str, Any]:
    """``create_collection`` keyword arguments: schema (with the BM25 function over
    ``text``, and the ``lexical`` sparse field when ``lexical``), index parameters, the
    partition count and, with ``embed_model``, the model tag as a collection property."""
    import_pymilvus()
    from pymilvus import DataType, Function, FunctionType, MilvusClient

    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("chunk_id", DataType.VARCHAR, is_primary=True, max_length=MAX_ID)
    schema.add_field("doc_id", DataType.VARCHAR, max_length=MAX_ID)
    schema.add_field("team_id", DataType.VARCHAR, max_length=MAX_ID, is_partition_key=True)
    for field in ("project_id", "channel_id", "agent_id"):
        schema.add_field(field, DataType.VARCHAR, max_length=MAX_ID)
    schema.add_field("visibility", DataType.VARCHAR, max_length=32)
    schema.add_field("doc_type", DataType.VARCHAR, max_length=64)
    schema.add_field(
        "tags",
        DataType.ARRAY,
        element_type=DataType.VARCHAR,
        max_capacity=MAX_TAGS,
        max_length=MAX_TAG,
    )
    # Document ACL tokens (deployments/acl.py): ``["*"]`` on a document without a list.
    for field in ACL_FIELDS:
        schema.add_field(
            field,
            DataType.ARRAY,
            element_type=DataType.VARCHAR,
            max_capacity=MAX_ACL_TOKENS,
            max_length=ACL_TOKEN_LENGTH,
        )
    # ... and their scalar twins, which the search expression filters on (deployments/acl.py).
    for field in ACL_KEY_FIELDS if ACL_FIELDS else ():
        schema.add_field(field, DataType.VARCHAR, max_length=ACL_KEY_LENGTH)
    schema.add_field("created_at", DataType.INT64)
    schema.add_field("title", DataType.VARCHAR, max_length=MAX_TITLE)
    schema.add_field("heading", DataType.VARCHAR, max_length=MAX_TITLE)
    schema.add_field("url", DataType.VARCHAR, max_length=MAX_URL)
    schema.add_field("text", DataType.VARCHAR, max_length=MAX_TEXT, enable_analyzer=True)
    schema.add_field("chunk_index", DataType.INT64)
    schema.add_field("content_hash", DataType.VARCHAR, max_length=128)
    schema.add_field("embed_model", DataType.VARCHAR, max_length=256)
    schema.add_field("dense", DataType.FLOAT_VECTOR, dim=dim)
    schema.add_field("sparse", DataType.SPARSE_FLOAT_VECTOR)
    if lexical:
        schema.add_field(LEXICAL_FIELD, DataType.SPARSE_FLOAT_VECTOR)
    schema.add_function(
        Function(
            name="text_bm25",
            function_type=FunctionType.BM25,
            input_field_names=["text"],
            output_field_names=["sparse"],
        )
    )
    index = MilvusClient.prepare_index_params()
    hnsw = settings.index_type == "HNSW"
    dense_params = {"M": 16, "efConstruction": 200} if hnsw else {}
    index.add_index(
        "dense",
        index_type=settings.index_type,
        metric_type=settings.metric_type,
        params=dense_params,
    )
    # k1 and b explicit: the in-memory index scores with the same ones.
    index.add_index(
        "sparse",
        index_type="SPARSE_INVERTED_INDEX",
        metric_type="BM25",
        params={"bm25_k1": settings.bm25_k1, "bm25_b": settings.bm25_b},
    )
    if lexical:
        index.add_index(
            LEXICAL_FIELD,
            index_type="SPARSE_INVERTED_INDEX",
            metric_type="IP",
        )
    for scalar in ("doc_id", "visibility", "doc_type"):
        index.add_index(scalar, index_type="INVERTED")
    # One team per collection needs no partition-key buckets (a Milvus cluster honours
    # this; Milvus Lite ignores it).
    partitions = 1 if settings.layout == "collection_per_team" else 16
    out: dict[str, Any] = {
        "schema": schema,
        "index_params": index,
        "num_partitions": partitions,
        # Every read sees every acknowledged write (the reads also ask for it per call:
        # collections created before this default stay Bounded).
        "consistency_level": "Strong",
    }
    if embed_model:
        out["properties"] = {EMBED_MODEL_PROPERTY: embed_model}
    return out


def embed_model_property(description: dict[str, Any]) -> str | None:
    """The model tag a collection was created for (``None``: created before it was noted)."""
    properties = description.get("properties") or {}
    return str(properties[EMBED_MODEL_PROPERTY]) if EMBED_MODEL_PROPERTY in properties else None


def dense_dim(description: dict[str, Any]) -> int | None:
    """The ``dense`` field's size in a ``describe_collection`` answer (``None``: absent)."""
    for field in description.get("fields", []):
        if field.get("name") == "dense":
            return int(field.get("params", {}).get("dim", 0)) or None
    return None


def field_names(description: dict[str, Any]) -> frozenset[str]:
    """The field names of a ``describe_collection`` answer."""
    return frozenset(str(f.get("name")) for f in description.get("fields", []))


def has_acl_fields(description: dict[str, Any]) -> bool:
    """Whether a collection was built with the document ACL fields."""
    return {*ACL_FIELDS, *ACL_KEY_FIELDS} <= field_names(description)


def has_lexical_field(description: dict[str, Any]) -> bool:
    """Whether a collection was built with the learned sparse ``lexical`` field."""
    return LEXICAL_FIELD in field_names(description)
