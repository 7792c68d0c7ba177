"""hf_unlearn.run: seeding and run options are explicit arguments; unlearn() saves what a run produced; the
benchmark's registry keeps its presets on top of the same function."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hf_unlearn import registry
from hf_unlearn.result import Unlearned
from hf_unlearn.run import run_method, unlearn

CALLS: list[dict] = []


class _Artifact:
    """Stands in for a saved artifact: writes one file."""

    def save_pretrained(self, path):
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "artifact.json").write_text(json.dumps({"saved": True}))


def run_toy(model, tokenizer, forget, retain, output_dir, settings):
    """A runner without run options: records what it was given and one draw of the global torch generator."""
    CALLS.append({"settings": dict(settings), "draw": torch.rand(1).item(), "output_dir": str(output_dir)})
    return Unlearned(method="", model=model, artifact=_Artifact(), settings=dict(settings), trainable_params=0,
                     total_params=1, weights_changed=False)


def run_toy_with_options(model, tokenizer, forget, retain, output_dir, settings, *, callbacks=(), quiet=False,
                         resume_from_checkpoint=None):
    CALLS.append({"callbacks": list(callbacks), "quiet": quiet, "resume": resume_from_checkpoint})
    return run_toy(model, tokenizer, forget, retain, output_dir, settings)


run_toy_with_options.takes_run_options = True


@pytest.fixture()
def toy():
    import unlearn_bench.registry  # noqa: F401  (loaded first: its table of the built-in methods has no toy)

    CALLS.clear()
    for name, entry in (("toyrun", "run_toy"), ("toyopts", "run_toy_with_options")):
        registry.register_method(name, title="Toy", paper=None, artifact_kind="unlearned_model",
                                 entry_point=f"{__name__}:{entry}", cli_help="toy runner")
    yield CALLS
    registry.unregister_method("toyrun")
    registry.unregister_method("toyopts")


def test_seed_is_an_explicit_argument(toy):
    run_method("toyrun", None, None, [], [], "out", {}, seed=7)
    run_method("toyrun", None, None, [], [], "out", {}, seed=7)
    expected = torch.Generator().manual_seed(7)
    assert toy[0]["draw"] == toy[1]["draw"] == torch.rand(1, generator=expected).item()
    run_method("toyrun", None, None, [], [], "out", {})  # the default seed, 0
    assert toy[2]["draw"] == torch.rand(1, generator=torch.Generator().manual_seed(0)).item()
    torch.manual_seed(7)
    torch.rand(1)
    run_method("toyrun", None, None, [], [], "out", {}, seed=None)  # left as it is: the generator's next draw
    assert toy[3]["draw"] != toy[0]["draw"]


def test_run_options_reach_the_runner_that_takes_them_only(toy):
    marker = object()
    result = run_method("toyopts", None, None, [], [], "out", {"a": 1}, callbacks=[marker], quiet=True,
                        resume_from_checkpoint=True)
    assert toy[0] == {"callbacks": [marker], "quiet": True, "resume": True}
    assert toy[1]["settings"] == {"a": 1} and result.method == "toyopts" and result.seconds >= 0
    run_method("toyrun", None, None, [], [], "out", None, callbacks=[marker], quiet=True)
    assert toy[2]["settings"] == {}  # no settings: the config's defaults; the runner got six arguments only


def test_unlearn_saves_the_result_and_logs_it(toy, tmp_path):
    phases = []
    log = tmp_path / "out" / "logs" / "toyrun.jsonl"
    result = unlearn("toyrun", None, None, [], [], tmp_path / "out", {"b": 2}, log_path=log, on_phase=phases.append)
    assert phases == ["training", "training (saving the result)"]
    assert json.loads((tmp_path / "out" / "artifact.json").read_text()) == {"saved": True}
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["event"] for r in records] == ["trained"] and records[0]["settings"] == {"b": 2}
    assert records[0]["seconds"] == pytest.approx(result.seconds)


def test_the_benchmark_holds_presets_only_and_runs_through_the_core(toy):
    """The benchmark's registry holds each method's presets (data), no runner of its own: a preset runs through
    :func:`hf_unlearn.run.run_method` like any other settings."""
    import unlearn_bench.registry as bench

    import hf_unlearn.run as core

    assert not [n for n in ("run_method", "runner_for", "register", "Unlearned", "JsonlLogCallback") if hasattr(bench, n)]
    presets = bench.method_presets("toyrun")  # registered after the presets loaded: its config's defaults
    assert (presets.name, presets.demo, presets.grid, presets.description) == ("toyrun", {}, ({},), "toy runner")
    assert bench.method_presets("grom") is bench.PRESETS["grom"] and bench.PRESETS["grom"].grid
    with pytest.raises(ValueError, match="Unknown method 'no_such_method'"):
        bench.method_presets("no_such_method")
    core.run_method("toyrun", None, None, [], [], "out", presets.demo)
    core.run_method("toyrun", None, None, [], [], "out", {"given": 1}, seed=5)
    assert toy[0]["settings"] == {} and toy[1]["settings"] == {"given": 1}
    assert toy[1]["draw"] == torch.rand(1, generator=torch.Generator().manual_seed(5)).item()
