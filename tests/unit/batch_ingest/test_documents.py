"""The source-document contract: aliases, timestamps, identifiers, chunk ids."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from batch_ingest.documents import SourceDocument, content_hash, make_chunk_id


def doc(**overrides) -> SourceDocument:
    fields = {"team_id": "dao_greenfood", "doc_id": "doc_1", "text": "hello"}
    fields.update(overrides)
    return SourceDocument.model_validate(fields)


def error_fields(exc: ValidationError) -> set[str]:
    return {".".join(str(p) for p in err["loc"]) for err in exc.errors()}


@pytest.mark.parametrize("alias", ["team_id", "dao_id", "microdao_id"])
def test_team_id_accepts_dao_aliases(alias):
    parsed = SourceDocument.model_validate({alias: "dao_x", "doc_id": "d", "text": "t"})
    assert parsed.team_id == "dao_x"


def test_id_is_an_alias_of_doc_id():
    parsed = SourceDocument.model_validate({"team_id": "t", "id": "doc_123", "text": "t"})
    assert parsed.doc_id == "doc_123"


def test_mode_is_an_alias_of_visibility():
    assert doc(mode="confidential").visibility == "confidential"


def test_visibility_defaults_to_public_and_doc_type_to_doc():
    parsed = doc()
    assert (parsed.visibility, parsed.doc_type) == ("public", "doc")


def test_unknown_visibility_rejected():
    with pytest.raises(ValidationError) as info:
        doc(visibility="secret")
    assert "visibility" in error_fields(info.value)


def test_unknown_field_rejected():
    with pytest.raises(ValidationError) as info:
        doc(colour="green")
    assert "colour" in error_fields(info.value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2025-01-02T03:04:05Z", int(datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC).timestamp())),
        ("2025-01-02T03:04:05+00:00", 1735787045),
        ("2025-01-02T05:04:05+02:00", 1735787045),
        ("2025-01-02T03:04:05", 1735787045),  # naive means UTC
        ("2025-01-02", 1735776000),
        # RFC 3339 allows a lowercase separator and zone letter.
        ("2025-01-02t03:04:05z", 1735787045),
        (1735787045, 1735787045),
        (1735787045.9, 1735787045),
        (0, 0),
    ],
)
def test_created_at_accepts_iso_and_epoch(value, expected):
    assert doc(created_at=value).created_at == expected


@pytest.mark.parametrize(
    "value",
    [
        "yesterday",
        "2025-13-01",
        "1735787045",
        True,
        [2025],
        {},
        # In year 0 and year 10000 once in UTC: an OverflowError, a 500, before.
        "0001-01-01T00:00:00+01:00",
        "9999-12-31T23:59:59-01:00",
    ],
)
def test_invalid_created_at_rejected(value):
    with pytest.raises(ValidationError) as info:
        doc(created_at=value)
    assert "created_at" in error_fields(info.value)


def test_missing_created_at_defaults_to_zero():
    assert doc().created_at == 0


def test_infinite_created_at_rejected_as_validation_error():
    with pytest.raises(ValidationError):
        doc(created_at=float("inf"))


@pytest.mark.parametrize("field", ["team_id", "doc_id", "project_id", "channel_id", "agent_id"])
@pytest.mark.parametrize("bad", ["a\x00b", "a\nb", "a\tb", "a\x1fb"])
def test_control_characters_in_ids_rejected(field, bad):
    with pytest.raises(ValidationError) as info:
        doc(**{field: bad})
    assert field in error_fields(info.value)


def test_control_characters_in_tags_rejected():
    with pytest.raises(ValidationError) as info:
        doc(tags=["ok", "bad\x07tag"])
    assert "tags.1" in error_fields(info.value)


def test_ids_are_stripped_of_surrounding_whitespace():
    parsed = doc(team_id="  dao_x ", doc_id=" d1\n", project_id=" p ")
    assert (parsed.team_id, parsed.doc_id, parsed.project_id) == ("dao_x", "d1", "p")


@pytest.mark.parametrize("field", ["team_id", "doc_id"])
@pytest.mark.parametrize("value", ["", "   "])
def test_empty_required_ids_rejected(field, value):
    with pytest.raises(ValidationError) as info:
        doc(**{field: value})
    assert field in error_fields(info.value)


def test_ids_longer_than_schema_limit_rejected():
    with pytest.raises(ValidationError) as info:
        doc(doc_id="x" * 257)
    assert "doc_id" in error_fields(info.value)


def test_unicode_ids_and_quotes_accepted():
    parsed = doc(team_id='дао "зелена їжа"', doc_id="док/1?x=') or (1==1")
    assert parsed.team_id == 'дао "зелена їжа"'


@pytest.mark.parametrize("value", ["", " ", "\n\t"])
def test_blank_text_rejected(value):
    with pytest.raises(ValidationError) as info:
        doc(text=value)
    assert "text" in error_fields(info.value)


@pytest.mark.parametrize("doc_type", ["message", "doc", "file", "wiki", "rwa", "transaction"])
def test_spec_doc_types_accepted(doc_type):
    assert doc(doc_type=doc_type).doc_type == doc_type


def test_new_lowercase_doc_type_accepted_because_the_list_is_extensible():
    assert doc(doc_type="meeting_notes").doc_type == "meeting_notes"


@pytest.mark.parametrize(
    "doc_type", ["", "Doc", "DOC", "doc type", "1doc", "_doc", "doc-type", "x" * 33, 'doc"']
)
def test_bad_doc_type_rejected(doc_type):
    with pytest.raises(ValidationError) as info:
        doc(doc_type=doc_type)
    assert "doc_type" in error_fields(info.value)


def test_tags_are_deduplicated_in_order():
    assert doc(tags=["b", "a", "b", " a "]).tags == ["b", "a"]


def test_more_than_64_tags_rejected():
    with pytest.raises(ValidationError) as info:
        doc(tags=[f"t{i}" for i in range(65)])
    assert "tags" in error_fields(info.value)


def test_metadata_fingerprint_ignores_text_and_follows_metadata():
    base = doc(tags=["a"])
    assert base.metadata_fingerprint() == doc(tags=["a"], text="other").metadata_fingerprint()
    assert base.metadata_fingerprint() != doc(tags=["b"]).metadata_fingerprint()
    assert base.metadata_fingerprint() != doc(tags=["a"], title="T").metadata_fingerprint()
    assert (
        base.metadata_fingerprint() != doc(tags=["a"], mode="confidential").metadata_fingerprint()
    )


def test_make_chunk_id_is_deterministic_hex_of_40_chars():
    first = make_chunk_id("dao_x", "doc", "doc_1", 0)
    assert first == make_chunk_id("dao_x", "doc", "doc_1", 0)
    assert len(first) == 40
    assert int(first, 16) >= 0


@pytest.mark.parametrize(
    "other",
    [
        ("dao_y", "doc", "doc_1", 0),
        ("dao_x", "wiki", "doc_1", 0),
        ("dao_x", "doc", "doc_2", 0),
        ("dao_x", "doc", "doc_1", 1),
    ],
)
def test_make_chunk_id_differs_when_any_field_differs(other):
    assert make_chunk_id("dao_x", "doc", "doc_1", 0) != make_chunk_id(*other)


def test_make_chunk_id_cannot_be_confused_by_separators_inside_fields():
    assert make_chunk_id("a|b", "doc", "c", 0) != make_chunk_id("a", "doc", "b|c", 0)
    assert make_chunk_id('a","b', "doc", "c", 0) != make_chunk_id("a", "doc", 'b","c', 0)


def test_content_hash_separates_its_parts():
    assert content_hash("ab", "c") != content_hash("a", "bc")
    assert content_hash("ab", "c") == content_hash("ab", "c")


# --- document ACLs ---------------------------------------------------------------------------


def test_acl_lists_become_sorted_unique_tokens():
    d = doc(
        acl={"allowed_groups": ["hr", "hr", "fin"], "allowed_users": ["al"], "denied_groups": ["x"]}
    )
    assert d.acl.allowed_groups == ["fin", "hr"]
    assert d.acl_allow == ("group:fin", "group:hr", "user:al")
    assert d.acl_deny == ("group:x",)
    assert doc().acl_allow == ("*",) and doc().acl_deny == ()
    # Only a deny list: everyone else still reads it.
    assert doc(acl={"denied_groups": ["temps"]}).acl_allow == ("*",)


@pytest.mark.parametrize(
    "acl",
    [
        {"allowed_group": ["hr"]},
        {"allowed_groups": "hr"},
        {"allowed_groups": [""]},
        {"allowed_users": ["a\x00b"]},
        {"denied_groups": [f"g{i}" for i in range(65)]},
        ["hr"],
    ],
)
def test_a_bad_acl_names_its_field(acl):
    with pytest.raises(ValidationError) as exc:
        doc(acl=acl)
    assert any(f.startswith("acl") for f in error_fields(exc.value))


def test_an_empty_acl_hashes_like_none_and_a_list_changes_the_fingerprint():
    """Documents stored before ACLs stay ``unchanged`` when re-sent; adding a list re-writes."""
    assert doc().metadata_fingerprint() == doc(acl={}).metadata_fingerprint()
    assert doc().metadata_fingerprint() != doc(acl={"allowed_users": ["al"]}).metadata_fingerprint()
