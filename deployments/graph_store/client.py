"""One Neo4j driver: connect and bootstrap the schema, run trusted statements, read caller
queries in READ transactions with a timeout and a row limit, EXPLAIN them, and map the
driver's errors to the gateway's (a connection failure → 503 and a reconnect next time,
Neo4j's client errors → the matching 4xx, a caller's query failing while it runs → 422)."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from deployments.config import Neo4jSettings
from deployments.errors import (
    BackendUnavailable,
    Forbidden,
    InvalidInput,
    InvalidQuery,
    QueryLimitExceeded,
)
from deployments.graph_store.cypher import MARK_DERIVED, RECOMPUTE_DERIVED, schema_statements
from deployments.graph_store.params import bound, bundled
from deployments.graph_store.values import to_plain

logger = logging.getLogger(__name__)

T = TypeVar("T")


async def tx_rows(tx: Any, query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """The records of one of the gateway's own statements run inside a transaction, as
    dicts; its parameters bound as one map, so a batch of another size is not planned again
    (deployments/graph_store/params.py)."""
    result = await tx.run(bundled(query), bound(params))
    return [record.data() async for record in result]


class Neo4jClient:
    """The async driver of one Neo4j server, opened on first use.

    Args:
        settings: Bolt URI, credentials, database and timeouts.
    """

    def __init__(self, settings: Neo4jSettings) -> None:
        self.settings = settings
        self._driver: Any = None
        self._schema_ready = False
        self._lock = asyncio.Lock()

    async def start(self, deadline_s: float | None = None) -> None:
        """Connect and create the schema within ``deadline_s`` (default the settings'
        ``deadline_s``); idempotent."""
        async with self._lock:
            if self._schema_ready:
                return
            from neo4j import AsyncGraphDatabase

            try:
                if self._driver is None:
                    self._driver = AsyncGraphDatabase.driver(
                        self.settings.uri,
                        auth=(self.settings.user, self.settings.password),
                        connection_timeout=min(self.settings.timeout_s, self.settings.deadline_s),
                        max_transaction_retry_time=self.settings.retry_s,
                        notifications_min_severity="OFF",
                    )
                await asyncio.wait_for(self._bootstrap(), deadline_s or self.settings.deadline_s)
            except Exception as exc:
                await self._reset()
                raise BackendUnavailable(
                    "neo4j",
                    f"cannot reach {self.settings.uri}: {exc}",
                    hint="start it with `python scripts/services.py up` or set NEO4J__URI",
                ) from exc
            self._schema_ready = True

    async def _bootstrap(self) -> None:
        await self._driver.verify_connectivity()
        for statement in schema_statements():
            try:
                await self._driver.execute_query(statement, database_=self.settings.database)
            except Exception as exc:
                # A constraint whose creation was cut off (a caller's deadline mid-setup) can
                # leave its backing index behind under the constraint's name, and then the
                # constraint can never be created again: drop that index and create it anew.
                name = orphan_index_name(statement, exc)
                if name is None:
                    raise
                logger.warning("neo4j: dropping the orphan index %s of an unfinished setup", name)
                await self._driver.execute_query(
                    f"DROP INDEX {name} IF EXISTS", database_=self.settings.database
                )
                await self._driver.execute_query(statement, database_=self.settings.database)
        await self._mark_derived()

    async def _mark_derived(self, batch: int = 5000) -> None:
        """Nodes written before ``derived`` existed get it (``MARK_DERIVED``), and those
        taken as made by documents their visibility from them, ``batch`` nodes per
        transaction; a no-op once done."""

        async def work(tx: Any) -> tuple[int, int]:
            rows = await tx_rows(tx, MARK_DERIVED, {"batch": batch})
            affected = rows[0]["affected"] if rows else []
            if affected:
                await tx_rows(tx, RECOMPUTE_DERIVED, {"affected": affected})
            return (int(rows[0]["marked"]) if rows else 0), len(affected)

        marked = derived = batch
        total = [0, 0]
        while marked == batch:
            async with self._driver.session(database=self.settings.database) as session:
                marked, derived = await session.execute_write(work)
            total = [total[0] + marked, total[1] + derived]
        if total[0]:
            logger.info(
                "neo4j: %d nodes written before 'derived' marked, %d of them as made by documents",
                *total,
            )

    async def _started(self, deadline: float) -> float:
        """Connect (and create the schema) if needed, within the call's ``deadline``; the
        seconds left of it for the call itself."""
        began = time.monotonic()
        if not self._schema_ready:
            await self._within(deadline, "connect", self.start(deadline))
        return max(deadline - (time.monotonic() - began), 0.5)

    async def _within(self, seconds: float, what: str, work: Any) -> Any:
        """Await ``work`` for at most ``seconds``; past that the driver is dropped (the next
        call reconnects) and the caller gets 503 naming Neo4j."""
        try:
            return await asyncio.wait_for(work, seconds)
        except TimeoutError:
            async with self._lock:
                await self._reset()
            raise BackendUnavailable(
                "neo4j",
                f"no answer from {self.settings.uri} within {seconds:g} s ({what})",
                hint="check that Neo4j is up; NEO4J__DEADLINE_S bounds every graph call",
            ) from None

    async def _reset(self) -> None:
        if self._driver is not None:
            try:
                await self._driver.close()
            finally:
                self._driver = None
        self._schema_ready = False

    async def _raise_mapped(self, exc: Exception, *, trusted: bool = True) -> None:
        """Re-raise connection failures as ``BackendUnavailable`` (and reconnect next time);
        Neo4j's client errors as the gateway's 4xx errors. A transaction the server
        terminated (stopping, restarting), and a ``trusted`` query (the gateway's own) past
        its timeout, are Neo4j's trouble: ``BackendUnavailable`` too. A caller's own query
        (``trusted=False``) that Neo4j could compile but that failed while it ran (a
        ``Neo.DatabaseError.Statement.*``, e.g. a shortestPath whose two ends are one node) is
        the caller's: 422 ``invalid_input`` with reason ``query_failed`` and Neo4j's message;
        the same error of a gateway query stays Neo4j's trouble."""
        from neo4j.exceptions import (
            ClientError,
            DatabaseError,
            ServiceUnavailable,
            SessionExpired,
            TransientError,
        )

        if isinstance(exc, ServiceUnavailable | SessionExpired | OSError):
            await self._reset()
            raise BackendUnavailable("neo4j", f"query failed: {exc}") from exc
        code = getattr(exc, "code", "") or ""
        message = getattr(exc, "message", None) or str(exc)
        if "Transaction.Terminated" in code or "Transaction.LockClientStopped" in code:
            await self._reset()
            raise BackendUnavailable("neo4j", f"transaction terminated: {message}") from exc
        if "TransactionTimedOut" in code and trusted:
            raise BackendUnavailable(
                "neo4j",
                f"a gateway query ran past the {self.settings.query_timeout_s:g} s timeout",
                hint="Neo4j is overloaded or restarting; retry later",
            ) from exc
        if "TransactionTimedOut" in code:
            raise QueryLimitExceeded(
                f"the query ran past the {self.settings.query_timeout_s:g} s timeout",
                reason="timeout",
                hint="narrow the query (labels, LIMIT) or use a named intent",
            ) from exc
        if "MemoryPoolOutOfMemory" in code or "MemoryLimit" in code:
            raise QueryLimitExceeded(
                f"the query needs more memory than a transaction may use: {message}",
                reason="memory",
            ) from exc
        if isinstance(exc, ClientError) and code.startswith("Neo.ClientError.Security."):
            raise Forbidden(
                f"Neo4j refused the query: {message}", reason="neo4j_security", field="cypher"
            ) from exc
        if isinstance(exc, ClientError):
            # Syntax, semantics, unknown procedures, a procedure that failed on its arguments:
            # the caller's query, said in Neo4j's words.
            raise InvalidQuery(f"Neo4j rejected the query: {message}") from exc
        if isinstance(exc, TransientError):
            raise BackendUnavailable("neo4j", f"transient failure: {message}") from exc
        if not trusted and isinstance(exc, DatabaseError) and statement_failed(exc):
            raise InvalidInput(
                f"the query failed while it ran: {caller_message(message)}",
                reason="query_failed",
                field="cypher",
                hint="Neo4j's message names the problem; rewrite the query (a retry fails "
                "the same way)",
            ) from exc
        raise exc

    async def run(
        self, query: str, params: dict[str, Any] | None = None, *, write: bool = False
    ) -> list[dict[str, Any]]:
        """Run one trusted parameterised statement and return its records as dicts."""
        from neo4j import Query

        deadline = self.settings.deadline_s + (self.settings.write_timeout_s if write else 0)
        remaining = await self._started(deadline)
        try:
            records, _, _ = await self._within(
                remaining,
                "write" if write else "read",
                self._driver.execute_query(
                    Query(query, timeout=self.settings.write_timeout_s),
                    params or {},
                    database_=self.settings.database,
                    routing_="w" if write else "r",
                ),
            )
        except BackendUnavailable:
            raise
        except Exception as exc:
            await self._raise_mapped(exc)
            raise
        return [r.data() for r in records]

    async def write_transaction(self, work: Callable[[Any], Awaitable[T]]) -> T:
        """Run ``work(tx)`` in one write transaction: its statements (``tx_rows``) commit
        together or not at all, within the write deadline; errors mapped as in ``run``. The
        driver may run ``work`` again on a transient failure: it must be idempotent."""
        from neo4j import unit_of_work

        @unit_of_work(timeout=self.settings.write_timeout_s)
        async def unit(tx: Any) -> T:
            return await work(tx)

        async def transaction() -> T:
            async with self._driver.session(database=self.settings.database) as session:
                return await session.execute_write(unit)

        remaining = await self._started(self.settings.deadline_s + self.settings.write_timeout_s)
        try:
            return await self._within(remaining, "write", transaction())
        except BackendUnavailable:
            raise
        except Exception as exc:
            await self._raise_mapped(exc)
            raise

    async def read(
        self, query: str, params: dict[str, Any], *, max_rows: int, trusted: bool = True
    ) -> tuple[list[str], list[list[Any]]]:
        """A READ-mode transaction with the query timeout; more than ``max_rows`` records is
        ``QueryLimitExceeded`` (fetching stops there). ``trusted=False`` for a caller's own
        Cypher: its running past the query timeout, or failing while it runs, is the caller's
        (422); the gateway's own queries timing out mean Neo4j is slow or restarting (503)."""
        from neo4j import READ_ACCESS, unit_of_work

        timeout = self.settings.query_timeout_s

        @unit_of_work(timeout=timeout)
        async def work(tx: Any) -> tuple[list[str], list[list[Any]]]:
            result = await tx.run(query, params)
            keys = list(result.keys())
            rows: list[list[Any]] = []
            async for record in result:
                if len(rows) >= max_rows:
                    raise QueryLimitExceeded(
                        f"the query returns more than {max_rows} rows",
                        reason="row_limit",
                        hint=f"add LIMIT {max_rows} or narrow the query",
                    )
                rows.append([to_plain(v) for v in record.values()])
            return keys, rows

        async def transaction() -> tuple[list[str], list[list[Any]]]:
            async with self._driver.session(
                database=self.settings.database, default_access_mode=READ_ACCESS
            ) as session:
                return await session.execute_read(work)

        remaining = await self._started(self.settings.deadline_s)
        try:
            return await self._within(remaining, "query", transaction())
        except (QueryLimitExceeded, BackendUnavailable):
            raise
        except Exception as exc:
            await self._raise_mapped(exc, trusted=trusted)
            raise

    async def read_own(
        self, query: str, params: dict[str, Any], *, max_rows: int
    ) -> tuple[list[str], list[list[Any]]]:
        """``read`` for the gateway's own text (a template, never a caller's): its parameters
        bound as one map, so Neo4j plans it once whatever their lengths
        (deployments/graph_store/params.py)."""
        return await self.read(bundled(query), bound(params), max_rows=max_rows)

    async def explain(
        self, query: str, params: dict[str, Any], *, deadline_s: float | None = None
    ) -> Any:
        """``EXPLAIN query`` in a READ session within ``deadline_s`` (default the settings'
        ``deadline_s``): the result summary (query type and plan)."""
        from neo4j import READ_ACCESS

        async def plan() -> Any:
            async with self._driver.session(
                database=self.settings.database, default_access_mode=READ_ACCESS
            ) as session:
                result = await session.run("EXPLAIN " + query, params)
                return await result.consume()

        remaining = await self._started(deadline_s or self.settings.deadline_s)
        try:
            return await self._within(remaining, "EXPLAIN", plan())
        except BackendUnavailable:
            raise
        except Exception as exc:
            await self._raise_mapped(exc)
            raise

    async def close(self) -> None:
        async with self._lock:
            await self._reset()


def statement_failed(exc: Exception) -> bool:
    """Whether a Neo4j ``DatabaseError`` is a statement that failed while it ran (its own
    fault: ``Neo.DatabaseError.Statement.*``, or classified a client error by the server)
    rather than the database failing (storage, transactions, an unknown internal error)."""
    code = getattr(exc, "code", "") or ""
    if code.startswith("Neo.DatabaseError.Statement."):
        return True
    classification = getattr(exc, "gql_classification", None)
    return getattr(classification, "name", None) == "CLIENT_ERROR"


_STACK_LINE = re.compile(r"^\s*(?:at [\w.$<>]+\(|Caused by:|\.\.\. \d+ more)")
MAX_CALLER_MESSAGE = 600


def caller_message(message: str) -> str:
    """Neo4j's message for the caller: one line, no Java stack frames or causes (internal
    details), at most ``MAX_CALLER_MESSAGE`` characters."""
    lines = []
    for line in message.splitlines():
        if _STACK_LINE.match(line):
            break
        lines.append(line.strip())
    text = " ".join(part for part in lines if part)
    if len(text) > MAX_CALLER_MESSAGE:
        text = text[: MAX_CALLER_MESSAGE - 1].rstrip() + "…"
    return text


def orphan_index_name(statement: str, exc: Exception) -> str | None:
    """The constraint name of ``statement`` when creating it failed because an index of
    that name exists (left by an unfinished creation); otherwise ``None``."""
    code = getattr(exc, "code", "") or ""
    words = statement.split()
    if "IndexWithNameAlreadyExists" not in code or words[:2] != ["CREATE", "CONSTRAINT"]:
        return None
    return words[2]
