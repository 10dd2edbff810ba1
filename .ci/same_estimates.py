"""Two estimates files (JSON Lines) of the same job on two Beam releases agree.

``python .ci/same_estimates.py A.jsonl B.jsonl``: the same keys, fields and
texts; the raw estimator (``frequency_raw``, ``mean_raw``) and the counts
(``n_reports``) bit for bit, as they come from the same reports; every
other number within 1e-12 relative: the post-processing runs in NumPy, and
the Beam floor caps NumPy at 2.2 where the newest Beam takes 2.4, whose
reductions differ in the last bit (measured: 3 of 100 means, 1.1e-16).
Exits 1 with the first difference.
"""
import json
import math
import sys

EXACT = ("frequency_raw", "mean_raw", "n_reports")


def records(path):
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def differs(field, a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and field not in EXACT:
        return not (math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-300) or (math.isnan(a) and math.isnan(b)))
    return a != b


def main(a_path, b_path) -> int:
    a, b = records(a_path), records(b_path)
    if len(a) != len(b) or not a:
        print(f"{a_path}: {len(a)} records, {b_path}: {len(b)}")
        return 1
    close = 0
    for ra, rb in zip(a, b, strict=True):
        if ra.keys() != rb.keys():
            print(f"key {ra.get('key')}: fields {sorted(ra.keys() ^ rb.keys())} differ")
            return 1
        for field in ra:
            if differs(field, ra[field], rb[field]):
                print(f"key {ra['key']}: {field} {ra[field]!r} != {rb[field]!r}")
                return 1
            close += ra[field] != rb[field]
    print(f"same estimates: {len(a)} keys; raw estimates identical; {close} post-processed values within 1e-12")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
