"""AccessContext: built only from the verified principal and the request's team; the body
narrows what the identity grants and never widens it."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batch_ingest.documents import SourceDocument
from deployments import acl
from deployments.errors import Forbidden
from deployments.protocols import ChunkRecord
from serve_app.access.context import AccessContext, OperatorRight, check_ingest, operator_scope
from serve_app.access.policy import Policy
from serve_app.auth.principal import Principal
from serve_app.contracts import SearchFilters
from serve_app.search.contracts import SearchDocsRequest

POLICY = Policy(
    projects=[
        {"project": "prj_ops", "access_level": "group", "allowed_groups": ["ops"]},
        {"project": "prj_board", "access_level": "private", "owner_group": "board"},
    ],
    skills=[
        {"skill": "SKILL-deploy", "access_level": "public", "required_permission": "skill:read"}
    ],
)


def request(**fields) -> SearchDocsRequest:
    return SearchDocsRequest.model_validate({"team_id": "dao_x", "query": "q", **fields})


def user(roles=("member",), team="dao_x", **fields) -> Principal:
    return Principal(sub="alice", method="jwt", teams={team: tuple(roles)}, **fields)


def search_ctx(principal: Principal, **fields) -> AccessContext:
    return caller_ctx(principal, request(**fields))


def caller_ctx(principal: Principal, req: SearchDocsRequest) -> AccessContext:
    return AccessContext.for_caller(
        principal,
        POLICY,
        team_id=req.team_id,
        user_id=req.user_id,
        agent_id=req.agent_id,
        visibility=req.visibility,
    )


def forbidden(call) -> Forbidden:
    with pytest.raises(Forbidden) as caught:
        call()
    return caught.value


def chunk(**fields) -> ChunkRecord:
    base = dict(chunk_id="c", doc_id="d", team_id="dao_x", chunk_index=0, text="t", title="",
                content_hash="h", embed_model="m")  # fmt: skip
    return ChunkRecord(**{**base, **fields})


# --- team -----------------------------------------------------------------------------------


def test_team_not_granted_by_the_identity_is_403_naming_it():
    error = forbidden(lambda: search_ctx(user(team="dao_y")))
    assert error.reason == "team_not_granted"
    assert "'dao_x'" in error.message
    assert "dao_y" in error.hint
    assert error.field == "team_id"


def test_context_carries_the_verified_identity_not_the_body():
    ctx = search_ctx(user(agent_id="ag_1"), user_id="alice", agent_id="ag_1")
    assert (ctx.team_id, ctx.user_id, ctx.agent_id, ctx.auth_method) == (
        "dao_x",
        "alice",
        "ag_1",
        "jwt",
    )


def test_body_user_id_of_someone_else_is_403():
    assert forbidden(lambda: search_ctx(user(), user_id="bob")).reason == "user_id_mismatch"


def test_body_agent_id_of_another_agent_is_403():
    error = forbidden(lambda: search_ctx(user(agent_id="ag_1"), agent_id="ag_2"))
    assert error.reason == "agent_id_mismatch"


def test_agent_id_declared_by_a_user_without_one_is_recorded_not_trusted():
    ctx = search_ctx(user(), agent_id="ag_daarwizz")
    assert ctx.agent_id == ""
    assert ctx.declared_agent_id == "ag_daarwizz"


# --- visibility -----------------------------------------------------------------------------


def test_public_mode_is_the_default_even_for_a_role_that_sees_confidential():
    ctx = search_ctx(user(["owner"]))
    assert ctx.allowed_visibilities == ("public",)
    assert ctx.search_filter(SearchFilters()).visibilities == ("public",)


@pytest.mark.parametrize("key", ["visibility", "mode"])
@pytest.mark.parametrize("role", ["owner", "guardian"])
def test_confidential_role_in_confidential_mode_sees_both(key, role):
    ctx = search_ctx(user([role]), **{key: "confidential"})
    assert ctx.allowed_visibilities == ("public", "confidential")
    assert ctx.search_filter(SearchFilters()).visibilities == ("public", "confidential")


@pytest.mark.parametrize("role", ["member", "guest", "service"])
def test_confidential_mode_without_a_confidential_role_is_403(role):
    error = forbidden(lambda: search_ctx(user([role]), mode="confidential"))
    assert error.reason == "confidential_not_granted"
    assert "owner" in error.hint


def test_confidential_is_granted_in_one_team_not_in_another():
    principal = Principal(
        sub="alice", method="jwt", teams={"dao_x": ("owner",), "dao_y": ("member",)}
    )
    assert search_ctx(principal, mode="confidential").allowed_visibilities[-1] == "confidential"
    other = request(team_id="dao_y", mode="confidential")
    assert forbidden(lambda: caller_ctx(principal, other))


# --- doc types ------------------------------------------------------------------------------


def test_role_doc_types_restrict_a_search_without_doc_type_filter():
    flt = search_ctx(user(["guest"])).search_filter(SearchFilters())
    assert flt.doc_types == ("doc", "wiki")


def test_requested_doc_types_are_intersected_with_the_roles():
    filters = SearchFilters(doc_type=["wiki", "transaction", "doc"])
    assert search_ctx(user(["guest"])).search_filter(filters).doc_types == ("wiki", "doc")


def test_only_doc_types_outside_the_roles_is_403():
    ctx = search_ctx(user(["guest"]))
    error = forbidden(lambda: ctx.search_filter(SearchFilters(doc_type=["transaction"])))
    assert error.reason == "doc_type_not_granted"
    assert error.field == "filters.doc_type"


def test_role_with_all_doc_types_keeps_the_request_as_is():
    assert search_ctx(user(["owner"])).search_filter(SearchFilters()).doc_types == ()


def test_unknown_role_grants_no_doc_type():
    assert forbidden(lambda: search_ctx(user(["visitor"])).search_filter(SearchFilters()))


# --- resource policies ------------------------------------------------------------------------


def test_project_filter_denied_by_policy_is_403_before_searching():
    ctx = search_ctx(user(groups=frozenset({"data"})))
    error = forbidden(lambda: ctx.search_filter(SearchFilters(project_id="prj_ops")))
    assert error.reason == "not_in_allowed_groups"
    assert error.field == "filters.project_id"


def test_project_filter_allowed_by_group():
    ctx = search_ctx(user(groups=frozenset({"ops"})))
    assert ctx.search_filter(SearchFilters(project_id="prj_ops")).project_id == "prj_ops"


def test_may_see_drops_chunks_of_denied_projects_and_skills():
    ctx = search_ctx(user(groups=frozenset({"ops"})))
    assert ctx.may_see(chunk(project_id="prj_ops"))
    assert not ctx.may_see(chunk(project_id="prj_board"))
    assert not ctx.may_see(chunk(doc_id="SKILL-deploy"))
    assert not ctx.may_see(chunk(tags=("skill:SKILL-deploy",)))
    allowed = search_ctx(user(permissions=frozenset({"skill:read"})))
    assert allowed.may_see(chunk(doc_id="SKILL-deploy"))


def test_may_see_checks_team_visibility_and_doc_type():
    ctx = search_ctx(user(["guest"]))
    assert ctx.may_see(chunk(doc_type="wiki"))
    assert not ctx.may_see(chunk(team_id="dao_y"))
    assert not ctx.may_see(chunk(visibility="confidential"))
    assert not ctx.may_see(chunk(doc_type="transaction"))


CHUNKS_OF_EVERY_KIND = [
    chunk(),
    chunk(doc_type="wiki"),
    chunk(team_id="dao_y"),
    chunk(visibility="confidential"),
    chunk(doc_type="transaction"),
    chunk(project_id="prj_ops"),
    chunk(project_id="prj_board"),
    chunk(doc_id="SKILL-deploy"),
    chunk(tags=("skill:SKILL-deploy",)),
    chunk(acl_allow=("user:alice",)),
    chunk(acl_allow=("user:bob",)),
    chunk(acl_allow=("group:ops",)),
    chunk(acl_allow=("*",), acl_deny=("group:ops",)),
    chunk(acl_allow=("user:alice", "group:board"), acl_deny=("user:alice",)),
    chunk(acl_allow=()),
]


def _seen(ctx: AccessContext, c: ChunkRecord) -> bool:
    """The rule spelled out, one chunk at a time: scope, document ACL, resource policy."""
    held = set(acl.principal_tokens(ctx.user_id, ctx.groups))
    allowed = bool(held & set(c.acl_allow)) if c.acl_allow else "*" in held
    return (
        c.team_id == ctx.team_id
        and c.visibility in ctx.allowed_visibilities
        and (ctx.allowed_doc_types is None or c.doc_type in ctx.allowed_doc_types)
        and allowed
        and not held & set(c.acl_deny)
        and ctx.policy.resource_decision(
            ctx.team_id, c.project_id, c.doc_id, c.tags, ctx.roles, ctx.groups, ctx.permissions
        ).allowed
    )


@pytest.mark.parametrize("policy", [POLICY, Policy()], ids=["projects", "open"])
@pytest.mark.parametrize(
    "principal",
    [
        user(["guest"]),
        user(groups=frozenset({"ops"})),
        user(["owner"], permissions=frozenset({"skill:read"}), groups=frozenset({"board"})),
    ],
    ids=["guest", "ops", "owner"],
)
def test_may_see_each_is_may_see_of_each_chunk(policy, principal):
    ctx = replace(search_ctx(principal), policy=policy)
    verdicts = ctx.may_see_each(CHUNKS_OF_EVERY_KIND)
    assert verdicts == [_seen(ctx, c) for c in CHUNKS_OF_EVERY_KIND]
    assert verdicts == [ctx.may_see(c) for c in CHUNKS_OF_EVERY_KIND]
    assert True in verdicts and False in verdicts


TOKENS = st.sampled_from(["*", "user:alice", "user:bob", "group:ops", "group:board"])


@settings(max_examples=400, deadline=None)
@given(allow=st.lists(TOKENS, max_size=3), deny=st.lists(TOKENS, max_size=3),
       held=st.frozensets(TOKENS))  # fmt: skip
def test_admits_held_is_the_acl_rule(allow, deny, held):
    allowed = bool(held & set(allow)) if allow else "*" in held
    assert acl.admits_held(tuple(allow), tuple(deny), held) is (allowed and not held & set(deny))


# --- ingestion ------------------------------------------------------------------------------


def doc(**fields) -> SourceDocument:
    return SourceDocument.model_validate({"team_id": "dao_x", "doc_id": "d", "text": "t", **fields})


@pytest.mark.parametrize("role", ["owner", "guardian", "service"])
def test_write_roles_may_ingest(role):
    check_ingest(user([role]), [doc()], POLICY)


@pytest.mark.parametrize("role", ["member", "guest"])
def test_other_roles_may_not_ingest(role):
    error = forbidden(lambda: check_ingest(user([role]), [doc()], POLICY))
    assert error.reason == "write_not_granted"
    assert error.field == "documents.0.team_id"


def test_ingest_into_a_team_not_granted_is_403_naming_the_document():
    docs = [doc(), doc(team_id="dao_y", doc_id="e")]
    error = forbidden(lambda: check_ingest(user(["owner"]), docs, POLICY))
    assert error.reason == "team_not_granted"
    assert error.field == "documents.1.team_id"


def test_confidential_document_needs_a_confidential_role():
    error = forbidden(lambda: check_ingest(user(["service"]), [doc(mode="confidential")], POLICY))
    assert error.reason == "confidential_not_granted"
    check_ingest(user(["guardian"]), [doc(mode="confidential")], POLICY)


def test_doc_type_outside_the_writers_roles_may_not_be_ingested():
    policy = Policy(doc_types={"service": ["doc", "wiki"]})
    error = forbidden(lambda: check_ingest(user(["service"]), [doc(doc_type="rwa")], policy))
    assert error.reason == "doc_type_not_granted"
    assert error.field == "documents.0.doc_type"
    check_ingest(user(["service"]), [doc(doc_type="wiki")], policy)


def test_ingest_into_a_denied_project_is_403():
    error = forbidden(lambda: check_ingest(user(["owner"]), [doc(project_id="prj_board")], POLICY))
    assert error.reason == "not_in_owner_group"


# --- development body trust ---------------------------------------------------------------------


def test_dev_principal_takes_identity_and_team_from_the_body():
    ctx = search_ctx(Principal.development(["owner"]), user_id="u1", agent_id="ag_1")
    assert (ctx.team_id, ctx.user_id, ctx.agent_id) == ("dao_x", "u1", "ag_1")


# --- compiling filters ----------------------------------------------------------------------


def test_public_caller_asking_for_confidential_filter_is_forbidden():
    ctx = AccessContext(team_id="dao_x")
    with pytest.raises(Forbidden, match="outside this caller's scope"):
        ctx.search_filter(SearchFilters(visibility="confidential"))


def test_owner_in_public_mode_asking_for_confidential_filter_is_forbidden():
    ctx = search_ctx(user(["owner"]))
    assert forbidden(lambda: ctx.search_filter(SearchFilters(visibility="confidential")))


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


# --- operator actions -------------------------------------------------------------------------

RIGHT = OperatorRight(
    action="reading the audit log",
    subject="the audit log",
    permission="audit:read",
    roles=("owner",),
    denied="audit_read_not_granted",
    by_permission="permission_audit_read",
    by_role="team_reader_role",
)


def test_operator_scope_grants_by_permission_or_by_a_role_in_the_named_team():
    auditor = Principal(sub="a", method="jwt", permissions=frozenset({"audit:read"}))
    owner = Principal(sub="o", method="jwt", teams={"dao_a": ("owner",)})
    assert operator_scope(auditor, None, RIGHT, production=True) == "permission_audit_read"
    assert operator_scope(owner, "dao_a", RIGHT, production=True) == "team_reader_role"
    for team in ("dao_b", None):  # another team, or every team: the role does not count
        with pytest.raises(Forbidden) as err:
            operator_scope(owner, team, RIGHT, production=True)
        assert err.value.reason == "audit_read_not_granted"
        assert "'audit:read'" in (err.value.hint or "")


def test_operator_scope_trusts_a_dev_caller_only_outside_production():
    dev = Principal.development(("member",))
    assert operator_scope(dev, "dao_a", RIGHT, production=False) == "dev_mode"
    with pytest.raises(Forbidden, match="verified identity in production"):
        operator_scope(dev, "dao_a", RIGHT, production=True)
