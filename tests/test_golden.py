"""The same results from the same seeds: each method family's tiny run against
tests/helpers/golden.json (tests/helpers/golden.py says how it was made and when to regenerate it)."""
from __future__ import annotations

import json

import pytest

from tests.helpers.golden import FAMILIES, GOLDEN, run


@pytest.mark.parametrize("family", FAMILIES)
def test_a_tiny_run_gives_its_pinned_losses_and_evaluation_rows(tmp_path, family):
    pinned = json.loads(GOLDEN.read_text())[family]
    now = run(family, tmp_path / family)
    assert len(now["losses"]) == len(pinned["losses"]) == 10
    for step, (a, b) in enumerate(zip(now["losses"], pinned["losses"]), 1):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-7), f"step {step}"
    assert [r.keys() for r in now["eval"]] == [r.keys() for r in pinned["eval"]]
    for a, b in zip(now["eval"], pinned["eval"]):
        for key in a:
            try:
                assert float(a[key]) == pytest.approx(float(b[key]), rel=1e-5, abs=1e-7, nan_ok=True), key
            except ValueError:
                assert a[key] == b[key], key
