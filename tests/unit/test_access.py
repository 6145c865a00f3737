"""AccessContext: the caller's scope decides which visibilities a search may touch."""

from __future__ import annotations

import pytest

from deployments.errors import Forbidden
from serve_app.access import AccessContext
from serve_app.contracts import SearchDocsRequest, SearchFilters


def request(**fields) -> SearchDocsRequest:
    return SearchDocsRequest.model_validate({"team_id": "dao_x", "query": "q", **fields})


def test_public_caller_may_see_only_public():
    ctx = AccessContext.from_search_request(request())
    assert ctx.allowed_visibilities == ("public",)
    assert ctx.search_filter(SearchFilters()).visibilities == ("public",)


@pytest.mark.parametrize("key", ["visibility", "mode"])
def test_confidential_caller_may_see_public_and_confidential(key):
    ctx = AccessContext.from_search_request(request(**{key: "confidential"}))
    assert ctx.allowed_visibilities == ("public", "confidential")
    assert ctx.search_filter(SearchFilters()).visibilities == ("public", "confidential")


def test_context_carries_identity_from_request():
    ctx = AccessContext.from_search_request(request(user_id="u1", agent_id="ag_1"))
    assert (ctx.team_id, ctx.user_id, ctx.agent_id) == ("dao_x", "u1", "ag_1")


def test_public_caller_asking_for_confidential_filter_is_forbidden():
    ctx = AccessContext(team_id="dao_x")
    with pytest.raises(Forbidden, match="outside this caller's scope"):
        ctx.search_filter(SearchFilters(visibility="confidential"))


def test_forbidden_maps_to_http_403():
    assert Forbidden("x").status_code == 403


def test_confidential_caller_can_narrow_to_one_visibility():
    ctx = AccessContext(team_id="dao_x", allowed_visibilities=("public", "confidential"))
    assert ctx.search_filter(SearchFilters(visibility="public")).visibilities == ("public",)
    assert ctx.search_filter(SearchFilters(visibility="confidential")).visibilities == (
        "confidential",
    )


def test_public_caller_filtering_public_keeps_public():
    ctx = AccessContext(team_id="dao_x")
    assert ctx.search_filter(SearchFilters(visibility="public")).visibilities == ("public",)


def test_team_of_filter_always_comes_from_context():
    ctx = AccessContext(team_id="dao_x")
    assert ctx.search_filter(SearchFilters(project_id="p")).team_id == "dao_x"


def test_request_filters_compile_into_search_filter():
    filters = SearchFilters.model_validate(
        {
            "project_id": "prj_x",
            "channel_id": "ch_1",
            "agent_id": "ag_1",
            "doc_type": ["doc", "wiki"],
            "tags": ["energy"],
            "created_from": "2025-01-01T00:00:00Z",
            "created_to": 1767225600,
        }
    )
    flt = AccessContext(team_id="dao_x").search_filter(filters)
    assert flt.project_id == "prj_x"
    assert flt.channel_id == "ch_1"
    assert flt.agent_id == "ag_1"
    assert flt.doc_types == ("doc", "wiki")
    assert flt.tags_any == ("energy",)
    assert (flt.created_from, flt.created_to) == (1735689600, 1767225600)


def test_single_doc_type_string_becomes_a_list():
    flt = AccessContext(team_id="t").search_filter(
        SearchFilters.model_validate({"doc_type": "wiki"})
    )
    assert flt.doc_types == ("wiki",)


def test_empty_string_ids_mean_no_filter():
    flt = AccessContext(team_id="t").search_filter(
        SearchFilters(project_id="", channel_id="", agent_id="")
    )
    assert (flt.project_id, flt.channel_id, flt.agent_id) == (None, None, None)
    assert (flt.doc_types, flt.tags_any) == ((), ())
