"""The GROM path validation script's bookkeeping: it refuses a refitted path that is not the bench's, and reports
the chosen point against the best one by forget quality within the retain tolerance."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "grom_path_validation.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("grom_path_validation", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _record(changes, gaps, index):
    return {"index": index, "candidates": [{"scale": 1.0, "retain_weight": w, "ridge": 0.01, "edit_norm": float(w)}
                                           for w in range(1, len(gaps) + 1)],
            "measurements": [{"retain_change": c, "shift_gap": g} for c, g in zip(changes, gaps)]}


def test_the_chosen_point_is_compared_with_the_best_within_the_tolerance(script):
    record = _record(changes=[0.0, 0.05, 0.08, 0.3], gaps=[-2.0, -0.5, 0.4, 3.0], index=2)
    fq = [{"forget_quality": q} for q in (1e-6, 0.2, 0.02, 0.9)]  # the strongest point is outside the tolerance
    out = script.summarize(record, fq, 0.1)
    assert out["best_within_tolerance"] == 1 and out["chosen"] == 2
    assert out["log10_regret"] == pytest.approx(math.log10(0.2 / 0.02))
    assert script.summarize(_record([0.0, 0.05, 0.08, 0.3], [-2.0, -0.5, 0.4, 3.0], 1), fq, 0.1)[
        "log10_regret"] == 0.0
    assert script.summarize(record, fq, 0.1)["spearman_closeness_vs_fq"] == pytest.approx(-0.4)  # ranks (2,3,4,1) vs (1,3,2,4)


def test_a_path_other_than_the_benchs_is_refused_before_scoring(script):
    record = _record(changes=[0.0, 0.0], gaps=[0.0, 0.0], index=0)
    points = [{"scale": 1.0, "retain_weight": w, "ridge": 0.01} for w in (1.0, 2.0)]
    script.check_path(points, [1.0, 2.0], record)
    with pytest.raises(ValueError, match="Point 1 differs"):
        script.check_path(points, [1.0, 2.5], record)
    with pytest.raises(ValueError, match="has 1 points"):
        script.check_path(points[:1], [1.0], record)
