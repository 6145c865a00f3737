"""What each collection is, as this connection has seen it: ``CollectionShapes``. Every write
and search needs to know whether a collection has the document ACL fields and the learned
sparse ``lexical`` field, and which model's vectors it holds, and asking Milvus on every call
would double the round trips: a description is remembered, and one that lacks a field or a
model is asked again after ``ACL_RECHECK_S`` (a reindex in another process may have rebuilt
the collection since). The checks that refuse a collection of another vector size or model
are here too, as is the creation of a collection in the shape this process serves. The store
(store.py) and the versions behind each alias (versions.py) share one of these, so ``forget``
clears what both saw when the connection is reset or an alias is pointed elsewhere."""

from __future__ import annotations

import logging
import time
from collections.abc import Collection

from deployments.config import MilvusSettings
from deployments.errors import BackendUnavailable, InvalidInput
from deployments.protocols import ChunkRecord
from deployments.vector_store.client import MilvusConnection
from deployments.vector_store.schema import (
    collection_definition,
    dense_dim,
    embed_model_property,
    has_acl_fields,
    has_lexical_field,
)

logger = logging.getLogger(__name__)
# Seconds before a collection seen without the ACL fields is described again.
ACL_RECHECK_S = 30.0


class CollectionShapes:
    """The fields, vector size and model of each collection (or alias), described once and
    remembered; the collections this connection has loaded.

    Args:
        conn: the store's connection; ``settings``, ``dim``: as the store's.
        lexical: new collections get the learned sparse ``lexical`` field (the embedder makes
            those weights).
        embed_model: the tag of the model making ``dim``-d vectors, noted on each collection
            created without another one (``model_of``).
        dims: other vector sizes a collection may have (the models a change of model moves
            between, docs/operations.md "Changing the embedding model").
        served: tags of the models the caller embeds with; a live collection of another
            model's vectors is refused (``check_model``) rather than searched with, or
            written, vectors it cannot be compared to. Empty: no check (a reindex job, which
            moves a team from one model to another).
    """

    def __init__(
        self,
        conn: MilvusConnection,
        settings: MilvusSettings,
        dim: int,
        *,
        lexical: bool = False,
        embed_model: str = "",
        dims: Collection[int] = (),
        served: Collection[str] = (),
    ) -> None:
        self.conn = conn
        self.served = frozenset(served)
        self.settings = settings
        self.dim = dim
        self.embed_model = embed_model
        self.dims = frozenset({dim, *dims})
        self.lexical = lexical
        # name -> (has the ACL fields, has the lexical field, when it was described)
        self._seen: dict[str, tuple[bool, bool, float]] = {}
        # name -> (vector size, model tag, when it was described)
        self._shape: dict[str, tuple[int | None, str | None, float]] = {}
        # Physical versions loaded on this connection (read by name: not through the store,
        # which loads the alias it opens).
        self._loaded: set[str] = set()

    def create_physical(
        self,
        physical: str,
        *,
        dim: int | None = None,
        embed_model: str | None = None,
        lexical: bool | None = None,
    ) -> None:
        """Create ``physical`` with the chunk schema and indexes, for ``dim``-d vectors of
        ``embed_model`` (default: the store's model); "already exists" (another replica was
        first) is fine."""
        dim = dim or self.dim
        tag = self.embed_model if embed_model is None else embed_model
        lexical = self.lexical if lexical is None else lexical
        try:
            self.conn.call(
                "create collection",
                "create_collection",
                physical,
                **collection_definition(self.settings, dim, lexical=lexical, embed_model=tag),
            )
            logger.info(
                "created Milvus collection %s (dim=%d, model %s%s)",
                physical,
                dim,
                tag or "not noted",
                ", learned sparse field" if lexical else "",
            )
        except BackendUnavailable:
            if not self.conn.call("has collection", "has_collection", physical):
                raise

    def has_acl(self, name: str) -> bool:
        """Whether collection (or alias) ``name`` has the document ACL fields. A collection
        with them is remembered for good (every version built since has them); one without
        is looked at again after ``ACL_RECHECK_S``, so a reindex that rebuilt the team's
        collection under the same alias (in another process) is noticed."""
        known = self._seen.get(name)
        if known is not None and (known[0] or time.monotonic() - known[2] < ACL_RECHECK_S):
            return known[0]
        return self._describe(name)[1]

    def has_lexical(self, name: str) -> bool:
        """Whether collection (or alias) ``name`` has the learned sparse ``lexical`` field;
        remembered like ``has_acl`` (a collection without it is described again after
        ``ACL_RECHECK_S``: a reindex may have rebuilt it with the field)."""
        known = self._seen.get(name)
        if known is not None and (known[1] or time.monotonic() - known[2] < ACL_RECHECK_S):
            return known[1]
        return self._describe(name)[2]

    def _describe(self, name: str) -> tuple[int | None, bool, bool]:
        description = self.conn.call("describe", "describe_collection", name)
        acl, lexical = has_acl_fields(description), has_lexical_field(description)
        now = time.monotonic()
        self._seen[name] = (acl, lexical, now)
        dim = dense_dim(description)
        self._shape[name] = (dim, embed_model_property(description), now)
        return dim, acl, lexical

    def _shape_of(self, physical: str) -> tuple[int | None, str | None]:
        known = self._shape.get(physical)
        if known is None or time.monotonic() - known[2] > ACL_RECHECK_S:
            self._describe(physical)
            known = self._shape[physical]
            if known[1] is None:  # created before versions noted their model: its rows say
                model = self._first_row_model(physical)
                if model is not None:
                    known = (known[0], model, known[2])
                    self._shape[physical] = known
        return known[0], known[1]

    def model_of(self, physical: str) -> str | None:
        """The tag of the model whose vectors the physical collection ``physical`` holds:
        noted when it was created, else its first row's (``None``: empty and not noted).
        Remembered for ``ACL_RECHECK_S``: a physical name is reused only after a failed job's
        version was dropped."""
        return self._shape_of(physical)[1]

    def dim_of(self, physical: str) -> int:
        """The vector size of collection ``physical`` (the store's own when it cannot say)."""
        return self._shape_of(physical)[0] or self.dim

    def forget(self, name: str | None = None) -> None:
        """Forget what was seen of ``name`` (every collection: ``None``)."""
        if name is None:
            self._seen.clear()
            self._shape.clear()
            self._loaded.clear()
        else:
            self._seen.pop(name, None)
            self._shape.pop(name, None)
            self._loaded.discard(name)

    def ensure_loaded(self, physical: str) -> None:
        """Load ``physical`` once per connection: after a restart Milvus Lite answers no
        read of a released collection (a reindex reading the version it replaces)."""
        if physical not in self._loaded:
            self.conn.call("load", "load_collection", physical)
            self._loaded.add(physical)

    def check_dim(self, name: str, expected: int | None = None) -> None:
        """Refuse a collection whose vectors are not ``expected``-d (default: a size of a
        model the gateway serves)."""
        existing = self._describe(name)[0]
        allowed = {expected} if expected else self.dims
        if existing is not None and existing not in allowed:
            sizes = "/".join(str(d) for d in sorted(allowed))
            raise BackendUnavailable(
                "milvus",
                f"collection {name!r} holds {existing}-d vectors but the embedder makes "
                f"{sizes}-d ones",
                hint="reindex the team with the new model or point MILVUS__COLLECTION elsewhere",
            )

    def check_model(self, name: str) -> None:
        """Refuse collection ``name`` (an alias or a physical version) when it holds the
        vectors of a model not in ``served``: a query or passage vector of one model is
        meaningless against another's, even where both have one size (an int8 and an fp32
        export of one model have their own tags, bench/README.md "ONNX")."""
        if not self.served:
            return
        # Described just before by check_dim when the store opens an alias; a physical
        # version's model never changes.
        model = self.model_of(name)
        if model is not None and model not in self.served:
            raise BackendUnavailable(
                "milvus",
                f"collection {name!r} holds vectors of {model}; this gateway embeds with "
                f"{', '.join(sorted(self.served))}",
                hint="reindex the team (python -m batch_ingest.reindex --team ...), or serve "
                f"{model} as embedder_next while teams move (docs/operations.md, "
                '"Changing the embedding model")',
            )

    def _first_row_model(self, name: str) -> str | None:
        """The model of a collection created before versions noted theirs: its rows say
        (loaded first: after a restart Milvus Lite answers no query of a released one)."""
        self.conn.call("load", "load_collection", name)
        rows = self.conn.call(
            "model", "query", name, filter="", output_fields=["embed_model"], limit=1
        )
        return str(rows[0]["embed_model"]) if rows else None


def check_vectors(chunks: list[ChunkRecord], dim: int | Collection[int]) -> None:
    """Refuse a chunk whose vector is not ``dim`` long (one of them) (``InvalidInput``)."""
    allowed = {dim} if isinstance(dim, int) else set(dim)
    for chunk in chunks:
        if len(chunk.vector) not in allowed:
            expected = "/".join(str(d) for d in sorted(allowed))
            raise InvalidInput(
                f"chunk {chunk.chunk_id} has a {len(chunk.vector)}-d vector, expected {expected}"
            )
