"""The import graph: the library never imports the benchmark lab (``unlearn_bench``, under ``benchmarks/``), the lab
imports only public names of the library, the deletion-request example does not import the command line, and the
lazy top level imports neither torch nor transformers' model code until a name is used."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "hf_unlearn"


def imported_modules(source: str, module: str, is_package: bool) -> set[str]:
    """Absolute names of every module ``source`` imports, at any depth (function-local and ``TYPE_CHECKING``
    imports too), with relative imports resolved against ``module`` (a package when ``is_package``).
    ``from X import y`` yields ``X`` and ``X.y`` (``y`` may be a submodule)."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = import_from_target(node, package)
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def import_from_target(node: ast.ImportFrom, package: str) -> str:
    """The absolute module a ``from X import ...`` statement imports from, a relative ``X`` resolved against
    ``package`` (the importing module's package)."""
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    base = ".".join(parts[: len(parts) - (node.level - 1)])
    return f"{base}.{node.module}" if node.module else base


def core_modules() -> dict[str, Path]:
    """``{module name: file}`` of every module of the library."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if "__pycache__" in parts:
            continue
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _is_lab(name: str) -> bool:
    """Whether ``name`` is a module of the benchmark lab (``unlearn_bench``, or a ``hf_unlearn.bench`` brought back)."""
    return any(name == root or name.startswith(root + ".") for root in ("unlearn_bench", "hf_unlearn.bench"))


def test_scanner_finds_relative_local_and_aliased_imports():
    source = textwrap.dedent("""
        import os
        from . import bench
        from ..bench.registry import METHODS
        from .methods.grom import fit_grom

        def later():
            import unlearn_bench.runner as runner
            from .bench import report
    """)
    found = imported_modules(source, "hf_unlearn.hub", is_package=False)
    assert {"os", "hf_unlearn.bench", "hf_unlearn.methods.grom", "unlearn_bench.runner",
            "hf_unlearn.bench.report"} <= found
    assert "bench.registry" in {n.split("hf_unlearn.", 1)[-1] for n in imported_modules(
        "from ...bench.registry import METHODS", "hf_unlearn.methods.t3.fit", is_package=False)}
    assert imported_modules("from .. import bench", "hf_unlearn.methods", is_package=True) >= {"hf_unlearn.bench"}
    assert {m for m in found if _is_lab(m)} == {"hf_unlearn.bench", "hf_unlearn.bench.report", "unlearn_bench.runner"}


def test_the_library_holds_no_lab_and_never_imports_it():
    """``hf_unlearn`` has no ``bench`` package, and no module of it imports the lab (``unlearn_bench``), at any
    depth (module level, function-local, ``TYPE_CHECKING``)."""
    assert not (PACKAGE / "bench").exists()
    modules = core_modules()
    assert {"hf_unlearn", "hf_unlearn.cli.demo", "hf_unlearn.demo", "hf_unlearn.scripts"} <= set(modules)
    offending = {}
    for name, path in modules.items():
        found = sorted(m for m in imported_modules(path.read_text(), name, path.name == "__init__.py") if _is_lab(m))
        if found:
            offending[name] = found
    assert not offending, f"the library imports the lab: {offending}"


def lab_private_imports(source: str, module: str, is_package: bool) -> list[str]:
    """Every name of ``hf_unlearn`` that ``source`` (a module of the lab) imports and that is private: a module
    path or an imported name with a leading underscore (dunder names such as ``__version__`` are public), and
    every relative import that leaves the lab's package."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level and node.level > len(package.split(".")):
                found.append(f"{'.' * node.level}{node.module or ''} (outside the lab)")
                continue
            target = import_from_target(node, package)
            targets = [(target, alias.name) for alias in node.names]
        else:
            continue
        for target, name in targets:
            if target != "hf_unlearn" and not target.startswith("hf_unlearn."):
                continue
            private = [p for p in target.split(".") if p.startswith("_") and not p.endswith("__")]
            if private or (name and name.startswith("_") and not name.endswith("__")):
                found.append(f"{target}.{name}" if name else target)
    return found


def test_lab_scan_flags_private_names_and_escaping_imports():
    source = textwrap.dedent("""
        from hf_unlearn.data.documents import _bos_prefix, chunk_token_ids
        from hf_unlearn.assets import __version__
        import hf_unlearn._import_utils
        from hf_unlearn import registry

        def later():
            from ...hf_unlearn import run
    """)
    found = lab_private_imports(source, "unlearn_bench.subjects.muse_news", is_package=False)
    assert found == ["hf_unlearn.data.documents._bos_prefix", "hf_unlearn._import_utils", "...hf_unlearn (outside the lab)"]


def test_the_lab_imports_only_public_names_of_the_library():
    """``benchmarks/unlearn_bench`` uses ``hf_unlearn`` through public modules and names only."""
    lab = PACKAGE.parent / "benchmarks" / "unlearn_bench"
    files = sorted(lab.rglob("*.py"))
    assert len(files) > 10
    offending = {}
    for path in files:
        parts = path.relative_to(lab.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found = lab_private_imports(path.read_text(), name, path.name == "__init__.py")
        if found:
            offending[name] = found
    assert not offending, f"the lab imports private names of hf_unlearn: {offending}"


def test_the_cli_unlearn_command_imports_no_benchmark_module_when_it_runs(tmp_path):
    """``hf-unlearn unlearn --help`` and a run refused at the model load import no module of the lab (the static
    scan above, seen at run time)."""
    out = _run(f"""
        import json, sys
        from hf_unlearn.cli import main
        codes = [main(["unlearn", "--method", "grom", "--help"]),
                 main(["unlearn", "--method", "npo", "--model", {str(tmp_path / "no-model")!r},
                       "--output", {str(tmp_path / "out")!r}, "--data", "synthetic"])]
        bench = sorted(m for m in sys.modules if m.startswith("unlearn_bench"))
        print(json.dumps({{"codes": codes, "bench": bench}}))
    """)
    assert out["codes"] == [0, 2] and out["bench"] == []


def test_deletion_request_example_does_not_import_the_cli():
    """``examples/deletion_request.py`` is built on the library (:mod:`hf_unlearn.run`, :mod:`hf_unlearn.options`,
    :mod:`hf_unlearn.preconditions`), not on the command line's module."""
    path = PACKAGE.parent / "examples" / "deletion_request.py"
    imported = imported_modules(path.read_text(), "deletion_request", is_package=False)
    assert "hf_unlearn.run" in imported
    assert not [m for m in imported if m == "hf_unlearn.cli" or m.startswith("hf_unlearn.cli.")], sorted(imported)


def _run(code: str) -> dict:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_import_is_lazy_names_resolve_on_use_and_t3_auto_registers(tmp_path):
    """``import hf_unlearn`` imports neither torch nor transformers; a name is imported when used; once
    transformers' Auto classes load, they load a saved T3 head without ``trust_remote_code``."""
    out = _run(f"""
        import json, sys
        import hf_unlearn
        before = sorted(m for m in ("torch", "transformers", "trl", "peft") if m in sys.modules)
        path = hf_unlearn.metric_path("tofu_truth_ratio")
        after_metric = "torch" in sys.modules
        from transformers import AutoConfig, AutoModel
        config = AutoConfig.for_model("t3_classifier", rank=2, hidden_size=8, vocab_size=16)
        AutoModel.from_config(config).save_pretrained({str(tmp_path)!r})
        head = AutoModel.from_pretrained({str(tmp_path)!r})
        trainer = hf_unlearn.NPOTrainer
        print(json.dumps({{"before": before, "after_metric": after_metric, "all": hf_unlearn.__all__,
                           "head": type(head).__module__ + "." + type(head).__name__,
                           "trainer": trainer.__module__}}))
    """)
    assert out["before"] == [] and out["after_metric"] is False
    assert out["head"] == "hf_unlearn.methods.t3.modeling.T3Classifier"
    assert out["trainer"] == "hf_unlearn.methods.baselines.trainer"
    public = set(out["all"])
    assert {"UnlearningConfig", "GradAscentTrainer", "GradDiffTrainer", "NPOTrainer", "SimNPOTrainer", "MASCConfig",
            "MASCTrainer", "ATWUConfig", "ATWUTrainer", "GROMConfig", "GROMEdit", "fit_grom", "T3Classifier",
            "T3ClassifierConfig", "T3LogitsProcessor", "fit_t3", "evaluate_tofu", "load_tofu", "PromptTemplate",
            "metric_path"} <= public
    assert not any(name.startswith("_") for name in public)


@pytest.mark.slow
def test_every_exported_name_resolves():
    import hf_unlearn

    missing = [name for name in hf_unlearn.__all__ if getattr(hf_unlearn, name, None) is None]
    assert not missing
    with pytest.raises(AttributeError):
        hf_unlearn.not_a_name  # noqa: B018


@pytest.mark.parametrize("package", ["data", "evaluation", "methods.base", "methods.baselines", "methods.masc",
                                     "methods.atwu", "methods.grom", "methods.t3", "methods.rmu",
                                     "methods.pdu"])
def test_subpackage_all_lists_only_public_names(package):
    import importlib

    module = importlib.import_module(f"hf_unlearn.{package}")
    names = module.__all__
    assert names and len(names) == len(set(names))
    assert not [n for n in names if n.startswith("_")]
    assert not [n for n in names if not hasattr(module, n)]


def test_the_base_imports_nothing_of_the_baselines():
    """``hf_unlearn.methods.base`` imports no module of ``hf_unlearn.methods.baselines``, at any depth (function-local
    imports included): the base trainer holds no objective, and the baselines' trainer subclasses it to supply one."""
    base = PACKAGE / "methods" / "base"
    offending = {}
    for path in sorted(base.glob("*.py")):
        module = "hf_unlearn.methods.base" + ("" if path.name == "__init__.py" else f".{path.stem}")
        found = sorted(m for m in imported_modules(path.read_text(), module, path.name == "__init__.py")
                       if m == "hf_unlearn.methods.baselines" or m.startswith("hf_unlearn.methods.baselines."))
        if found:
            offending[module] = found
    assert not offending, f"the base imports the baselines: {offending}"
