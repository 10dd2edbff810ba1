"""Bit-identical reports, counts and estimates for fixed seeds, against
fingerprints committed before the issue-9 redesign (``golden_runs.py``)."""
import json

import pytest

from golden_api import API
from golden_runs import GOLDEN, fingerprints


@pytest.fixture(scope="module")
def current():
    return fingerprints(API)


EXPECTED = json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_same_bits_as_the_golden_file(current, name):
    assert current[name] == EXPECTED[name]


def test_every_registered_mechanism_has_a_golden_entry():
    assert sorted(API.names()) == sorted(EXPECTED)
