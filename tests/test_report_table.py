"""The printed table of ``simulate``/``collect`` (``report.print_table``):
statuses next to the rows they concern, and a footer that explains them."""
from __future__ import annotations

import io

from kvldp.plots.tables import print_table


def _record(key, f, lo, hi, m=0.5, m_lo=0.2, m_hi=0.8, status="ok"):
    return {"key": key, "frequency": f, "frequency_lo": lo, "frequency_hi": hi, "mean": m, "mean_lo": m_lo,
            "mean_hi": m_hi, "frequency_status": "ok", "mean_status": status, "postprocess": "eb+shrink",
            "true_frequency": None, "true_mean": None}


def test_an_estimate_outside_its_own_interval_is_marked_pulled_and_explained():
    out = io.StringIO()
    print_table([_record("a", 0.0004, 0.016, 0.047), _record("b", 0.02, 0.01, 0.03),
                 _record("c", 0.01, 0.0, 0.02, m=0.9, m_lo=-0.5, m_hi=0.4)], out=out)
    lines = out.getvalue().splitlines()
    row = {line.split()[0]: line for line in lines if line.split() and line.split()[0] in "abc"}
    assert row["a"].endswith("(pulled)") and row["c"].endswith("(pulled)")
    assert "pulled" not in row["b"]
    assert any(line.startswith("pulled: the estimate lies outside the key's own interval") for line in lines)


def test_no_footer_for_a_status_no_row_has():
    out = io.StringIO()
    print_table([_record("a", 0.02, 0.01, 0.03)], out=out)
    assert "pulled" not in out.getvalue() and "uninformative:" not in out.getvalue()


def test_the_frequencies_sum_is_shown_against_the_measured_total():
    """A sum more than 2 s.e. above the reports' total (``frequency_total``)
    is said, with what it means; one within is only shown."""
    def run(frequencies, total, se):
        out = io.StringIO()
        print_table([{**_record(k, f, 0.0, 1.0), "frequency_total": total, "frequency_total_se": se}
                     for k, f in zip("abc", frequencies, strict=True)], out=out)
        return out.getvalue()

    text = run([0.5, 0.3, 0.2], 1.0, 0.1)
    assert "frequencies sum to 1 pairs per user; the reports measure 1 ± 0.1" in text and "above it" not in text
    text = run([0.5, 0.5, 0.5], 1.0, 0.1)
    assert "frequencies sum to 1.5 pairs per user" in text and "above it by more than 2 s.e." in text
    assert "sum to" not in run([0.5, 0.3, 0.2], None, None)       # an older file: no total recorded
