"""Milvus filter expressions: every value stays inside one literal, whatever it contains.

The check parses the expression back: each double-quoted literal is decoded with
``json.JSONDecoder.raw_decode`` and replaced by ``?``; the remaining skeleton must be exactly
the expected shape and the decoded values exactly the inputs, in order. A value that broke out
of its quotes would change the skeleton or the list of values.
"""

from __future__ import annotations

import json

import pytest

from deployments.acl import token_key
from deployments.errors import InvalidInput
from deployments.protocols import SearchFilter
from deployments.vector_store.filter import build_filter_expr, milvus_list, milvus_literal

ADVERSARIAL = [
    '"',
    "\\",
    '\\"',
    '" or team_id != "',
    '") or (1==1 or team_id == "',
    ") or (1==1",
    "' or '1'='1",
    'dao" || visibility == "confidential',
    "trailing backslash \\",
    "проєкт «Зелена їжа» ✓ 🚀",
    "\u2028line separator\u2029",
    "del\x7fchar",
    'array_contains_any(tags, ["x"])',
]
CONTROL = ["\x00", "a\nb", "tab\there", "\x1f", "\r"]

_DECODER = json.JSONDecoder()


def parse(expr: str) -> tuple[str, list[str]]:
    """Split an expression into its skeleton (literals as ``?``) and the decoded literals."""
    skeleton: list[str] = []
    values: list[str] = []
    i = 0
    while i < len(expr):
        if expr[i] == '"':
            value, end = _DECODER.raw_decode(expr, i)
            values.append(value)
            skeleton.append("?")
            i = end
        else:
            skeleton.append(expr[i])
            i += 1
    return "".join(skeleton), values


def test_minimal_filter_has_team_and_single_visibility_terms():
    assert build_filter_expr(SearchFilter(team_id="dao_x")) == (
        'team_id == "dao_x" and visibility == "public" and (acl_allow_key == "*")'
    )


def test_full_filter_has_every_term_in_order():
    flt = SearchFilter(
        team_id="t",
        visibilities=("public", "confidential"),
        project_id="p",
        channel_id="c",
        agent_id="a",
        doc_types=("doc", "wiki"),
        tags_any=("x", "y"),
        created_from=10,
        created_to=20,
    )
    skeleton, values = parse(build_filter_expr(flt))
    assert skeleton == (
        "team_id == ? and visibility in [?, ?] and project_id == ? and channel_id == ? "
        "and agent_id == ? and doc_type in [?, ?] and array_contains_any(tags, [?, ?]) "
        "and created_at >= 10 and created_at <= 20 and (acl_allow_key == ?)"
    )
    assert values == ["t", "public", "confidential", "p", "c", "a", "doc", "wiki", "x", "y", "*"]


def test_empty_string_project_is_a_term_but_none_is_no_term():
    assert "project_id" not in build_filter_expr(SearchFilter(team_id="t", project_id=None))
    assert 'project_id == ""' in build_filter_expr(SearchFilter(team_id="t", project_id=""))


@pytest.mark.parametrize("value", ADVERSARIAL)
def test_adversarial_team_id_stays_inside_one_literal(value):
    expr = build_filter_expr(SearchFilter(team_id=value))
    skeleton, values = parse(expr)
    assert expr.startswith("team_id == ")
    assert skeleton == "team_id == ? and visibility == ? and (acl_allow_key == ?)"
    assert values == [value, "public", "*"]


@pytest.mark.parametrize("value", ADVERSARIAL)
def test_adversarial_values_in_every_field_stay_inside_their_literals(value):
    flt = SearchFilter(
        team_id="dao_x",
        project_id=value,
        channel_id=value,
        agent_id=value,
        doc_types=(value, "doc"),
        tags_any=("tag", value),
        acl_principals=("*", "user:" + value, "group:" + value),
    )
    expr = build_filter_expr(flt)
    skeleton, values = parse(expr)
    assert expr.startswith('team_id == "dao_x" and ')
    assert skeleton == (
        "team_id == ? and visibility == ? and project_id == ? and channel_id == ? "
        "and agent_id == ? and doc_type in [?, ?] and array_contains_any(tags, [?, ?]) "
        "and (acl_allow_key == ? or acl_allow_key like ? or acl_allow_key like ?) "
        "and not (acl_deny_key like ?)"
    )
    assert values == [
        *("dao_x", "public", value, value, value, value, "doc", "tag", value),
        *("*", like("user:" + value), like("group:" + value), like("group:" + value)),
    ]


@pytest.mark.parametrize("value", ADVERSARIAL)
def test_milvus_literal_round_trips_through_json(value):
    literal = milvus_literal(value)
    assert literal.startswith('"')
    assert literal.endswith('"')
    assert json.loads(literal) == value
    assert parse(literal) == ("?", [value])


def test_unicode_is_kept_readable_not_escaped():
    assert milvus_literal("їжа") == '"їжа"'


def test_milvus_list_round_trips():
    assert json.loads(milvus_list(ADVERSARIAL)) == ADVERSARIAL
    assert milvus_list([]) == "[]"


@pytest.mark.parametrize(
    ("value", "literal"), [(True, "true"), (False, "false"), (7, "7"), (-3, "-3"), (1.5, "1.5")]
)
def test_non_string_scalars_become_bare_literals(value, literal):
    assert milvus_literal(value) == literal


@pytest.mark.parametrize("value", [None, b"bytes", ["list"]])
def test_unsupported_literal_types_raise_invalid_input(value):
    with pytest.raises(InvalidInput):
        milvus_literal(value)


@pytest.mark.parametrize("value", CONTROL)
def test_control_characters_raise_invalid_input(value):
    with pytest.raises(InvalidInput, match="control characters"):
        milvus_literal(value)


@pytest.mark.parametrize("value", CONTROL)
@pytest.mark.parametrize(
    "make",
    [
        lambda v: SearchFilter(team_id=v),
        lambda v: SearchFilter(team_id="t", project_id=v),
        lambda v: SearchFilter(team_id="t", channel_id=v),
        lambda v: SearchFilter(team_id="t", agent_id=v),
        lambda v: SearchFilter(team_id="t", doc_types=("doc", v)),
        lambda v: SearchFilter(team_id="t", tags_any=(v,)),
        lambda v: SearchFilter(team_id="t", acl_principals=("*", "group:" + v)),
    ],
    ids=["team_id", "project_id", "channel_id", "agent_id", "doc_types", "tags_any", "acl"],
)
def test_control_characters_in_any_filter_field_raise_invalid_input(make, value):
    flt = make(value)
    with pytest.raises(InvalidInput):
        build_filter_expr(flt)


def test_empty_team_raises_invalid_input():
    with pytest.raises(InvalidInput, match="team_id"):
        build_filter_expr(SearchFilter(team_id=""))


def test_no_allowed_visibility_raises_invalid_input():
    with pytest.raises(InvalidInput, match="visibility"):
        build_filter_expr(SearchFilter(team_id="t", visibilities=()))


def test_created_bounds_are_integers_and_zero_is_kept():
    expr = build_filter_expr(SearchFilter(team_id="t", created_from=0, created_to=5))
    assert expr.endswith("created_at >= 0 and created_at <= 5" + ACL_OPEN_TERM)


def like(token: str) -> str:
    return f"%|{token_key(token)}|%"


ACL_OPEN_TERM = ' and (acl_allow_key == "*")'


def test_acl_terms_allow_the_callers_tokens_and_deny_its_groups():
    flt = SearchFilter(team_id="t", acl_principals=("*", "user:al", "group:hr"))
    expr = build_filter_expr(flt)
    al, hr = token_key("user:al"), token_key("group:hr")
    assert expr.endswith(
        f'(acl_allow_key == "*" or acl_allow_key like "%|{al}|%" or acl_allow_key like '
        f'"%|{hr}|%") and not (acl_deny_key like "%|{hr}|%")'
    )
    # Hex keys: a group name with like wildcards or the delimiter cannot widen the match.
    assert set(al + hr) <= set("0123456789abcdef")
    # A collection built before ACLs gets no ACL term (it holds no document with a list).
    assert build_filter_expr(flt, acl=False) == 'team_id == "t" and visibility == "public"'


def test_a_search_without_acl_tokens_is_refused():
    with pytest.raises(InvalidInput, match="ACL"):
        build_filter_expr(SearchFilter(team_id="t", acl_principals=()))
