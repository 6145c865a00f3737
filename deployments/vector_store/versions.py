"""The versioned collections behind a team's alias: a reindex builds ``<alias>__v<n+1>`` beside
the live ``__v<n>``, writes into it by physical name, announces it once it holds the bulk of its
rows (the Retrievers stage an in-memory copy of it), catches up, verifies it, then swaps the
alias in one call; the in-memory index loads and replays a team from its live version by
physical name too. ``MilvusStore.versions`` is one of these; what each collection holds (its
fields, vector size and model) is the store's ``CollectionShapes`` (shapes.py)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator

from deployments.errors import BackendUnavailable, InvalidInput
from deployments.protocols import ChunkRecord
from deployments.vector_store.client import MilvusConnection
from deployments.vector_store.filter import milvus_list, milvus_literal
from deployments.vector_store.memindex.changes import ChangeLog
from deployments.vector_store.rows import chunk_to_row, chunk_with_vector, output_fields
from deployments.vector_store.shapes import CollectionShapes, check_vectors

logger = logging.getLogger(__name__)


class CollectionVersions:
    """Create, fill, count, switch and drop the physical versions of a team's collection.

    Args:
        conn: the store's connection.
        shapes: what the store has seen of each collection (shapes.py): the fields and
            vector size a write into a version needs, the shape a new version is created in.
        alias_for: a team's logical collection name (its alias).
        changes: the change log; a write reaches it only when it lands in the live version
            (under the alias) or in the announced one (under the physical name).
        on_switch: called with the alias after it was pointed elsewhere (the store forgets
            what it had opened under that name).
    """

    def __init__(
        self,
        conn: MilvusConnection,
        shapes: CollectionShapes,
        *,
        alias_for: Callable[[str], str],
        changes: ChangeLog,
        on_switch: Callable[[str], None],
    ) -> None:
        self.conn = conn
        self.shapes = shapes
        # The vector size of the store's model (``RowSource.dim``: the in-memory index's
        # estimate before a load).
        self.dim = shapes.dim
        self.alias_for = alias_for
        self.changes = changes
        self.on_switch = on_switch

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
            self.shapes.create_physical(physical, dim=dim, embed_model=embed_model, lexical=lexical)
        self.shapes.check_dim(physical, dim or self.dim)
        self.conn.call("load", "load_collection", physical)
        return physical

    def upsert(self, physical: str, chunks: list[ChunkRecord]) -> int:
        """Upsert chunks into one physical collection (a version being built), by pk."""
        if not chunks:
            return 0
        check_vectors(chunks, self.shapes.dim_of(physical))
        acl, lexical = self.shapes.has_acl(physical), self.shapes.has_lexical(physical)
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
        self.shapes.ensure_loaded(physical)
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
        self.shapes.ensure_loaded(physical)
        return self.count(physical, f"team_id == {milvus_literal(team_id)}")

    def iter_rows(
        self, physical: str, team_id: str, batch: int = 1000
    ) -> Iterator[list[ChunkRecord]]:
        """Every chunk of ``team_id`` in ``physical``, with its vector, ``batch`` at a time."""
        self.shapes.ensure_loaded(physical)
        try:
            iterator = self.conn.client.query_iterator(
                physical,
                batch_size=batch,
                filter=f"team_id == {milvus_literal(team_id)}",
                output_fields=output_fields(acl=self.shapes.has_acl(physical), dense=True),
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
        self.shapes.ensure_loaded(physical)
        out: list[ChunkRecord] = []
        for start in range(0, len(chunk_ids), 256):
            rows = self.conn.call(
                "fetch",
                "get",
                physical,
                ids=chunk_ids[start : start + 256],
                output_fields=output_fields(
                    acl=self.shapes.has_acl(physical),
                    dense=True,
                    lexical=self.shapes.has_lexical(physical),
                ),
                consistency_level="Strong",
            )
            out += [chunk_with_vector(row) for row in rows]
        return out
