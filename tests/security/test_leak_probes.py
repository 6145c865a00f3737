"""The leak-probe runner (tests/security/leak_probes.py): no leak and no 500 on the real gateway,
and a deliberately broken access path is reported as a leak (so the probes can fail)."""

from __future__ import annotations

import dataclasses

import pytest

from deployments.testing.fakes import MemoryIndexStore
from serve_app.access import context as access
from serve_app.access.context import AccessContext
from serve_app.search.cache import semantic
from tests.security.leak_probes import ENDPOINTS, render_tables, run_probes

pytestmark = pytest.mark.usefixtures("clean_gateway_env")


# The search path over Milvus (the fake store evaluates the filter term by term) and over the
# Retriever's in-memory index (the real TeamIndex over every team's rows, the compiled filter).
STORES = {"milvus": None, "memory_index": MemoryIndexStore}


@pytest.mark.parametrize("store", STORES.values(), ids=STORES.keys())
def test_probes_find_no_leak_and_no_server_error(store):
    result = run_probes(200, seed=1, store=store)
    assert result["leaks_found"] == 0, result["leaks"]
    assert result["server_errors"] == 0, result["server_error_samples"]
    assert sum(sum(c.values()) for c in result["runs"].values()) == 200
    assert set(result["runs"]) == set(ENDPOINTS)
    # Enough probes got through to check what came back.
    assert result["statuses"][ENDPOINTS[0]].get("200", 0) > 10
    assert result["checked_matches"] > 0
    # rag.enrich_answer is probed too, and some of its answers carry sources to check.
    assert result["statuses"][ENDPOINTS[3]].get("200", 0) > 5
    assert "| **all endpoints** |" in render_tables(result)


def test_same_seed_same_probes():
    a, b = run_probes(40, seed=3), run_probes(40, seed=3)
    assert a["runs"] == b["runs"]


def _no_result_filter(monkeypatch: pytest.MonkeyPatch) -> None:
    """The result filter behind the store filter admits everything (one chunk or many)."""
    monkeypatch.setattr(AccessContext, "may_see", lambda self, chunk: True)
    monkeypatch.setattr(AccessContext, "may_see_each", lambda self, chunks: [True for _ in chunks])


def _confidential_in_public_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(access.VISIBILITY_SCOPE, "public", ("public", "confidential"))
    _no_result_filter(monkeypatch)


def _other_team_in_the_filter(monkeypatch: pytest.MonkeyPatch) -> None:
    original = AccessContext.search_filter

    def search_filter(self, filters):
        flt = original(self, filters)
        other = "dao_b" if flt.team_id != "dao_b" else "dao_a"
        return dataclasses.replace(flt, team_id=other)

    monkeypatch.setattr(AccessContext, "search_filter", search_filter)
    _no_result_filter(monkeypatch)


@pytest.mark.parametrize("store", STORES.values(), ids=STORES.keys())
@pytest.mark.parametrize("breakage", [_confidential_in_public_mode, _other_team_in_the_filter])
def test_a_broken_access_path_is_reported_as_a_leak(monkeypatch, breakage, store):
    breakage(monkeypatch)
    result = run_probes(100, seed=2, store=store)
    assert result["leaks_found"] > 0
    assert any(leak["endpoint"] == ENDPOINTS[0] for leak in result["leaks"])
    # The sources of rag.enrich_answer go through the same access path.
    assert any(leak["endpoint"] == ENDPOINTS[3] for leak in result["leaks"])


def test_probes_exercise_the_semantic_cache():
    result = run_probes(200, seed=4)
    assert result["leaks_found"] == 0, result["leaks"]
    assert result["cache_hits"] > 0
    assert result["runs"][ENDPOINTS[0]].get("cache_pair", 0) > 0


def test_a_cache_that_ignores_the_scope_is_reported_as_a_leak(monkeypatch):
    # Buckets keyed by the team alone: callers with other groups, roles or modes share them.
    monkeypatch.setattr(AccessContext, "scope_key", lambda self: (self.team_id,))
    original = semantic.SemanticCache.lookup

    async def lookup(self, **kw):
        kw["flt"] = dataclasses.replace(
            kw["flt"], visibilities=(), doc_types=(), acl_principals=("*",)
        )
        kw["shape"] = {k: v for k, v in kw["shape"].items() if k != "visibility"}
        return await original(self, **kw)

    monkeypatch.setattr(semantic.SemanticCache, "lookup", lookup)
    result = run_probes(400, seed=5)
    assert result["leaks_found"] > 0
    assert any(leak["category"] == "cache_pair" for leak in result["leaks"])
