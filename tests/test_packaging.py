"""Packaging: the wheel built from setup.cfg + pyproject.toml carries the `evaluate` metric modules, the model-card
templates and the benchmark configs, and an installed (non-editable) copy finds and uses them."""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from hf_unlearn import METRIC_NAMES

REPO_ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("setup.cfg", "pyproject.toml", "README.md", "LICENSE", "hf_unlearn", "evaluate_metrics", "hub_cards",
           "benchmarks/configs")


def _setup_cfg() -> configparser.ConfigParser:
    config = configparser.ConfigParser()
    config.read(REPO_ROOT / "setup.cfg")
    return config


def _lines(value: str) -> list[str]:
    return [line.strip() for line in value.splitlines() if line.strip() and not line.strip().startswith("#")]


def _mapping(value: str) -> dict[str, str]:
    return {k.strip(): v.strip() for k, v in (line.split("=", 1) for line in _lines(value))}


def test_declarative_packaging_lists_every_package_and_one_version():
    assert not (REPO_ROOT / "setup.py").exists()
    assert "Apache License" in (REPO_ROOT / "LICENSE").read_text() and "Version 2.0" in (REPO_ROOT / "LICENSE").read_text()
    config = _setup_cfg()
    metadata, options = config["metadata"], config["options"]
    assert metadata["license"] == "Apache-2.0" and metadata["version"] == "attr: hf_unlearn.__version__"
    mapped = _mapping(options["package_dir"])
    source_packages = {
        ".".join(p.parent.relative_to(REPO_ROOT).parts) for p in (REPO_ROOT / "hf_unlearn").rglob("__init__.py")
        if "__pycache__" not in p.parts
    }
    assert set(_lines(options["packages"])) == source_packages | set(mapped), "setup.cfg's package list is out of date"
    for package, folder in mapped.items():
        assert (REPO_ROOT / folder / "__init__.py").is_file(), package
    deps = _lines(options["install_requires"])
    assert "transformers>=5.19,<6" in deps and any(d.startswith("trl>=") and "<" in d for d in deps)
    extras = {name: _lines(value) for name, value in config["options.extras_require"].items()}
    assert {"quantization", "bench", "dev"} <= set(extras)
    for extra in ("quantization", "bench"):  # dev installs what the tests import
        for requirement in extras[extra]:
            assert requirement in extras["dev"], requirement


@pytest.mark.slow
def test_installed_wheel_ships_metric_modules_cards_and_configs(tmp_path):
    # Build from a copy so the shared checkout gets no build/ or *.egg-info folders.
    src = tmp_path / "src"
    for name in SOURCES:
        path = REPO_ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, src / name)
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", ".", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "dist")],
                   cwd=src, check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("hf_unlearn-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for metric in METRIC_NAMES:
        assert f"hf_unlearn/evaluate_metrics/{metric}/{metric}.py" in names
        assert f"hf_unlearn/evaluate_metrics/{metric}/README.md" in names
    assert {"hf_unlearn/hub_cards/unlearned_model.md", "hf_unlearn/bench/configs/tofu_tiny.toml"} <= names
    assert any(n.endswith("licenses/LICENSE") for n in names)
    assert not any(n.startswith(("tests/", "benchmarks/")) for n in names)

    # A real, non-editable install into its own folder, first on the path (dependencies from this venv).
    site = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--no-index", "-q", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    code = (
        "import sys, evaluate, hf_unlearn\n"
        "site = sys.argv[1]\n"
        "assert hf_unlearn.__file__.startswith(site), hf_unlearn.__file__\n"
        "p = hf_unlearn.metric_path('tofu_forget_quality')\n"
        "assert p.startswith(site), p\n"
        "out = evaluate.load(p, keep_in_memory=True).compute(predictions=[0.5, 0.7], references=[0.5, 0.7])\n"
        "assert out == {'forget_quality': 1.0, 'ks_statistic': 0.0}, out\n"
        "from hf_unlearn.hub import build_model_card\n"
        "assert hf_unlearn.hub_cards_dir().startswith(site)\n"
        "card = build_model_card('grom_adapter', 'org/base', forget_split='forget05', repo_id='me/edit')\n"
        "assert 'PeftModel.from_pretrained(base, \"me/edit\")' in card.text and 'forget05' in card.text\n"
        "from hf_unlearn.bench.registry import configs_dir, load_subject_presets\n"
        "assert str(configs_dir()).startswith(site), configs_dir()\n"
        "assert len(load_subject_presets('tofu_tiny')['grom']['grid']) == 3\n"
    )
    env = dict(os.environ, PYTHONPATH=str(site), HF_HUB_OFFLINE="1", HF_EVALUATE_OFFLINE="1")
    result = subprocess.run([sys.executable, "-c", code, str(site)], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]

    script = site / "bin" / "hf-unlearn"
    assert script.is_file()
    result = subprocess.run([sys.executable, str(script), "--help"], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    for command in ("demo", "unlearn", "eval", "bench"):
        assert command in result.stdout
