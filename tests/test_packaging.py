"""A non-editable wheel carries the `evaluate` metric modules and the model-card templates, and
`hf_unlearn.metric_path` finds them from the installed layout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from hf_unlearn import METRIC_NAMES

REPO_ROOT = Path(__file__).resolve().parents[1]
SOURCES = (
    "setup.py",
    "setup.cfg",
    "pyproject.toml",
    "README.md",
    "MANIFEST.in",
    "LICENSE",
    "hf_unlearn",
    "evaluate_metrics",
    "hub_cards",
)


def test_wheel_ships_metric_modules_and_cards(tmp_path):
    # Build from a copy so the shared checkout gets no build/ or *.egg-info folders.
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        path = REPO_ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif path.is_file():
            shutil.copy2(path, src / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            ".",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
        ],
        cwd=src,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = (tmp_path / "dist").glob("hf_unlearn-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for metric in METRIC_NAMES:
        assert f"hf_unlearn/evaluate_metrics/{metric}/{metric}.py" in names
        assert f"hf_unlearn/evaluate_metrics/{metric}/README.md" in names
    assert "hf_unlearn/hub_cards/__init__.py" in names
    assert any(n.startswith("hf_unlearn/hub_cards/") and n.endswith(".md") for n in names)
    assert "hf_unlearn/evaluation/tofu.py" in names
    assert not any(n.startswith("tests/") for n in names)

    # Installed layout (the unpacked wheel first on the path): the metric loads from inside it.
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        "import hf_unlearn, evaluate, sys\n"
        "p = hf_unlearn.metric_path('tofu_forget_quality')\n"
        "assert p.startswith(sys.argv[1]) and hf_unlearn.__file__.startswith(sys.argv[1]), (p, hf_unlearn.__file__)\n"
        "assert hf_unlearn.hub_cards_dir().startswith(sys.argv[1])\n"
        "out = evaluate.load(p, keep_in_memory=True).compute(predictions=[0.5, 0.7], references=[0.5, 0.7])\n"
        "assert out == {'forget_quality': 1.0, 'ks_statistic': 0.0}, out\n"
    )
    env = dict(os.environ, PYTHONPATH=str(site), HF_HUB_OFFLINE="1", HF_EVALUATE_OFFLINE="1")
    result = subprocess.run(
        [sys.executable, "-c", code, str(site)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
