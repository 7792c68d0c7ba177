"""Packaging: the wheel built from setup.cfg + pyproject.toml carries the `evaluate` metric modules, the model-card
templates and the demo settings, and no module of the benchmark lab (`benchmarks/unlearn_bench`, its own package);
an installed (non-editable) copy finds and uses its data; everything the test modules import is declared (the
package's requirements, its `dev` extra, or the lab), and every test module imports against the installed wheel."""

from __future__ import annotations

import ast
import configparser
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from hf_unlearn import METRIC_NAMES

REPO_ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("setup.cfg", "pyproject.toml", "README.md", "LICENSE", "hf_unlearn", "evaluate_metrics", "hub_cards",
           "benchmarks")


def _setup_cfg() -> configparser.ConfigParser:
    config = configparser.ConfigParser()
    config.read(REPO_ROOT / "setup.cfg")
    return config


def _lines(value: str) -> list[str]:
    return [line.strip() for line in value.splitlines() if line.strip() and not line.strip().startswith("#")]


def _mapping(value: str) -> dict[str, str]:
    return {k.strip(): v.strip() for k, v in (line.split("=", 1) for line in _lines(value))}


def _canonical(name: str) -> str:
    """A distribution name normalised as PEP 503 does (``PyYAML`` -> ``pyyaml``, ``rouge_score`` -> ``rouge-score``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert match, requirement
    return _canonical(match.group(1))


def _test_modules() -> list[Path]:
    return sorted((REPO_ROOT / "tests").glob("*.py"))


def _imported_top_level_modules(path: Path) -> set[str]:
    """Top-level names of every absolute ``import`` / ``from ... import`` in ``path`` (module level or inside
    functions)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_every_third_party_module_the_tests_import_is_declared():
    """A module a test file (or conftest / the local Hub server) imports must come from a distribution that
    setup.cfg names itself, in ``install_requires`` or the ``dev`` extra: one that arrives only as a dependency of
    a dependency can disappear with that dependency's next release."""
    config = _setup_cfg()
    declared = {_requirement_name(r) for r in _lines(config["options"]["install_requires"])}
    declared |= {_requirement_name(r) for r in _lines(config["options.extras_require"]["dev"])}
    # the lab: its package and the scripts beside it (pytest's pythonpath holds benchmarks/)
    lab = {"unlearn_bench"} | {p.stem for p in (REPO_ROOT / "benchmarks").glob("*.py")}
    local = {p.stem for p in _test_modules()} | {"hf_unlearn"} | lab
    providers = importlib.metadata.packages_distributions()
    imported: dict[str, set[str]] = {}
    for path in _test_modules():
        for name in _imported_top_level_modules(path) - local - set(sys.stdlib_module_names):
            imported.setdefault(name, set()).add(path.name)
    assert {"torch", "transformers", "pytest", "yaml"} <= set(imported)  # the scan really sees the imports
    undeclared = {
        name: (sorted(files), providers.get(name))
        for name, files in imported.items()
        if not {_canonical(d) for d in providers.get(name, [])} & declared
        and _canonical(name) not in declared  # a requirement under a marker (tomli) is not installed everywhere
    }
    assert not undeclared, f"imported by the tests but not declared in setup.cfg (module: files, providers): {undeclared}"
    unconditional = [r for r in _lines(config["options"]["install_requires"]) if ";" not in r]
    for requirement in unconditional + _lines(config["options.extras_require"]["dev"]):  # and installed here
        importlib.metadata.version(_requirement_name(requirement))


def test_declarative_packaging_lists_every_package_and_one_version():
    assert not (REPO_ROOT / "setup.py").exists()
    assert "Apache License" in (REPO_ROOT / "LICENSE").read_text() and "Version 2.0" in (REPO_ROOT / "LICENSE").read_text()
    config = _setup_cfg()
    metadata, options = config["metadata"], config["options"]
    assert metadata["license"] == "Apache-2.0" and metadata["version"] == "attr: hf_unlearn.assets.__version__"
    mapped = _mapping(options["package_dir"])
    source_packages = {
        ".".join(p.parent.relative_to(REPO_ROOT).parts) for p in (REPO_ROOT / "hf_unlearn").rglob("__init__.py")
        if "__pycache__" not in p.parts
    }
    packages = set(_lines(options["packages"]))
    assert packages == source_packages | set(mapped), "setup.cfg's package list is out of date"
    assert all(p == "hf_unlearn" or p.startswith("hf_unlearn.") for p in packages)
    assert "hf_unlearn.bench" not in packages and not (REPO_ROOT / "hf_unlearn" / "bench").exists()
    for package, folder in mapped.items():  # data folders at the root, never the lab
        assert (REPO_ROOT / folder / "__init__.py").is_file(), package
        assert not Path(folder).parts[0] == "benchmarks", (package, folder)
    deps = _lines(options["install_requires"])
    assert "transformers>=5.19,<6" in deps and any(d.startswith("trl>=") and "<" in d for d in deps)
    extras = {name: _lines(value) for name, value in config["options.extras_require"].items()}
    assert {"quantization", "dev"} <= set(extras) and "bench" not in extras
    for requirement in extras["quantization"]:  # dev installs what the tests import
        assert requirement in extras["dev"], requirement


def test_the_lab_is_its_own_package_and_the_tests_install_its_requirements():
    """``benchmarks/pyproject.toml`` builds ``unlearn_bench`` alone (with the ``unlearn-bench`` command); each of
    its requirements besides hf-unlearn is in the ``dev`` extra, so the lab's tests run in a ``.[dev]`` install."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib

    lab = tomllib.loads((REPO_ROOT / "benchmarks" / "pyproject.toml").read_text())
    packages = lab["tool"]["setuptools"]["packages"]
    source_packages = {".".join(p.parent.relative_to(REPO_ROOT / "benchmarks").parts)
                       for p in (REPO_ROOT / "benchmarks" / "unlearn_bench").rglob("__init__.py")
                       if "__pycache__" not in p.parts}
    assert set(packages) == source_packages and all(p.startswith("unlearn_bench") for p in packages)
    assert lab["project"]["scripts"] == {"unlearn-bench": "unlearn_bench.cli:main"}
    dev = {_requirement_name(r) for r in _lines(_setup_cfg()["options.extras_require"]["dev"])}
    needs = {_requirement_name(r) for r in lab["project"]["dependencies"]} - {"hf-unlearn"}
    assert needs and needs <= dev, needs - dev


IMPORT_TEST_MODULES = """
import importlib, importlib.util, pathlib, sys
site, tests, lab = sys.argv[1], sys.argv[2], sys.argv[3]
# Only the wheel may provide hf_unlearn: drop the editable install's finders (the checkout's copy).
editable = lambda f: getattr(f, "__module__", "").startswith("__editable__")
sys.meta_path[:] = [f for f in sys.meta_path if not editable(f)]
sys.path_hooks[:] = [h for h in sys.path_hooks if not editable(h)]
sys.path_importer_cache.clear()
assert importlib.util.find_spec("hf_unlearn").origin.startswith(site)
sys.path[:0] = [tests, lab]  # the lab's tests import it from the checkout, on top of the installed library
for path in sorted(pathlib.Path(tests).glob("*.py")):
    importlib.import_module(path.stem)
ours = {n: getattr(m, "__file__", None) for n, m in sys.modules.items() if n.split(".")[0] == "hf_unlearn"}
outside = {n: f for n, f in ours.items() if f is not None and not f.startswith(site)}
assert len(ours) > 10 and not outside, outside
"""


@pytest.mark.slow
def test_installed_wheel_ships_metric_modules_cards_and_configs(tmp_path):
    """Build the wheel, install it (no dependencies, no index) into its own folder, and use that copy: package
    data, the console script, the declared ``dev`` extra, and an import of every test module against it.

    The dependencies come from the running environment (CI builds it fresh from ``.[dev]``; the test above
    checks that the tests import nothing undeclared): an empty virtual environment would have to install torch
    and the Hugging Face stack again, minutes on every run."""
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
    assert {"hf_unlearn/hub_cards/unlearned_model.md", "hf_unlearn/demo/settings.toml",
            "hf_unlearn/data/idk_answers.txt"} <= names
    assert any(n.endswith("licenses/LICENSE") for n in names)
    assert not any(n.startswith(("tests/", "benchmarks/", "unlearn_bench/", "hf_unlearn/bench/")) for n in names)

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
        "from hf_unlearn.demo import demo_settings\n"
        "assert demo_settings('grom')['target_modules'] == 'lm_head'\n"
        "import importlib.util\n"
        "lab = importlib.util.find_spec('unlearn_bench')\n"
        "assert lab is None or not str(lab.origin).startswith(site), lab.origin\n"
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
    for command in ("demo", "unlearn", "eval"):
        assert command in result.stdout
    assert "bench" not in result.stdout

    # `pip install "hf-unlearn[dev]"` from this wheel installs what the tests need
    (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    requires = [line.split(":", 1)[1] for line in zipfile.ZipFile(wheel).read(metadata).decode().splitlines()
                if line.startswith("Requires-Dist:")]
    dev = {_requirement_name(r) for r in requires if re.search(r"extra\s*==\s*['\"]dev['\"]", r)}
    assert {_requirement_name(r) for r in _lines(_setup_cfg()["options.extras_require"]["dev"])} == dev
    assert "pyyaml" in dev

    # every test module imports against the installed copy alone (no bytecode written into the checkout)
    result = subprocess.run([sys.executable, "-c", IMPORT_TEST_MODULES, str(site), str(REPO_ROOT / "tests"),
                             str(REPO_ROOT / "benchmarks")],
                            cwd=tmp_path, env=dict(env, PYTHONDONTWRITEBYTECODE="1"), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
