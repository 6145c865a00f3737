"""The gateway's own Cypher with its parameters in one map (deployments/graph_store/params.py)."""

from __future__ import annotations

import re

import pytest

from deployments.graph_store.cypher import ACL_HIDDEN, ENTITIES, RELATED_DOCS
from deployments.graph_store.intents import INTENTS
from deployments.graph_store.params import bound, bundled, flat_plan

OWN_TEXT = {
    **{name: i.cypher for name, i in INTENTS.items()},
    "ACL_HIDDEN": ACL_HIDDEN,
    "ENTITIES": ENTITIES,
    "RELATED_DOCS": RELATED_DOCS,
}


def test_each_parameter_is_read_from_the_map():
    assert bundled("MATCH (n) WHERE n.team_id = $team_id AND n.x IN $xs RETURN n LIMIT $limit") == (
        "MATCH (n) WHERE n.team_id = $p.team_id AND n.x IN $p.xs RETURN n LIMIT $p.limit"
    )
    assert bound({"team_id": "t"}) == {"p": {"team_id": "t"}}


def test_strings_quoted_names_and_comments_are_left_alone():
    query = (
        'MATCH (n {x: \'$a\', y: "it\\"s $b"}) // $c\n'
        "WHERE n.`$d` = $e /* $f */ AND n.`a``$g` = $h RETURN 'don\\'t $i', $j"
    )
    assert bundled(query) == (
        'MATCH (n {x: \'$a\', y: "it\\"s $b"}) // $c\n'
        "WHERE n.`$d` = $p.e /* $f */ AND n.`a``$g` = $p.h RETURN 'don\\'t $i', $p.j"
    )


@pytest.mark.parametrize("query", ["RETURN $0", "RETURN $`odd name`", "RETURN $ x"])
def test_a_parameter_that_is_not_a_plain_name_is_refused(query):
    with pytest.raises(ValueError, match="plain parameter name"):
        bundled(query)


@pytest.mark.parametrize("name", sorted(OWN_TEXT))
def test_the_gateways_own_text_keeps_no_parameter_outside_the_map(name):
    text = bundled(OWN_TEXT[name])
    assert "$p." in text
    assert not re.search(r"\$(?!p\.)", text), name
    # and the plan of the bundled text reads back as the flat one the guard checks
    assert flat_plan({"args": {"Details": text}, "children": [{"args": {"x": [text]}}]}) == {
        "args": {"Details": OWN_TEXT[name]},
        "children": [{"args": {"x": [OWN_TEXT[name]]}}],
    }
