"""One Neo4j driver: connect and bootstrap the schema, run trusted statements, read caller
queries in READ transactions with a timeout and a row limit, EXPLAIN them, and map the
driver's errors to the gateway's (a connection failure → 503 and a reconnect next time,
Neo4j's client errors → the matching 4xx)."""

from __future__ import annotations

import asyncio
from typing import Any

from deployments.config import Neo4jSettings
from deployments.errors import (
    BackendUnavailable,
    Forbidden,
    InvalidQuery,
    QueryLimitExceeded,
)
from deployments.graph_cypher import schema_statements
from deployments.graph_values import to_plain


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

    async def start(self) -> None:
        """Connect and create the schema; idempotent."""
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
                await asyncio.wait_for(self._bootstrap(), self.settings.deadline_s)
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
            await self._driver.execute_query(statement, database_=self.settings.database)

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

    async def _raise_mapped(self, exc: Exception) -> None:
        """Re-raise connection failures as ``BackendUnavailable`` (and reconnect next time);
        Neo4j's client errors as the gateway's 4xx errors."""
        from neo4j.exceptions import (
            ClientError,
            ServiceUnavailable,
            SessionExpired,
            TransientError,
        )

        if isinstance(exc, ServiceUnavailable | SessionExpired | OSError):
            await self._reset()
            raise BackendUnavailable("neo4j", f"query failed: {exc}") from exc
        code = getattr(exc, "code", "") or ""
        message = getattr(exc, "message", None) or str(exc)
        if "TransactionTimedOut" in code or "Transaction.TransactionTimedOut" in code:
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
        raise exc

    async def run(
        self, query: str, params: dict[str, Any] | None = None, *, write: bool = False
    ) -> list[dict[str, Any]]:
        """Run one trusted parameterised statement and return its records as dicts."""
        from neo4j import Query

        await self.start()
        deadline = self.settings.deadline_s + (self.settings.write_timeout_s if write else 0)
        try:
            records, _, _ = await self._within(
                deadline,
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

    async def read(
        self, query: str, params: dict[str, Any], *, max_rows: int
    ) -> tuple[list[str], list[list[Any]]]:
        """A READ-mode transaction with the query timeout; more than ``max_rows`` records is
        ``QueryLimitExceeded`` (fetching stops there)."""
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

        await self.start()
        try:
            return await self._within(self.settings.deadline_s, "query", transaction())
        except (QueryLimitExceeded, BackendUnavailable):
            raise
        except Exception as exc:
            await self._raise_mapped(exc)
            raise

    async def explain(self, query: str, params: dict[str, Any]) -> Any:
        """``EXPLAIN query`` in a READ session: the result summary (query type and plan)."""
        from neo4j import READ_ACCESS

        async def plan() -> Any:
            async with self._driver.session(
                database=self.settings.database, default_access_mode=READ_ACCESS
            ) as session:
                result = await session.run("EXPLAIN " + query, params)
                return await result.consume()

        await self.start()
        try:
            return await self._within(self.settings.deadline_s, "EXPLAIN", plan())
        except BackendUnavailable:
            raise
        except Exception as exc:
            await self._raise_mapped(exc)
            raise

    async def close(self) -> None:
        async with self._lock:
            await self._reset()
