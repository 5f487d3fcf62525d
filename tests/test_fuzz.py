"""A short run of the mutation fuzzer (``make fuzz`` runs 100,000 cases)."""

from __future__ import annotations

from pathlib import Path

from tests.fuzz import _STRUCTURES as STRUCTURES, STRUCTURE_EVERY, fuzz


def test_short_fuzz_run_finds_no_crash_and_misses_no_damage(tmp_path: Path) -> None:
    counts = fuzz(700, seed=7, work=tmp_path)  # raises, naming the case, on any failure
    assert counts.failures() == 0
    assert counts.cases == 700 and set(counts.by_kind) == {"flip", "flips", "truncate", "extend", "garbage",
                                                           "zero", "hostile", *STRUCTURES}
    # The hostile structures (deep chains, long names, long targets, aliasing records)
    # ran within their time and memory budgets (fuzz raises otherwise).
    assert counts.structures == 700 // STRUCTURE_EVERY
    # Every kind of outcome was reached, so the run exercised the checks, not just open.
    assert counts.refused_at_open and counts.detected_at_use and counts.benign
