"""How deployments/graph_store/client.py maps the neo4j driver's errors: a caller's own Cypher that
fails while it runs is the caller's (422), an outage and the gateway's own queries stay 503
(the same errors from the real server in tests/integration/test_graph_queries.py)."""

from __future__ import annotations

import pytest
from neo4j.exceptions import (
    DatabaseError,
    Neo4jError,
    ServiceUnavailable,
    SessionExpired,
    TransientError,
)

from deployments.config import Neo4jSettings
from deployments.errors import BackendUnavailable, InvalidInput, InvalidQuery
from deployments.graph_store.client import MAX_CALLER_MESSAGE, Neo4jClient, caller_message

SHORTEST = (
    "The shortest path algorithm does not work when the start and end nodes are the same. "
    "This can happen if you\nperform a shortestPath search after a cartesian product that "
    "might have the same start and end nodes for some\nof the rows passed to shortestPath."
)


def server_error(code: str, message: str) -> Neo4jError:
    """An error as the driver builds it from a server FAILURE message."""
    return Neo4jError._hydrate_neo4j(code=code, message=message)


async def mapped(exc: Exception, *, trusted: bool) -> BaseException:
    client = Neo4jClient(Neo4jSettings())
    with pytest.raises(BaseException) as err:
        await client._raise_mapped(exc, trusted=trusted)
    return err.value


async def test_a_callers_query_failing_at_run_time_is_422_with_neo4js_message():
    exc = server_error("Neo.DatabaseError.Statement.ExecutionFailed", SHORTEST)
    assert isinstance(exc, DatabaseError)
    error = await mapped(exc, trusted=False)
    assert isinstance(error, InvalidInput)
    assert (error.status_code, error.code, error.reason) == (422, "invalid_input", "query_failed")
    assert error.field == "cypher"
    assert error.message.startswith("the query failed while it ran: The shortest path")
    assert "start and end nodes are the same" in error.message
    assert "\n" not in error.message and "Neo.DatabaseError" not in error.message


async def test_the_same_error_of_a_gateway_query_stays_neo4js_trouble():
    exc = server_error("Neo.DatabaseError.Statement.ExecutionFailed", SHORTEST)
    assert await mapped(exc, trusted=True) is exc  # re-raised: the ingress answers 503


@pytest.mark.parametrize("trusted", [True, False])
async def test_outages_stay_503(trusted):
    for exc in (
        ServiceUnavailable("Couldn't connect to 127.0.0.1:7687"),
        SessionExpired("session expired"),
        ConnectionRefusedError(111, "Connection refused"),
        server_error("Neo.TransientError.General.DatabaseUnavailable", "database unavailable"),
        server_error("Neo.TransientError.Transaction.Terminated", "terminated"),
    ):
        error = await mapped(exc, trusted=trusted)
        assert isinstance(error, BackendUnavailable), (exc, error)
        assert error.status_code == 503
    assert isinstance(
        server_error("Neo.TransientError.General.DatabaseUnavailable", "x"), TransientError
    )


async def test_a_database_failure_that_is_not_the_statement_is_not_the_callers():
    exc = server_error("Neo.DatabaseError.General.UnknownError", "storage went away")
    assert await mapped(exc, trusted=False) is exc


async def test_client_errors_keep_their_400():
    exc = server_error("Neo.ClientError.Procedure.ProcedureCallFailed", "bad lucene")
    error = await mapped(exc, trusted=False)
    assert isinstance(error, InvalidQuery) and error.status_code == 400


def test_caller_message_drops_stack_frames_and_is_bounded():
    text = "boom happened\n\tat org.neo4j.cypher.Foo.bar(Foo.java:12)\nCaused by: x.Y: secret"
    assert caller_message(text) == "boom happened"
    long = caller_message("x" * 5000)
    assert len(long) == MAX_CALLER_MESSAGE and long.endswith("…")
