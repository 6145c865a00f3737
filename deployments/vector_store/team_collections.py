"""A team's collection as this connection uses it: ``TeamCollections``. The first use of a team
finds its alias (or, on the team's first write, creates ``<alias>__v1`` and the alias over
it), refuses it when it holds vectors of another size or model than this process serves, and
loads it, since Milvus Lite answers nothing of a released collection after a restart. That
costs a few round trips, so it is done once per connection and remembered until the connection
is reset, the alias is pointed elsewhere or the store drops its collections. The physical
version a search was pinned to (memindex/pins.py) is loaded once the same way."""

from __future__ import annotations

import threading
from collections.abc import Callable

from deployments.errors import BackendUnavailable
from deployments.vector_store.client import MilvusConnection
from deployments.vector_store.shapes import CollectionShapes


class TeamCollections:
    """The teams' logical collections (aliases) checked and loaded on one connection.

    Args:
        conn: the store's connection.
        shapes: the store's; checks a collection's vector size and model, creates a version.
        alias_for: a team's logical collection name (its alias).
    """

    def __init__(
        self,
        conn: MilvusConnection,
        shapes: CollectionShapes,
        *,
        alias_for: Callable[[str], str],
    ) -> None:
        self.conn = conn
        self.shapes = shapes
        self.alias_for = alias_for
        self._open: set[str] = set()  # logical names checked and loaded on this connection
        self._open_lock = threading.Lock()

    def open(self, team_id: str, *, create: bool = False) -> str | None:
        """The team's logical collection, checked and loaded; ``None`` if it does not exist
        and ``create`` is false (nothing is created then)."""
        name = self.alias_for(team_id)
        if name in self._open:
            return name
        with self._open_lock:
            if name in self._open:
                return name
            if not self.conn.call("has collection", "has_collection", name):
                if not create:
                    return None
                self._create(name)
            else:
                self.shapes.check_dim(name)
            # Milvus Lite needs an explicit load after a restart (and before any query,
            # such as check_model's read of a row when the version noted no model).
            self.conn.call("load", "load_collection", name)
            self.shapes.check_model(name)
            self._open.add(name)
        return name

    def _create(self, name: str) -> None:
        """Create ``<name>__v1`` and point alias ``name`` at it. Safe against a concurrent
        creator (another replica): "already exists" is fine."""
        self.shapes.create_physical(f"{name}__v1")
        try:
            self.conn.call("create alias", "create_alias", f"{name}__v1", name)
        except BackendUnavailable:
            if not self.conn.call("has collection", "has_collection", name):
                raise

    def load_physical(self, physical: str) -> None:
        """Load one physical version once per connection (a server restart unloads it)."""
        if physical not in self._open:
            self.conn.call("load", "load_collection", physical)
            self._open.add(physical)

    def forget(self, name: str | None = None) -> None:
        """Open ``name`` (every collection: ``None``) again on its next use."""
        if name is None:
            self._open.clear()
        else:
            self._open.discard(name)
