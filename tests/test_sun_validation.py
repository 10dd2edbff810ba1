"""F2M, KVUE and KVOH: parameter validation, foreign reports and the
registry (SPEC.md §2).
"""

import pytest

from kvldp.mechanisms.base import ReportBatch
from kvldp.mechanisms.kv.sun import F2M, KVOH, KVUE
from kvldp.mechanisms.registry import make


# =====================================================================
# 1. Validation and plumbing
# =====================================================================
@pytest.mark.parametrize("make_bad", [
    lambda: F2M(3, 1.0, default_value=1.5), lambda: F2M(3, 1.0, default_value=-1.01),
    lambda: KVUE(3, 0.0), lambda: KVOH(3, -1.0), lambda: F2M(3, float("nan")),
    lambda: KVUE(0, 1.0), lambda: KVOH(3, 31.0),
])
def test_constructors_reject_bad_parameters(make_bad):
    with pytest.raises(ValueError):
        make_bad()


@pytest.mark.parametrize("cls, bad_symbol", [(KVUE, 2), (KVUE, -2), (KVOH, 8), (KVOH, -1), (F2M, 0), (F2M, 3)])
def test_accumulate_rejects_foreign_reports(cls, bad_symbol):
    mech = cls(3, 1.0)
    good = mech.symbols[0]
    with pytest.raises(ValueError):
        mech.accumulate(mech.new_counts(), ReportBatch([0, 1, 2], [0, 1], [good, bad_symbol]))
    for bad_key in (3, -1):
        with pytest.raises(ValueError):
            mech.accumulate(mech.new_counts(), ReportBatch([0, 1, 2], [0, bad_key], [good, good]))
    c = mech.accumulate(mech.new_counts(), ReportBatch([0, 1, 2, 3], [0, 2, 2], [good, good, mech.symbols[-1]]))
    assert c[0] == 3
    stack = mech.stack(c)
    assert stack[0, 0] == 1 and stack[0, 2] == 1 and stack[-1, 2] == 1 and stack.sum() == 3


@pytest.mark.parametrize("name, cls", [("kvue", KVUE), ("kvoh", KVOH), ("f2m", F2M)])
def test_registry(name, cls):
    mech = make(name, 5, 1.5)
    assert type(mech) is cls and mech.d == 5 and mech.epsilon == 1.5
    assert make("f2m", 5, 1.5, default_value=-0.5).default_value == -0.5 if cls is F2M else True
