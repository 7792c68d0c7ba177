"""The GPU check's dry run: the same script on the CPU with tiny shapes, so that it cannot rot."""

from __future__ import annotations

import json
import sys

from conftest import REPO_ROOT


def test_gpu_check_dry_run_runs_every_entry_point(tmp_path):
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    import gpu_check
    import scale

    code = gpu_check.main(["--dry-run", "--out", str(tmp_path)])
    record = json.loads((tmp_path / "gpu_check.json").read_text())
    assert code == 0, record["failed"]
    assert record["dry_run"] and record["cuda_tests"] == {"skipped": "dry run"} and record["failed"] == []
    assert [r["step"] for r in record["steps"]] == list(scale.STEPS)
    for step in record["steps"]:
        assert step["shape"] == "tiny" and step["seconds"] > 0 and "error" not in step, step
    planned = {r["step"]: r["plan_bytes"] for r in record["steps"]}
    assert planned["npo_full"] > planned["npo_lora"] > 0  # the full fine-tune holds a reference copy and AdamW states
    assert planned["nf4"] is None
