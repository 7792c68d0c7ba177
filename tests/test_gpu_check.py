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


def test_gpu_check_installs_the_wheels_when_transformers_is_below_the_pin(monkeypatch, tmp_path):
    """The GPU machine's transformers is below the pin: every carried wheel is installed, without deps or an index."""
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    import importlib.metadata

    import gpu_check

    wheels = tmp_path / ".whl"
    wheels.mkdir()
    (wheels / "trl-1.16.0-py3-none-any.whl").write_bytes(b"")
    calls = []
    monkeypatch.setattr(gpu_check, "WHEELS", wheels)
    monkeypatch.setattr(gpu_check.subprocess, "run", lambda command, check: calls.append(command))
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "5.17.0")
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert gpu_check.ensure_packages() == ["trl-1.16.0-py3-none-any.whl"]
    assert "--no-deps" in calls[0] and "--no-index" in calls[0] and calls[0][-1].endswith("trl-1.16.0-py3-none-any.whl")
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "5.25.0")
    calls.clear()
    assert gpu_check.ensure_packages() == [] and calls == []  # the pinned version is there and nothing is missing
