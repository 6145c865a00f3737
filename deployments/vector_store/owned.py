"""Every collection of one base name at once: ``OwnedCollections``. A base name
(``milvus.collection``) owns its teams' aliases and the physical versions behind them, all
named ``<base>`` or ``<base>__...``, but not the change log that shares the prefix (it is the
in-memory indexes' record of writes, not chunks). Operators and benchmarks count the rows of
them all, a flush of the whole store walks them, and tests and benchmarks drop them."""

from __future__ import annotations

from deployments.vector_store.client import MilvusConnection


class OwnedCollections:
    """The chunk collections of base name ``base``, never ``not_owned`` (the change log).

    Args:
        conn: the store's connection.
        base: the base collection name.
        not_owned: the name of the change log's collection.
    """

    def __init__(self, conn: MilvusConnection, base: str, *, not_owned: str) -> None:
        self.conn = conn
        self.base = base
        self.not_owned = not_owned

    def _owned(self, name: str) -> bool:
        return name != self.not_owned and (name == self.base or name.startswith(self.base + "__"))

    def names(self) -> tuple[list[str], list[str]]:
        """``(aliases, physical collections)`` of chunks that belong to this base name."""
        listed = self.conn.call("list collections", "list_collections")
        physical = [c for c in listed if self._owned(c)]
        aliases: list[str] = []
        for name in physical:
            info = self.conn.call("list aliases", "list_aliases", name)
            aliases += [a for a in info.get("aliases", []) if self._owned(a)]
        return aliases, physical

    def count_rows(self) -> int:
        """Rows in every collection of this base name (benchmarks, operators)."""
        total = 0
        for name in self.names()[0]:
            rows = self.conn.call("count", "query", name, filter="", output_fields=["count(*)"])
            total += int(rows[0]["count(*)"]) if rows else 0
        return total

    def drop(self) -> None:
        """Drop every alias, then every collection, of this base name."""
        aliases, physical = self.names()
        for alias in aliases:
            self.conn.call("drop alias", "drop_alias", alias)
        for name in physical:
            self.conn.call("drop", "drop_collection", name)
