"""Every error of the one tree survives pickling with all its fields: raised inside a Serve
replica, it reaches the ingress (and the caller) as itself, with its status and reason."""

from __future__ import annotations

import pickle

import pytest

from batch_ingest.reindex import ReindexError
from batch_ingest.reindex.options import VerificationFailed
from batch_ingest.reindex.state import IllegalTransition
from batch_ingest.reindex.team import UnknownTeam
from deployments.errors import (
    BackendUnavailable,
    Conflict,
    Forbidden,
    GatewayError,
    InvalidInput,
    InvalidQuery,
    NotFound,
    QueryLimitExceeded,
    Unauthorized,
)
from deployments.graph_store.guard import CypherRejected
from serve_app.cli.vault import AccessFileError
from serve_app.http.rate_limits import RateLimited

SAMPLES: list[GatewayError] = [
    GatewayError("boom", hint="h", field="f"),
    InvalidInput("top_k must be at most 100", field="top_k"),
    Unauthorized("token expired", error="invalid_token"),
    Unauthorized("no credentials", error=None),
    Forbidden("team not granted", reason="team_not_granted", field="team_id"),
    Conflict("a reindex of dao_a is running"),
    BackendUnavailable("milvus", "connection refused", hint="see /readyz"),
    InvalidQuery("Invalid input 'MATC'"),
    QueryLimitExceeded("more than 1000 rows", reason="row_limit", hint="add LIMIT"),
    NotFound("no entity e1"),
    CypherRejected("operator Create is not allowed", "write"),
    ReindexError("team 'dao_a' has no unfinished reindex job to resume"),
    IllegalTransition("job j1: succeeded → running is not allowed"),
    VerificationFailed("verification failed for c__v2: 9 rows, expected 8"),
    UnknownTeam("team 'dao_typo' has no documents", hint="check the id", field="team_id"),
    AccessFileError("notes/_access.yaml: field 'team_id' is 'x'"),
    RateLimited("rate limit reached", retry_after_s=1.5, reason="team_rate_limit"),
]


def _subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub, *_subclasses(sub)}
    return found


def test_every_error_class_has_a_sample():
    assert _subclasses(GatewayError) | {GatewayError} <= {type(e) for e in SAMPLES}


@pytest.mark.parametrize("error", SAMPLES, ids=lambda e: f"{type(e).__name__}:{e.message[:12]}")
def test_error_round_trips_pickle_with_every_field(error):
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert copy.args == error.args
    assert vars(copy) == vars(error)
    assert (copy.status_code, copy.code, copy.message, copy.reason) == (
        error.status_code,
        error.code,
        error.message,
        error.reason,
    )
    assert copy.headers == error.headers


def test_base_fields_are_on_every_error():
    limit = QueryLimitExceeded("too many rows", reason="row_limit")
    assert (limit.status_code, limit.reason, limit.headers) == (422, "row_limit", {})
    assert BackendUnavailable("neo4j", "down").reason is None
    assert Unauthorized("x").headers["WWW-Authenticate"].startswith("Bearer")
