"""The device rule: ``resolve_device`` (auto is CUDA when available, else the CPU; an explicit device is kept; CUDA
asked for without CUDA is refused), and ``hf-unlearn unlearn`` / ``eval --device``: the models they load are asked
to move to the chosen device before any work, ``--device cpu`` asks nothing of CUDA, and ``--device cuda``
without CUDA is refused in one line before any model loads. CUDA is monkeypatched as available and
``Module.to`` records the device instead of moving, so no GPU is needed."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import fake_cuda

import hf_unlearn.cli.eval as eval_command
import hf_unlearn.run as run_path
from hf_unlearn.cli import main
from hf_unlearn.devices import device_of, resolve_device
from hf_unlearn.options import UserError


def test_auto_is_cuda_when_available_else_cpu(monkeypatch):
    fake_cuda(monkeypatch, True, count=2)
    assert resolve_device() == resolve_device("auto") == resolve_device(" AUTO ") == "cuda"
    assert resolve_device("cpu") == "cpu" and resolve_device("cuda") == "cuda" and resolve_device("cuda:1") == "cuda:1"
    assert resolve_device(torch.device("cuda", 1)) == "cuda:1"
    monkeypatch.setenv("LOCAL_RANK", "1")  # under torchrun / accelerate launch: this process's own GPU
    assert resolve_device() == "cuda:1" and resolve_device("cuda") == "cuda"
    with pytest.raises(ValueError, match="has 2 CUDA GPU"):
        resolve_device("cuda:2")
    fake_cuda(monkeypatch, False)
    assert resolve_device() == resolve_device("auto") == resolve_device("cpu") == "cpu"
    for asked in ("cuda", "cuda:0", "CUDA:1"):
        with pytest.raises(ValueError, match="no CUDA GPU"):
            resolve_device(asked)
    for unknown in ("tpu", "gpu", "mps", "cuda:x", ""):
        with pytest.raises(ValueError, match="Unknown device"):
            resolve_device(unknown)


def test_device_of_names_the_first_parameter_device():
    assert device_of(torch.nn.Linear(2, 2)) == "cpu" and device_of(torch.nn.Module()) == "cpu"
    assert device_of(object()) == "cpu"


def _stop_after_load(monkeypatch):
    """The run stops right after the model loaded (at the preconditions): no training on a model that did not
    move. Returns the config each stop saw."""
    seen = []

    def stop(method, config, model, *args):
        seen.append(config)
        raise UserError("stopped after the model loaded")

    monkeypatch.setattr(run_path, "check_run_preconditions", stop)
    return seen


def _unlearn(tiny_pair, out, method, *extra):
    return ["unlearn", "--method", method, "--model", str(tiny_pair.target), "--data", "synthetic",
            "--output", str(out), *extra]


@pytest.mark.parametrize("method", ["grom", "t3"])
def test_unlearn_moves_the_model_to_cuda_when_available(tiny_pair, tmp_path, monkeypatch, moves, capsys, method):
    fake_cuda(monkeypatch, True)
    _stop_after_load(monkeypatch)
    assert main(_unlearn(tiny_pair, tmp_path / "out", method)) == 2
    assert "stopped after the model loaded" in capsys.readouterr().err
    assert moves and moves[-1] == "cuda", moves
    moves.clear()
    assert main(_unlearn(tiny_pair, tmp_path / "out", method, "--device", "cuda:0")) == 2
    assert moves[-1] == "cuda:0"


def test_unlearn_device_cpu_asks_nothing_of_cuda(tiny_pair, tmp_path, monkeypatch, moves, capsys):
    fake_cuda(monkeypatch, True)
    seen = _stop_after_load(monkeypatch)
    assert main(_unlearn(tiny_pair, tmp_path / "out", "grom", "--device", "cpu")) == 2
    assert moves and not [d for d in moves if d.startswith("cuda")], moves
    moves.clear()
    # a trainer method on a GPU machine told to stay on the CPU: the Trainer's use_cpu is set
    assert main(_unlearn(tiny_pair, tmp_path / "out", "grad_diff", "--device", "cpu")) == 2
    assert not [d for d in moves if d.startswith("cuda")], moves
    assert seen[-1].use_cpu is True
    capsys.readouterr()


def test_trainer_device_contradictions_are_refused(tiny_pair, tmp_path, monkeypatch, capsys):
    fake_cuda(monkeypatch, True, count=2)
    monkeypatch.setattr(run_path, "load_model", _no_load)
    for extra, fragment in ((("--device", "cpu", "--use_cpu", "False"), "contradicts --use_cpu False"),
                            (("--device", "cuda", "--use_cpu", "True"), "contradicts --use_cpu True"),
                            (("--device", "cuda:1"), "CUDA_VISIBLE_DEVICES=1")):
        _one_line(capsys, main(_unlearn(tiny_pair, tmp_path / "out", "grad_diff", *extra)), fragment)
    assert not (tmp_path / "out").exists()


def _no_load(*args, **kwargs):
    raise AssertionError("a model was loaded although the device was refused")


def _one_line(capsys, code, fragment):
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("hf-unlearn: error: ") and "\n" not in err and "Traceback" not in err, err
    assert fragment in err, err


def test_cuda_without_cuda_is_refused_before_any_work(tiny_pair, tmp_path, monkeypatch, capsys):
    fake_cuda(monkeypatch, False)
    monkeypatch.setattr(run_path, "load_model", _no_load)  # unlearn
    monkeypatch.setattr(eval_command, "load_model", _no_load)  # eval
    _one_line(capsys, main(_unlearn(tiny_pair, tmp_path / "out", "grom", "--device", "cuda")), "no CUDA GPU")
    assert not (tmp_path / "out").exists()
    for benchmark in ("tofu", "muse"):
        argv = ["eval", "--model", str(tiny_pair.target), "--data", "synthetic", "--benchmark", benchmark,
                "--device", "cuda:0"]
        _one_line(capsys, main(argv), "no CUDA GPU")
    _one_line(capsys, main(_unlearn(tiny_pair, tmp_path / "out", "grom", "--device", "tpu")), "Unknown device")


def test_eval_loads_the_model_and_the_original_on_the_chosen_device(tiny_pair, tmp_path, monkeypatch, moves,
                                                                    capsys):
    fake_cuda(monkeypatch, True)
    calls = []

    def stop(model, *args, **kwargs):
        calls.append(kwargs)
        raise UserError("stopped before the evaluation")

    monkeypatch.setattr("hf_unlearn.evaluation.evaluate_tofu", stop)
    argv = ["eval", "--model", str(tiny_pair.target), "--data", "synthetic", "--attacks", "relearn",
            "--attack-original", str(tiny_pair.retain)]
    # a UserError inside the evaluation is reported as a failed run (exit 1), after both loads
    assert main(argv) in (1, 2)
    assert calls and moves.count("cuda") == 2, moves
    moves.clear()
    main([*argv, "--device", "cpu"])
    assert moves.count("cpu") == 2 and not [d for d in moves if d.startswith("cuda")], moves
    capsys.readouterr()


def test_evaluate_tofu_refuses_cuda_without_cuda_before_any_model_call(tiny_target, monkeypatch):
    from hf_unlearn.evaluation import evaluate_tofu

    fake_cuda(monkeypatch, False)
    model, tokenizer = tiny_target
    monkeypatch.setattr(model, "forward", _no_load)
    with pytest.raises(ValueError, match="no CUDA GPU"):
        evaluate_tofu(model, tokenizer, source="synthetic", device="cuda", progress=False)


def test_the_device_is_recorded_in_the_log_and_the_report(tiny_pair, tmp_path, capsys):
    """On this machine (no GPU) auto is the CPU: the run's ``trained`` record and the TOFU report say so."""
    out = tmp_path / "run"
    argv = _unlearn(tiny_pair, out, "grad_diff", "--max_steps", "1", "--per_device_train_batch_size", "4",
                    "--learning_rate", "1e-5")
    assert main(argv) == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (out / "logs" / "grad_diff.jsonl").read_text().splitlines()]
    trained = [r for r in records if r.get("event") == "trained"]
    assert trained and trained[-1]["device"] == resolve_device() == "cpu"
    report_path = tmp_path / "report.json"
    assert main(["eval", "--model", str(out), "--data", "synthetic", "--max-examples", "2", "--max-new-tokens",
                 "4", "--output", str(report_path)]) == 0, capsys.readouterr().err
    assert json.loads(report_path.read_text())["settings"]["device"] == "cpu"


def test_bench_device_reaches_the_harness_and_cuda_without_cuda_is_refused(tiny_pair, tmp_path, monkeypatch, capsys):
    """``unlearn-bench run --device``: refused in one line without the GPU it names; on a CPU-only machine ``auto``
    and ``cpu`` leave the harness as it was (no device key), while on a GPU machine ``cpu`` is recorded and sent to
    every model the harness loads; a trainer asked to stay on the CPU gets ``use_cpu``, a fit is moved."""
    import argparse

    from unlearn_bench.cli import main as lab_main
    from unlearn_bench.cli_run import harness_device
    from unlearn_bench.rows import on_harness_device
    from unlearn_bench.runner import run_comparison

    import hf_unlearn.demo.tofu_tiny as tofu_tiny

    fake_cuda(monkeypatch, False)
    assert lab_main(["run", "--methods", "grom", "--no-grid", "--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("unlearn-bench: error: ") and "\n" not in err and "no CUDA GPU" in err, err
    assert harness_device(argparse.Namespace(device="auto")) == {} == harness_device(argparse.Namespace(device="cpu"))
    fake_cuda(monkeypatch, True)
    assert harness_device(argparse.Namespace(device="cpu")) == {"device": "cpu"}
    assert harness_device(argparse.Namespace(device="auto")) == {"device": "cuda"}

    asked = []

    def no_load(path, device=None):
        asked.append(device)
        raise RuntimeError("stop here")

    monkeypatch.setattr(tofu_tiny, "load_tiny", no_load)  # where the references load the pair
    with pytest.raises(RuntimeError, match="stop here"):
        run_comparison(tiny_pair, ["grom"], grid=False, source="synthetic", forget_split="forget10",
                       eval_kwargs={"device": "cuda:0"}, quantization_check=False, progress=False)
    assert asked == ["cuda:0"]

    class Model:
        def to(self, device):
            self.device = device

    model, settings = Model(), {"max_steps": 2}
    assert on_harness_device(settings, model, {"method": "npo", "device": "cpu"}) == {"max_steps": 2, "use_cpu": True}
    assert settings == {"max_steps": 2} and model.device == "cpu"
    assert on_harness_device(settings, model, {"method": "grom", "device": "cuda"}) is settings
    assert model.device == "cuda" and on_harness_device(settings, Model(), {"method": "npo"}) is settings
