"""The versioned collections behind a team's alias: a reindex builds ``<alias>__v<n+1>`` beside
the live ``__v<n>``, writes into it by physical name, announces it once it holds the bulk of its
rows (the Retrievers stage an in-memory copy of it), catches up, verifies it, then swaps the
alias in one call; the in-memory index loads and replays a team from its live version by
physical name too. ``MilvusStore.versions`` is one of these."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Collection, Iterator

from deployments.config import MilvusSettings
from deployments.errors import BackendUnavailable, InvalidInput
from deployments.protocols import ChunkRecord
from deployments.vector_store.client import MilvusConnection
from deployments.vector_store.filter import milvus_list, milvus_literal
from deployments.vector_store.memindex.changes import ChangeLog
from deployments.vector_store.rows import chunk_to_row, chunk_with_vector, output_fields
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


class CollectionVersions:
    """Create, fill, count, switch and drop the physical versions of a team's collection.

    Args:
        conn: the store's connection; ``settings``, ``dim``: as the store's.
        lexical: new versions get the learned sparse ``lexical`` field (the embedder makes
            those weights).
        alias_for: a team's logical collection name (its alias).
        changes: the change log; a write reaches it only when it lands in the live version
            (under the alias) or in the announced one (under the physical name).
        on_switch: called with the alias after it was pointed elsewhere (the store forgets
            what it had opened under that name).
        embed_model: the tag of the model making ``dim``-d vectors, noted on each version
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
        alias_for: Callable[[str], str],
        changes: ChangeLog,
        on_switch: Callable[[str], None],
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
        self.alias_for = alias_for
        self.changes = changes
        self.on_switch = on_switch
        # name -> (has the ACL fields, has the lexical field, when it was described)
        self._seen: dict[str, tuple[bool, bool, float]] = {}
        # name -> (vector size, model tag, when it was described)
        self._shape: dict[str, tuple[int | None, str | None, float]] = {}
        # Physical versions loaded on this connection (read by name: not through the store,
        # which loads the alias it opens).
        self._loaded: set[str] = set()

    def name(self, team_id: str, version: int) -> str:
        """The physical collection ``<alias>__v<version>``."""
        return f"{self.alias_for(team_id)}__v{int(version)}"

    def current(self, team_id: str) -> int | None:
        """The version the team's alias points to; ``None`` when the team has no collection."""
        alias = self.alias_for(team_id)
        target = self._alias_target(alias)
        if target is None:
            return None
        match = re.fullmatch(re.escape(alias) + r"__v(\d+)", target)
        if match is None:
            raise BackendUnavailable(
                "milvus", f"alias {alias!r} points to {target!r}, not a versioned collection"
            )
        return int(match.group(1))

    def existing(self, team_id: str) -> list[int]:
        """Every physical version of the team's collection that exists, ascending."""
        pattern = re.compile(re.escape(self.alias_for(team_id)) + r"__v(\d+)")
        found = []
        for name in self.conn.call("list collections", "list_collections"):
            match = pattern.fullmatch(name)
            if match:
                found.append(int(match.group(1)))
        return sorted(found)

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

    def create(
        self,
        team_id: str,
        version: int,
        *,
        dim: int | None = None,
        embed_model: str | None = None,
        lexical: bool | None = None,
    ) -> str:
        """Create (idempotently) and load ``<alias>__v<version>`` for ``dim``-d vectors of
        ``embed_model`` (default: the store's model) without pointing the alias at it.
        Returns the physical name."""
        physical = self.name(team_id, version)
        if not self.conn.call("has collection", "has_collection", physical):
            self.create_physical(physical, dim=dim, embed_model=embed_model, lexical=lexical)
        self.check_dim(physical, dim or self.dim)
        self.conn.call("load", "load_collection", physical)
        return physical

    def upsert(self, physical: str, chunks: list[ChunkRecord]) -> int:
        """Upsert chunks into one physical collection (a version being built), by pk."""
        if not chunks:
            return 0
        check_vectors(chunks, self.dim_of(physical))
        acl, lexical = self.has_acl(physical), self.has_lexical(physical)
        rows = [chunk_to_row(c, acl=acl, lexical=lexical) for c in chunks]
        self.conn.call("upsert", "upsert", physical, rows)
        self._record(physical, [c.chunk_id for c in chunks])
        return len(chunks)

    def lookup(self, physical: str, chunk_ids: list[str]) -> dict[str, tuple[str, str]]:
        """``chunk_id → (content_hash, embed_model)`` in one physical collection (pk only)."""
        out: dict[str, tuple[str, str]] = {}
        for start in range(0, len(chunk_ids), 256):
            rows = self.conn.call(
                "lookup",
                "query",
                physical,
                filter=f"chunk_id in {milvus_list(chunk_ids[start : start + 256])}",
                output_fields=["chunk_id", "content_hash", "embed_model"],
            )
            for row in rows:
                out[row["chunk_id"]] = (row["content_hash"], row["embed_model"])
        return out

    def delete(self, physical: str, chunk_ids: list[str]) -> int:
        if not chunk_ids:
            return 0
        self.conn.call("delete", "delete", physical, ids=list(chunk_ids))
        self._record(physical, list(chunk_ids))
        return len(chunk_ids)

    def _record(self, physical: str, chunk_ids: list[str]) -> None:
        """Record a write of one physical version in the change log: under the alias when
        the alias names it (a reindex catching up after the swap), under the physical name
        when it is the announced version (the staged copies replay it at the swap); a
        version being built and not announced is nobody's to see.

        The announcement is read before the alias: ``switch`` points the alias first and
        clears the announcement after, so a write that finds no announcement finds the
        alias pointing at its version, and is recorded either way."""
        alias, _, version = physical.rpartition("__v")
        if not version.isdigit():
            return
        announced = self.changes.announced(alias)
        if self._alias_target(alias) == physical:
            self.changes.record(alias, chunk_ids)
        elif announced == physical:
            self.changes.record(alias, chunk_ids, name=physical)

    def _alias_target(self, alias: str) -> str | None:
        """The collection ``alias`` names now; ``None`` without the alias (``""``: not an
        alias)."""
        if not self.conn.call("has collection", "has_collection", alias):
            return None
        info = self.conn.call("describe alias", "describe_alias", alias)
        return str(info.get("collection_name", "")) if isinstance(info, dict) else ""

    def count(self, physical: str, expr: str = "") -> int:
        """Rows of one physical collection matching ``expr`` (all rows when empty)."""
        self.ensure_loaded(physical)
        rows = self.conn.call("count", "query", physical, filter=expr, output_fields=["count(*)"])
        return int(rows[0]["count(*)"]) if rows else 0

    def flush(self, physical: str) -> None:
        self.conn.call("flush", "flush", physical)

    def switch(self, team_id: str, version: int) -> str:
        """Point the team's alias at ``<alias>__v<version>`` in one ``alter_alias`` call (or
        create the alias for a team that had none): searches see the old or the new version,
        never a mix. Returns the physical name."""
        alias = self.alias_for(team_id)
        physical = self.name(team_id, version)
        if not self.conn.call("has collection", "has_collection", physical):
            raise InvalidInput(f"collection {physical!r} does not exist")
        if self.conn.call("has collection", "has_collection", alias):
            self.conn.call("alter alias", "alter_alias", physical, alias)
        else:
            self.conn.call("create alias", "create_alias", physical, alias)
        self.on_switch(alias)
        self.changes.record_swap(alias)  # clears the announcement too
        logger.info("alias %s now points to %s", alias, physical)
        return physical

    def announce(self, team_id: str, version: int) -> str:
        """Announce ``<alias>__v<version>`` as the version the team's alias will be switched
        to: every Retriever replica holding the team loads an in-memory copy of it in the
        background, and from now on writes into it are recorded in the change log (under its
        physical name), so at the switch that copy replays them and answers at once.

        Call it once the version holds the bulk of its rows (after the bulk pass, before the
        final catch-up and the switch); again after a resume (a fresh token restarts the
        staging). ``switch`` clears it; ``withdraw`` when the job fails; ``drop`` of the
        announced version clears it too. Returns the physical name.

        Raises:
            InvalidInput: the version does not exist, or the alias names it already.
        """
        alias = self.alias_for(team_id)
        physical = self.name(team_id, version)
        if not self.conn.call("has collection", "has_collection", physical):
            raise InvalidInput(f"collection {physical!r} does not exist")
        if self._alias_target(alias) == physical:
            raise InvalidInput(f"version {version} is live already; nothing to announce")
        self.changes.announce(alias, physical)
        logger.info("alias %s announced to switch to %s", alias, physical)
        return physical

    def withdraw(self, team_id: str) -> None:
        """Clear the team's announcement (a failed reindex): the Retrievers drop their staged
        copies, and writes into that version are no longer recorded. Harmless without one."""
        alias = self.alias_for(team_id)
        if self.changes.announced(alias):
            self.changes.withdraw(alias)
            logger.info("alias %s: announcement withdrawn", alias)

    def drop(self, team_id: str, version: int) -> bool:
        """Drop one physical version; refuses the one the alias points to."""
        if self.current(team_id) == version:
            raise InvalidInput(f"version {version} is live; switch the alias first")
        physical = self.name(team_id, version)
        if not self.conn.call("has collection", "has_collection", physical):
            return False
        if self.changes.announced(self.alias_for(team_id)) == physical:
            self.withdraw(team_id)
        self.conn.call("drop", "drop_collection", physical)
        logger.info("dropped Milvus collection %s", physical)
        return True

    # --- the reads the in-memory index loads and replays from (memindex.copies.RowSource) ---
    def collection_for(self, team_id: str) -> str:
        return self.alias_for(team_id)

    def live_physical(self, team_id: str) -> str | None:
        """The physical collection the team's alias names now; ``None`` without one."""
        version = self.current(team_id)
        return None if version is None else self.name(team_id, version)

    def count_team(self, physical: str, team_id: str) -> int:
        self.ensure_loaded(physical)
        return self.count(physical, f"team_id == {milvus_literal(team_id)}")

    def iter_rows(
        self, physical: str, team_id: str, batch: int = 1000
    ) -> Iterator[list[ChunkRecord]]:
        """Every chunk of ``team_id`` in ``physical``, with its vector, ``batch`` at a time."""
        self.ensure_loaded(physical)
        try:
            iterator = self.conn.client.query_iterator(
                physical,
                batch_size=batch,
                filter=f"team_id == {milvus_literal(team_id)}",
                output_fields=output_fields(acl=self.has_acl(physical), dense=True),
                # Every write acknowledged before the read began (those into an announced
                # version before it was announced are in no change log).
                consistency_level="Strong",
            )
            while rows := iterator.next():
                yield [chunk_with_vector(row) for row in rows]
            iterator.close()
        except Exception as exc:
            raise BackendUnavailable("milvus", f"reading {physical} failed: {exc}") from exc

    def fetch_rows(self, physical: str, chunk_ids: list[str]) -> list[ChunkRecord]:
        """The stored chunks (with vectors) among ``chunk_ids``; primary-key reads."""
        self.ensure_loaded(physical)
        out: list[ChunkRecord] = []
        for start in range(0, len(chunk_ids), 256):
            rows = self.conn.call(
                "fetch",
                "get",
                physical,
                ids=chunk_ids[start : start + 256],
                output_fields=output_fields(
                    acl=self.has_acl(physical), dense=True, lexical=self.has_lexical(physical)
                ),
                consistency_level="Strong",
            )
            out += [chunk_with_vector(row) for row in rows]
        return out


def check_vectors(chunks: list[ChunkRecord], dim: int | Collection[int]) -> None:
    """Refuse a chunk whose vector is not ``dim`` long (one of them) (``InvalidInput``)."""
    allowed = {dim} if isinstance(dim, int) else set(dim)
    for chunk in chunks:
        if len(chunk.vector) not in allowed:
            expected = "/".join(str(d) for d in sorted(allowed))
            raise InvalidInput(
                f"chunk {chunk.chunk_id} has a {len(chunk.vector)}-d vector, expected {expected}"
            )
