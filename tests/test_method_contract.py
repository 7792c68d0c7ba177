"""The method contract: a method defined and registered in this test file (one config, one pure loss, a trainer
that wires them) runs through every way in (``hf-unlearn unlearn``, ``--select``, saving, its model card, the
benchmark runner) with no change to any other module; and no core module (anything outside the method folders
``hf_unlearn/methods/<name>/``, ``methods/base`` included) names a method (no import of a method folder, no string
equal to a method's name) or reads an attribute that only one method's classes define, so that the core knows a
method only by its registered classes and what their shared bases declare."""

from __future__ import annotations

import ast
import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from safetensors.torch import load_file
from test_import_graph import imported_modules

from hf_unlearn import registry
from hf_unlearn.methods.base.config import BaseUnlearningConfig
from hf_unlearn.methods.base.trainer import UnlearningTrainer

PACKAGE = Path(__file__).resolve().parents[1] / "hf_unlearn"


# ----- the toy method: one config, one loss ----------------------------------------------------------------------
@dataclass
class ToyAscentConfig(BaseUnlearningConfig):
    """Gradient ascent at a scale: the toy method's config."""

    ascent_scale: float = field(default=1.0, metadata={"help": "Scale of the ascent on the forget NLL (> 0)."})

    def __post_init__(self):
        if not 0 < self.ascent_scale < math.inf:
            raise ValueError(f"`ascent_scale` must be a finite number > 0, got {self.ascent_scale}.")
        super().__post_init__()


def toy_ascent_loss(token_log_probs: torch.Tensor, mask: torch.Tensor, scale: float, num_tokens: Any) -> torch.Tensor:
    """``scale * (1/N) sum_t log p(y_t)`` over the answer tokens: minimising it raises the forget NLL."""
    return scale * (token_log_probs * mask).sum() / num_tokens


class ToyAscentTrainer(UnlearningTrainer):
    _name = "ToyAscent"
    _method = "toy_ascent"
    _title = "Toy ascent"
    _paper: ClassVar[dict[str, str] | None] = None
    _cli_help = "a toy gradient ascent registered from a test file"
    config_class = ToyAscentConfig

    @classmethod
    def needs_retain(cls, args: Any) -> bool:
        return False

    def compute_unlearning_loss(self, model, inputs, denominators):
        forget = self.score(model, inputs)
        return toy_ascent_loss(forget.token_log_probs, forget.mask, self.args.ascent_scale, denominators.forget_tokens)


@pytest.fixture()
def toy_method():
    info = registry.register_method("toy_ascent", config_cls=ToyAscentConfig, trainer_cls=ToyAscentTrainer)
    try:
        yield info
    finally:
        registry.unregister_method("toy_ascent")


def _changed(folder: Path, original: Path) -> bool:
    saved, before = load_file(folder / "model.safetensors"), load_file(original / "model.safetensors")
    return any(not torch.equal(saved[k], before[k]) for k in before)


def test_a_toy_method_registered_from_a_test_file_runs_through_the_cli_selection_and_its_card(
        toy_method, tiny_pair, tmp_path, capsys):
    from hf_unlearn.cli import main
    from hf_unlearn.hub import build_model_card
    from hf_unlearn.selection import SelectionRecord

    assert toy_method.has_selection and not toy_method.stops_itself and toy_method.config_cls is ToyAscentConfig
    common = ["--method", "toy_ascent", "--model", str(tiny_pair.target), "--data", "synthetic", "--max_steps", "4",
              "--learning_rate", "1e-3", "--ascent_scale", "2.0"]
    plain = tmp_path / "plain"
    assert main(["unlearn", *common, "--output", str(plain)]) == 0, capsys.readouterr().err
    assert _changed(plain, Path(tiny_pair.target)) and (plain / "tokenizer_config.json").is_file()
    log = [json.loads(line) for line in (plain / "logs" / "toy_ascent.jsonl").read_text().splitlines()]
    assert any(r.get("event") == "trained" and r["settings"]["ascent_scale"] == 2.0 for r in log), log[-1]

    selected = tmp_path / "selected"
    assert main(["unlearn", *common, "--output", str(selected), "--select", "--holdout", "holdout10",
                 "--selection-steps", "2"]) == 0, capsys.readouterr().err
    record = SelectionRecord.load(selected)
    assert record.candidates == [{"step": 0}, {"step": 2}, {"step": 4}] and 0 <= record.index < 3

    bad = tmp_path / "bad"
    assert main(["unlearn", *common[:-2], "--ascent_scale", "0", "--output", str(bad)]) == 2
    assert "ascent_scale" in capsys.readouterr().err and not bad.exists()

    card = build_model_card("unlearned_model", str(tiny_pair.target), "toy_ascent", {"ascent_scale": 2.0}, None,
                            forget_split="forget10", selection=record.to_dict())
    assert card.data.tags[:2] == ["unlearning", "toy_ascent"] and "Toy ascent" in str(card)
    assert "ascent_scale" in str(card)


@pytest.mark.slow
def test_the_benchmark_runner_compares_a_toy_method_with_its_own_selection(toy_method, tiny_pair, tmp_path):
    from unlearn_bench.runner import run_comparison

    from hf_unlearn.data import load_tofu_rows

    holdout = load_tofu_rows("holdout10", "synthetic")
    validation = load_tofu_rows("retain_perturbed", "synthetic")[:10]
    results = run_comparison(
        tiny_pair, ["toy_ascent"], grid=False, source="synthetic", forget_split="forget10",
        eval_kwargs={"max_new_tokens": 8, "max_examples": 12}, quantization_check=False, progress=False,
        selection_rows=(holdout, validation), selection_steps=5,
    )
    row = results["rows"]["toy_ascent"]
    assert row["error"] is None and 0.0 <= row["forget_quality"] <= 1.0
    assert row["selected"]["num_candidates"] >= 2 and "step" in row["selected"]["candidate"]


PLUGIN = """
from dataclasses import dataclass, field

from hf_unlearn.methods.base.config import BaseUnlearningConfig
from hf_unlearn.methods.base.trainer import UnlearningTrainer
from hf_unlearn.registry import register_method


@dataclass
class PluginConfig(BaseUnlearningConfig):
    plugin_scale: float = field(default=1.0, metadata={"help": "Scale of the plugin's ascent."})


class PluginTrainer(UnlearningTrainer):
    _name, _method, _title, _paper, _cli_help = "Plugin", "plugin_ascent", "Plugin ascent", None, "from a plugin"
    config_class = PluginConfig


register_method("plugin_ascent", config_cls=PluginConfig, trainer_cls=PluginTrainer)
"""


def _plugin_distribution(root: Path, name: str, entry: str, module_source: str | None) -> None:
    """An installed distribution on ``root`` (a ``.dist-info`` folder) declaring one ``hf_unlearn.methods`` entry
    point, and its module."""
    info = root / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{registry.ENTRY_POINT_GROUP}]\n{name} = {entry}\n")
    if module_source is not None:
        (root / f"{entry.split(':')[0]}.py").write_text(module_source)


def test_an_installed_package_adds_a_method_through_its_entry_point(tmp_path):
    """A package declaring the ``hf_unlearn.methods`` entry point is loaded on the first lookup: its method is on
    the command line, with its config's fields as options; a plugin that fails to load is skipped with a warning
    naming it, and the built-in methods are still there."""
    import os
    import subprocess
    import sys

    _plugin_distribution(tmp_path, "plugin_ascent", "plugin_ascent_method", PLUGIN)
    _plugin_distribution(tmp_path, "broken_plugin", "broken_plugin_method", "raise ImportError('no such thing')\n")
    code = ("import warnings; warnings.simplefilter('always')\n"
            "from hf_unlearn.cli import main\n"
            "raise SystemExit(main(['unlearn', '--method', 'plugin_ascent', '--help']))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--plugin_scale" in done.stdout and "Scale of the plugin's ascent." in done.stdout
    assert "the method plugin 'broken_plugin' (broken_plugin_method) did not load: ImportError" in done.stderr


# ----- the core names no method ------------------------------------------------------------------------------------
#: Modules outside the method folders that may name methods: the package's public top level (which re-exports
#: each method's classes, as ``peft`` exports every config).
MAY_NAME_METHODS = frozenset({"hf_unlearn"})

#: What the scan still finds in ``methods/base``, to be moved into the baselines' folder: the baseline objective's
#: forget-term names (``UnlearningConfig.forget_loss`` values, ``objective_name``). The scan fails on anything else;
#: an entry no longer found is reported too, so that this list only shrinks.
KNOWN_IN_BASE = {
    "hf_unlearn.methods.base.config": ["'grad_ascent'", "'grad_ascent'", "'grad_ascent'", "'grad_diff'", "'npo'",
                                       "'simnpo'"],
}


def core_modules() -> list[tuple[str, Path]]:
    """``(module, path)`` of every module outside the method folders (``methods/base`` and ``methods/__init__``
    are core), except :data:`MAY_NAME_METHODS`."""
    from hf_unlearn.methods import BUILTIN_PACKAGES

    folders = {p.rpartition(".")[2] for p in BUILTIN_PACKAGES}
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if (parts[1:2] == ("methods",) and len(parts) > 3 and parts[2] in folders) or module in MAY_NAME_METHODS:
            continue
        out.append((module, path))
    return out


def method_mentions(source: str, module: str, is_package: bool, names: set[str], folders: set[str]) -> list[str]:
    """What ``source`` names of the methods: imports of a method folder ``hf_unlearn.methods.<folder>`` (at any
    depth) and string constants equal to a method's name (docstrings and prose never equal a name)."""
    found = []
    for imported in sorted(imported_modules(source, module, is_package)):
        parts = imported.split(".")
        if parts[:2] == ["hf_unlearn", "methods"] and len(parts) > 2 and parts[2] in folders:
            found.append(f"imports {imported}")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
            found.append(f"line {node.lineno}: {node.value!r}")
    return found


def attribute_reads(source: str, attributes: set[str]) -> list[str]:
    """Reads in ``source`` of one of ``attributes``: ``x.name`` and ``getattr`` / ``hasattr`` with the name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in attributes:
            found.append((node.lineno, f".{node.attr}"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
              and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and node.args[1].value in attributes):
            found.append((node.lineno, f"{node.func.id}(..., {node.args[1].value!r})"))
    return [f"line {line}: {what}" for line, what in sorted(found)]


def _in_method_folder(cls: type) -> bool:
    from hf_unlearn.methods import BUILTIN_PACKAGES

    return any(cls.__module__ == p or cls.__module__.startswith(p + ".") for p in BUILTIN_PACKAGES)


def _defined_in_core(sources: list[str]) -> set[str]:
    """Every name a class of the core defines (methods, class attributes, fields)."""
    names = set()
    for source in sources:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        names.add(item.name)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        names.add(item.target.id)
                    elif isinstance(item, ast.Assign):
                        names |= {t.id for t in item.targets if isinstance(t, ast.Name)}
    return names


def method_specific_attributes(sources: list[str]) -> set[str]:
    """Class members (not config fields) that exactly one registered method's classes define (its trainer or fit,
    the class that describes it, its config), that no base shared with the core has and the core does not define."""
    per_method, shared = [], set()
    for name in registry.method_names():
        info = registry.get_method(name)
        own = set()
        for cls in {info.config_cls, info.described_by, info.trainer_cls or type(info.fit)}:
            for klass in cls.__mro__:
                if _in_method_folder(klass):
                    fields = {f.name for f in dataclasses.fields(klass)} if dataclasses.is_dataclass(klass) else set()
                    own |= set(vars(klass)) - fields
                else:
                    shared |= set(dir(klass))
        per_method.append(own)
    once = {a for a in set().union(*per_method) if sum(a in own for own in per_method) == 1}
    return {a for a in once if not a.startswith("__")} - shared - _defined_in_core(sources)


def test_the_scans_see_a_method_folder_import_a_name_compared_and_a_method_attribute_read():
    source = 'def f(method, t):\n    from .methods.grom import fit_grom\n    return method == "npo" or getattr(t, "tau")\n'
    found = method_mentions(source, "hf_unlearn.run", False, {"npo"}, {"grom"})
    assert found == ["imports hf_unlearn.methods.grom", "imports hf_unlearn.methods.grom.fit_grom", "line 3: 'npo'"]
    assert attribute_reads(source + "x = t.violation_history\n", {"tau", "violation_history"}) == [
        "line 3: getattr(..., 'tau')", "line 4: .violation_history"]
    sources = [path.read_text() for _, path in core_modules()]
    specific = method_specific_attributes(sources)
    assert {"violation_history", "to_peft", "token_scores", "truncation_errors"} <= specific  # MASC, GROM, ATWU
    assert not {"training_outcome", "method_metrics", "stops_itself", "needs_retain", "select"} & specific


def test_no_core_module_names_a_method_or_reads_what_one_method_defines():
    from hf_unlearn.methods import BUILTIN_PACKAGES

    names = set(registry.method_names())
    folders = {p.rpartition(".")[2] for p in BUILTIN_PACKAGES}
    modules = core_modules()
    specific = method_specific_attributes([path.read_text() for _, path in modules])
    offending = {}
    for module, path in modules:
        source = path.read_text()
        found = method_mentions(source, module, path.name == "__init__.py", names, folders)
        found += attribute_reads(source, specific)
        if sorted(f.partition(": ")[2] for f in found) != KNOWN_IN_BASE.get(module, []):
            offending[module] = found
    assert not offending, offending
