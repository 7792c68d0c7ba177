"""The core method registry: every method's metadata in one place (read from its classes), the CLI's ``--method``,
the model cards and the benchmark reading it, and a method added by one registration running through
``hf-unlearn unlearn``."""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import re
import subprocess
import sys
import textwrap
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hf_unlearn import registry
from hf_unlearn.cli import main
from hf_unlearn.methods.baselines import GradAscentTrainer

ARXIV_ID = re.compile(r"^\d{4}\.\d{4,5}$")


def test_every_method_has_its_metadata_and_the_cli_lists_the_registry():
    from unlearn_bench.registry import PRESETS

    from hf_unlearn.cli import build_parser
    from hf_unlearn.cli.unlearn import method_help
    from hf_unlearn.hub import ARTIFACT_KINDS, METHOD_PAPERS, METHOD_TITLES

    names = registry.method_names()
    assert set(names) == {"grad_ascent", "grad_diff", "npo", "simnpo", "masc", "atwu", "grom", "t3",
                          "wga", "satimp", "ceu", "undial", "dpo", "idk_dpo", "rmu", "pdu"}
    for name in names:
        info = registry.get_method(name)
        assert info.name == name and info.title.strip() and info.cli_help.strip()
        assert info.artifact_kind in ARTIFACT_KINDS
        assert info.paper is None or (info.paper["title"].strip() and ARXIV_ID.match(info.paper["id"]))
        assert dataclasses.is_dataclass(info.config_cls)
        assert (info.trainer_cls is None) != (info.fit is None)
        assert METHOD_TITLES[name] == info.title
    assert [n for n in names if registry.get_method(n).paper is None] == ["grom"]  # no paper to cite yet
    assert set(METHOD_PAPERS) == set(names) - {"grom"}
    assert set(PRESETS) == set(names)
    assert {n for n in names if registry.get_method(n).is_trainer} == {
        "grad_ascent", "grad_diff", "npo", "simnpo", "masc", "atwu", "wga", "satimp", "ceu", "undial", "dpo", "idk_dpo",
        "rmu", "pdu"}

    # the --method help of `hf-unlearn unlearn --help` names exactly the registered methods
    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    help_text = subparsers.choices["unlearn"].format_help()
    lines = help_text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("--method METHOD"))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("-"))
    listed = " ".join(" ".join(lines[start:end]).split()).removeprefix("--method METHOD ")
    assert listed == method_help()
    assert re.split(r", | or ", listed) == list(names)


def test_classes_carry_their_method_and_artifacts_map_back():
    from hf_unlearn.methods.base import UnlearningTrainer
    from hf_unlearn.methods.baselines import NPOTrainer
    from hf_unlearn.methods.grom import GROMEdit
    from hf_unlearn.methods.masc import MASCTrainer
    from hf_unlearn.methods.t3 import T3Classifier

    class MyNPO(NPOTrainer):
        pass

    assert registry.method_for_artifact(MyNPO) == "npo"  # most derived registered class in the MRO
    assert registry.method_for_artifact(MASCTrainer) == "masc"
    assert registry.method_for_artifact(GROMEdit) == "grom" and registry.method_for_artifact(T3Classifier) == "t3"
    assert registry.method_for_artifact(UnlearningTrainer) is None
    assert registry.method_for_artifact(object()) is None
    assert NPOTrainer._name == "NPO"  # TRL's display name is untouched
    assert registry.get_method("npo").paper == NPOTrainer._paper


def test_register_method_refuses_bad_entries():
    from hf_unlearn.methods.baselines import GradAscentConfig

    good = dict(config_cls=ToyConfig, fit=ToyFit())
    with pytest.raises(ValueError, match="lowercase"):
        registry.register_method("Toy-Method", **good)
    with pytest.raises(ValueError, match="config_cls must be a dataclass"):
        registry.register_method("toy_bad", config_cls=dict, fit=ToyFit())
    with pytest.raises(ValueError, match="exactly one of trainer_cls and fit"):
        registry.register_method("toy_bad", config_cls=GradAscentConfig, trainer_cls=ToyAscentTrainer, fit=ToyFit())
    with pytest.raises(ValueError, match="exactly one of trainer_cls and fit"):
        registry.register_method("toy_bad", config_cls=ToyConfig)
    with pytest.raises(ValueError, match="fit must be a MethodFit instance"):
        registry.register_method("toy_bad", config_cls=ToyConfig, fit=run_toy)

    class NoPaper(ToyArtifact):
        _paper = {"title": "x"}

    class NoHelp(ToyArtifact):
        _cli_help = " "

    for artifact, message in ((NoPaper, "_paper must be None or a mapping"), (NoHelp, "_cli_help must be a non-empty")):
        fit = type("Fit", (ToyFit,), {"artifact_cls": artifact})()
        with pytest.raises(ValueError, match=message):
            registry.register_method("toy_bad", config_cls=ToyConfig, fit=fit)
    with pytest.raises(ValueError, match="already registered"):
        registry.register_method("npo", **good)
    with pytest.raises(KeyError, match="Unknown method 'toy_bad'"):
        registry.get_method("toy_bad")
    assert "toy_bad" not in registry.method_names()


def test_the_registry_imports_no_torch_and_the_cli_parser_loads_no_method():
    """Importing the registry and the hub module imports no torch; building the CLI parser (every command, e.g.
    ``hf-unlearn eval``) loads no method package: ``--method``'s help reads the registry only when shown."""
    code = textwrap.dedent("""
        import json, sys
        import hf_unlearn.registry, hf_unlearn.hub
        light = "torch" in sys.modules
        from hf_unlearn.cli import build_parser
        build_parser()
        print(json.dumps({"torch": light, "trl": "trl" in sys.modules,
                          "methods": any(m.startswith("hf_unlearn.methods.") for m in sys.modules)}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"torch": False, "trl": False, "methods": False}


# ------------------------------------------------------------------------- a method added by one registration
@dataclasses.dataclass
class ToyConfig:
    """Settings of the toy method: the marker it writes."""

    marker: str = dataclasses.field(default="toy", metadata={"help": "text written to toy_marker.json"})
    max_length: int | None = dataclasses.field(default=None, metadata={"help": "prompt + answer token limit"})


class ToyArtifact:
    """The toy's artifact: the unchanged model, saved with a marker beside it."""

    _title = "Toy (unchanged model)"
    _paper = None
    _cli_help = "saves the model unchanged with a marker"

    def __init__(self, model, marker: dict):
        self.model, self.marker = model, marker

    def save_pretrained(self, path):
        self.model.save_pretrained(path)
        (Path(path) / "toy_marker.json").write_text(json.dumps(self.marker))


def run_toy(model, tokenizer, forget, retain, config):
    """The toy method: leaves the model unchanged, with a marker."""
    from hf_unlearn.result import Unlearned

    total = sum(p.numel() for p in model.parameters())
    artifact = ToyArtifact(model, {"marker": config.marker, "forget": len(forget)})
    return Unlearned(method="toy", model=model, artifact=artifact, settings={}, trainable_params=0,
                     total_params=total, weights_changed=False)


class ToyFit(registry.MethodFit):
    artifact_cls = ToyArtifact
    artifact_kind = "unlearned_model"

    def __call__(self, model, tokenizer, forget, retain, config):
        return run_toy(model, tokenizer, forget, retain, config)


@pytest.fixture()
def toy_method():
    info = registry.register_method("toy", config_cls=ToyConfig, fit=ToyFit())
    yield info
    registry.unregister_method("toy")


def test_a_registered_toy_method_runs_through_the_cli(toy_method, tiny_pair, tmp_path, capsys):
    assert registry.method_names()[-1] == "toy"
    from hf_unlearn.cli.unlearn import method_help

    assert method_help().endswith(" or toy")

    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["unlearn", "--method", "toy", "--help"]) == 0
    assert "--marker MARKER" in buf.getvalue() and "ToyConfig" in buf.getvalue()

    out = tmp_path / "toy-out"
    code = main(["unlearn", "--method", "toy", "--model", str(tiny_pair.target), "--data", "synthetic",
                 "--output", str(out), "--marker", "hello"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "toy: unlearned in" in captured.out and str(out) in captured.out
    marker = json.loads((out / "toy_marker.json").read_text())
    assert marker["marker"] == "hello" and marker["forget"] > 0
    saved, original = load_file(out / "model.safetensors"), load_file(Path(tiny_pair.target) / "model.safetensors")
    assert saved.keys() == original.keys()
    for key in original:
        torch.testing.assert_close(saved[key], original[key])
    events = [json.loads(line) for line in (out / "logs" / "toy.jsonl").read_text().splitlines()]
    assert any(e.get("event") == "trained" and e.get("settings") == {"marker": "hello"} for e in events), events

    # a bad value of the toy's own config is refused before any work, as for the built-in methods
    code = main(["unlearn", "--method", "toy", "--model", str(tiny_pair.target), "--data", "synthetic",
                 "--output", str(tmp_path / "bad"), "--max_length", "many"])
    err = capsys.readouterr().err
    assert code == 2 and "hf-unlearn: error: toy:" in err and not (tmp_path / "bad").exists()


def test_unregistered_method_is_refused_with_the_registry_names(tmp_path, capsys):
    assert main(["unlearn", "--method", "toy", "--model", "m", "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"hf-unlearn: error: Unknown method 'toy'; choose from {', '.join(sorted(registry.method_names()))}."


class ToyAscentTrainer(GradAscentTrainer):
    """Gradient ascent registered as a method of its own."""

    _method = "toy_ascent"
    _title = "Toy ascent"
    _paper = None
    _cli_help = "gradient ascent under another name"


def test_a_registered_toy_trainer_trains_through_the_cli(tiny_pair, tmp_path, capsys):
    """A trainer subclass registered with its config is a trainer method to the CLI (its config's
    options, trainer checks, checkpoint rules) and names its method in its model card."""
    from hf_unlearn.hub.cards import _trainer_method

    try:
        from hf_unlearn.methods.baselines import GradAscentConfig

        info = registry.register_method("toy_ascent", config_cls=GradAscentConfig, trainer_cls=ToyAscentTrainer)
        assert info.is_trainer and info.has_selection and not info.stops_itself
        assert registry.get_method("toy_ascent").trainer_cls is ToyAscentTrainer
        out = tmp_path / "ascent"
        code = main(["unlearn", "--method", "toy_ascent", "--model", str(tiny_pair.target), "--data", "synthetic",
                     "--output", str(out), "--max_steps", "1", "--learning_rate", "1e-3"])
        captured = capsys.readouterr()
        assert code == 0, captured.err
        assert "toy_ascent: unlearned in" in captured.out
        saved, original = load_file(out / "model.safetensors"), load_file(Path(tiny_pair.target) / "model.safetensors")
        assert any(not torch.allclose(saved[k].float(), original[k].float()) for k in original)  # it trained
        assert (out / "tokenizer_config.json").is_file()
        trainer = ToyAscentTrainer.__new__(ToyAscentTrainer)
        assert _trainer_method(trainer) == "toy_ascent"
        code = main(["unlearn", "--method", "toy_ascent", "--model", str(tiny_pair.target), "--data", "synthetic",
                     "--output", str(tmp_path / "bad"), "--learning_rate", "0"])
        assert code == 2 and "learning" in capsys.readouterr().err and not (tmp_path / "bad").exists()
    finally:
        registry.unregister_method("toy_ascent")
