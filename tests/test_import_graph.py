"""The import graph: the library core never imports the benchmark harness (the command line only in its
``demo``/``bench``/``tiny`` commands), the deletion-request example does not import the command line, and the
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
    """``{module name: file}`` of every module of the library outside ``hf_unlearn.bench``."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[:2] == ("hf_unlearn", "bench") or "__pycache__" in parts:
            continue
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _is_bench(name: str) -> bool:
    return name == "hf_unlearn.bench" or name.startswith("hf_unlearn.bench.")


def test_scanner_finds_relative_local_and_aliased_imports():
    source = textwrap.dedent("""
        import os
        from . import bench
        from ..bench.registry import METHODS
        from .methods.grom import fit_grom

        def later():
            import hf_unlearn.bench.runner as runner
            from .bench import report
    """)
    found = imported_modules(source, "hf_unlearn.hub", is_package=False)
    assert {"os", "hf_unlearn.bench", "hf_unlearn.methods.grom", "hf_unlearn.bench.runner", "hf_unlearn.bench.report"} <= found
    assert "bench.registry" in {n.split("hf_unlearn.", 1)[-1] for n in imported_modules(
        "from ...bench.registry import METHODS", "hf_unlearn.methods.t3.fit", is_package=False)}
    assert imported_modules("from .. import bench", "hf_unlearn.methods", is_package=True) >= {"hf_unlearn.bench"}
    assert imported_modules("from .bench import x", "hf_unlearn", is_package=True) >= {"hf_unlearn.bench.x"}


#: The functions outside the benchmark harness that may import it, by module: the command line's ``demo``, ``bench``
#: and ``tiny`` commands (with the helpers of ``bench --subject`` and ``bench --benchmark muse``) and ``unlearn --preset demo``, whose setting lives
#: in the benchmark's subject file; and the example scripts' ``tofu-tiny`` model shortcut, which builds the tiny
#: model with the benchmark's subjects (:func:`hf_unlearn.scripts.tofu_tiny_target`).
CLI_BENCH_FUNCTIONS = {
    "hf_unlearn.cli.demo": frozenset({"cmd_demo"}),
    "hf_unlearn.cli.bench": frozenset({"cmd_bench", "bench_subject", "bench_muse"}),
    "hf_unlearn.cli.tiny": frozenset({"cmd_tiny"}),
    "hf_unlearn.cli.unlearn": frozenset({"demo_preset"}),
    "hf_unlearn.scripts": frozenset({"tofu_tiny_target"}),
}


def bench_imports(source: str, module: str, is_package: bool, allowed_functions: frozenset[str] = frozenset()
                  ) -> dict[str, list[str]]:
    """``{where: [hf_unlearn.bench modules]}`` for every import of the benchmark harness in ``source``, at any depth
    (module level, function-local, ``TYPE_CHECKING``); ``where`` is the enclosing top-level function or class, or
    ``<module>``. Imports inside the top-level functions named in ``allowed_functions`` are left out."""
    found: dict[str, list[str]] = {}
    for node in ast.parse(source).body:
        where = node.name if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else "<module>"
        if where in allowed_functions and not isinstance(node, ast.ClassDef):
            continue
        bench = sorted(m for m in imported_modules(ast.unparse(node), module, is_package) if _is_bench(m))
        if bench:
            found.setdefault(where, []).extend(bench)
    return found


def test_bench_scan_sees_function_level_imports_and_only_the_named_exceptions():
    source = textwrap.dedent("""
        from .registry import get_method

        def cmd_demo():
            from .bench.runner import run_comparison

        def cmd_unlearn():
            if True:
                from .bench import registry

        class Command:
            def run(self):
                import hf_unlearn.bench.console
    """)
    found = bench_imports(source, "hf_unlearn.cli", False, frozenset({"cmd_demo"}))
    assert set(found) == {"cmd_unlearn", "Command"}
    assert "hf_unlearn.bench.registry" in found["cmd_unlearn"] and found["Command"] == ["hf_unlearn.bench.console"]
    assert set(bench_imports(source, "hf_unlearn.cli", False)) == {"cmd_demo", "cmd_unlearn", "Command"}


def test_core_never_imports_the_benchmark_harness():
    """No module of ``hf_unlearn`` outside ``hf_unlearn/bench`` imports ``hf_unlearn.bench``, at any depth; only the
    functions of :data:`CLI_BENCH_FUNCTIONS` do (and each of them does, or the list is stale)."""
    modules = core_modules()
    assert {"hf_unlearn", "hf_unlearn.hub", "hf_unlearn.methods.base.trainer", "hf_unlearn.cli",
            "hf_unlearn.run", "hf_unlearn.console", *CLI_BENCH_FUNCTIONS} <= set(modules)
    offending = {}
    for name, path in modules.items():
        allowed = CLI_BENCH_FUNCTIONS.get(name, frozenset())
        found = bench_imports(path.read_text(), name, path.name == "__init__.py", allowed)
        if found:
            offending[name] = found
    assert not offending, f"the core imports the benchmark harness: {offending}"
    for name, functions in CLI_BENCH_FUNCTIONS.items():
        found = bench_imports(modules[name].read_text(), name, modules[name].name == "__init__.py")
        assert set(found) == functions, (name, sorted(set(found) ^ functions))


def test_the_cli_unlearn_command_imports_no_benchmark_module_when_it_runs(tmp_path):
    """``hf-unlearn unlearn --help`` and a run refused at the model load no ``hf_unlearn.bench`` module (the static
    scan above, seen at run time)."""
    out = _run(f"""
        import json, sys
        from hf_unlearn.cli import main
        codes = [main(["unlearn", "--method", "grom", "--help"]),
                 main(["unlearn", "--method", "npo", "--model", {str(tmp_path / "no-model")!r},
                       "--output", {str(tmp_path / "out")!r}, "--data", "synthetic"])]
        bench = sorted(m for m in sys.modules if m.startswith("hf_unlearn.bench"))
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
