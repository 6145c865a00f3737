"""A query's vector as the list of floats the stores take: the same floats however the
embedder hands it over."""

from __future__ import annotations

import numpy as np
import pytest

from serve_app.search.query_vectors import _as_list


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_an_array_becomes_the_floats_of_its_elements(dtype):
    vector = np.random.default_rng(7).standard_normal(384).astype(dtype)
    got = _as_list(vector)
    assert got == [float(x) for x in vector]
    assert all(type(x) is float for x in got)


def test_lists_and_nothing_pass_through_as_floats():
    assert _as_list([1, 2.5, np.float32(0.25)]) == [1.0, 2.5, 0.25]
    assert all(type(x) is float for x in _as_list([1, np.float32(0.25)]))
    assert _as_list(None) is None
