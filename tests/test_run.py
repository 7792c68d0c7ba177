"""hf_unlearn.run: one run path. Seeding and run options are explicit (TrainOptions); save() writes what a run
produced; a fit's chosen settings join the given ones; the benchmark's registry keeps its presets on top of the same
function."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from hf_unlearn import registry
from hf_unlearn.result import Unlearned
from hf_unlearn.run import Inputs, TrainOptions, fit_or_train, prepare_inputs, save

CALLS: list[dict] = []


class _Artifact:
    """Stands in for a saved artifact: writes one file."""

    _title = "Toy"
    _paper = None
    _cli_help = "toy fit"

    def save_pretrained(self, path):
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "artifact.json").write_text(json.dumps({"saved": True}))


@dataclasses.dataclass
class ToyConfig:
    a: int = 0
    b: int = 0


class ToyFit(registry.MethodFit):
    """Records what it was given and one draw of the global torch generator; its selection picks ``b = 9``."""

    artifact_cls = _Artifact
    artifact_kind = "unlearned_model"

    def __call__(self, model, tokenizer, forget, retain, config):
        CALLS.append({"config": config, "draw": torch.rand(1).item()})
        return Unlearned(method="", model=model, artifact=_Artifact(), settings={}, trainable_params=0,
                         total_params=1, weights_changed=False)

    def select(self, model, tokenizer, forget, retain, config, criterion):
        result = self(model, tokenizer, forget, retain, dataclasses.replace(config, b=9))
        result.settings = {"b": 9}
        result.info["selection"] = {"criterion": criterion}
        return result


class PlainFit(ToyFit):
    select = None


@pytest.fixture()
def toy():
    import unlearn_bench.registry  # noqa: F401  (loaded first: its table of the built-in methods has no toy)

    CALLS.clear()
    registry.register_method("toyrun", config_cls=ToyConfig, fit=ToyFit())
    registry.register_method("toyplain", config_cls=ToyConfig, fit=PlainFit())
    yield CALLS
    registry.unregister_method("toyrun")
    registry.unregister_method("toyplain")


def _inputs(method="toyrun", settings=None) -> Inputs:
    return prepare_inputs(method, None, None, [], [], "out", settings)


def test_seed_is_an_explicit_option(toy):
    fit_or_train(_inputs(), TrainOptions(seed=7))
    fit_or_train(_inputs(), TrainOptions(seed=7))
    expected = torch.Generator().manual_seed(7)
    assert toy[0]["draw"] == toy[1]["draw"] == torch.rand(1, generator=expected).item()
    fit_or_train(_inputs())  # the default seed, 0
    assert toy[2]["draw"] == torch.rand(1, generator=torch.Generator().manual_seed(0)).item()
    torch.manual_seed(7)
    torch.rand(1)
    fit_or_train(_inputs(), TrainOptions(seed=None))  # left as it is: the generator's next draw
    assert toy[3]["draw"] != toy[0]["draw"]


def test_the_fit_gets_the_config_and_the_result_the_given_settings(toy):
    result = fit_or_train(_inputs(settings={"a": 1}))
    assert toy[0]["config"] == ToyConfig(a=1) and result.settings == {"a": 1}
    assert result.method == "toyrun" and result.seconds >= 0
    with pytest.raises(ValueError, match="Invalid toyrun setting"):
        _inputs(settings={"c": 1})


def test_a_criterion_runs_the_fits_selection_and_its_choice_joins_the_settings(toy):
    marker = object()
    result = fit_or_train(_inputs(settings={"a": 1}), TrainOptions(criterion=marker))
    assert toy[0]["config"] == ToyConfig(a=1, b=9)
    assert result.settings == {"a": 1, "b": 9} and result.info["selection"] == {"criterion": marker}
    with pytest.raises(ValueError, match="has no strength selection"):
        fit_or_train(_inputs("toyplain"), TrainOptions(criterion=marker))
    with pytest.raises(ValueError, match="applies to the trainer methods only"):
        fit_or_train(_inputs(), TrainOptions(peft_config=object()))
    assert len(toy) == 1


def test_save_writes_the_artifact_and_logs_the_run(toy, tmp_path):
    log = tmp_path / "out" / "logs" / "toyrun.jsonl"
    inputs = _inputs(settings={"b": 2})
    result = fit_or_train(inputs)
    save(result, inputs, tmp_path / "out", log_path=log)
    assert json.loads((tmp_path / "out" / "artifact.json").read_text()) == {"saved": True}
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["event"] for r in records] == ["trained"] and records[0]["settings"] == {"b": 2}
    assert records[0]["seconds"] == pytest.approx(result.seconds)


def test_the_benchmark_holds_presets_only_and_runs_through_the_core(toy):
    """The benchmark's registry holds each method's presets (data), no runner of its own: a preset runs through
    :func:`hf_unlearn.run.fit_or_train` like any other settings."""
    import unlearn_bench.registry as bench

    assert not [n for n in ("fit_or_train", "register", "Unlearned", "JsonlLogCallback") if hasattr(bench, n)]
    presets = bench.method_presets("toyrun")  # registered after the presets loaded: its config's defaults
    assert (presets.name, presets.demo, presets.grid, presets.description) == ("toyrun", {}, ({},), "toy fit")
    assert bench.method_presets("grom") is bench.PRESETS["grom"] and bench.PRESETS["grom"].grid
    with pytest.raises(ValueError, match="Unknown method 'no_such_method'"):
        bench.method_presets("no_such_method")
    fit_or_train(_inputs(settings=presets.demo))
    assert toy[0]["config"] == ToyConfig()
