"""Two CPU processes (torchrun, gloo) stay in step: the command line under ``torchrun`` and an example script under
``accelerate launch``, typed as a user types them (no ``--use_cpu``: on a machine without a GPU the Trainer runs on
the CPU as one distributed run), write one output folder (rank 0 creates and swaps it, the other rank writes into
the same one), MASC's stop decision is the same on
every rank, and a non-finite loss on one rank makes every rank raise instead of leaving the others waiting.
Each launch has a timeout, so a hang fails the test instead of stalling the run. With ZeRO-3 mocked (parameters of
shape [0] carrying ds_shape): the reference model is reloaded from the folder, never copied, the vocabulary size
comes from the config, and SelectionCallback refuses sharded weights."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 300
TRAIN = ["--max_steps", "2"]
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _torchrun(args: list[str], log_path: Path, expect_ok: bool = True) -> int:
    """``torchrun --nproc_per_node 2 <args>`` (a free rendezvous port through torchrun's ``PET_MASTER_PORT``)."""
    return _launch([str(BIN / "torchrun"), "--nproc_per_node", "2", *args], log_path, expect_ok)


def _launch(cmd: list[str], log_path: Path, expect_ok: bool = True) -> int:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "PET_MASTER_PORT": str(_free_port())}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    with open(log_path, "w") as log:
        # own session, so that a timeout kills torchrun's workers too, not only the launcher
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                cwd=REPO)
        try:
            proc.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"the two-process run did not finish in {TIMEOUT_S} s (a hang):\n"
                        f"{log_path.read_text()[-3000:]}")
    if expect_ok:
        assert proc.returncode == 0, log_path.read_text()[-3000:]
    return proc.returncode


def _hidden_left(folder: Path) -> list[str]:
    """Temporary and staging folders beside or inside ``folder``."""
    beside = [p.name for p in folder.parent.iterdir() if ".tmp-" in p.name or p.name.endswith(".lock")]
    inside = [p.name for p in folder.iterdir() if p.name.startswith(".")]
    return beside + inside


def test_cli_with_step_checkpoints_writes_one_folder(tiny_pair, tmp_path):
    out = tmp_path / "run"
    _torchrun(["-m", "hf_unlearn.cli", "unlearn", "--method", "grad_diff", "--model", str(tiny_pair.target),
               "--data", "synthetic", "--output", str(out), *TRAIN, "--logging_steps", "1", "--save_strategy", "steps",
               "--save_steps", "1"],
              tmp_path / "cli.log")
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    for n in (1, 2):
        assert {"rng_state_0.pth", "rng_state_1.pth", "model.safetensors"} <= {
            p.name for p in (out / f"checkpoint-{n}").iterdir()}
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    log = [json.loads(line) for line in (out / "logs" / "grad_diff.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "loss" in r] == [1, 2]  # one writer: each step logged once
    assert _hidden_left(out) == []


def test_example_script_under_accelerate_launch_swaps_in_one_folder(tiny_pair, tmp_path):
    out = tmp_path / "script"
    _launch([str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--main_process_port", "0",
             str(REPO / "examples" / "scripts" / "grad_diff.py"), "--model_name_or_path", str(tiny_pair.target),
             "--dataset_name", "synthetic", "--output_dir", str(out), *TRAIN], tmp_path / "script.log")
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    assert _hidden_left(out) == []  # rank 1 made no temporary folder of its own, rank 0 swapped the shared one
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


MASC_WORKER = textwrap.dedent(
    '''
    """MASC with each rank training on (and probing) different forget rows; rank 1's probe always reads
    "forgotten", so that rank alone would stop at its first check."""
    import json
    import sys

    import datasets
    import torch


    def run(model_path, out_path):
        from hf_unlearn.demo import load_tiny
        from hf_unlearn.data import synthetic_tofu
        from hf_unlearn.methods.masc import MASCConfig, MASCTrainer

        datasets.disable_progress_bars()
        torch.set_num_threads(1)
        rank = int(__import__("os").environ["RANK"])
        data = synthetic_tofu()
        rows = list(data["forget10"])
        forget = rows[rank::2]
        model, tok = load_tiny(model_path)
        args = MASCConfig(
            output_dir=out_path + ".run", report_to="none", save_strategy="no", gradient_checkpointing=False,
            disable_tqdm=True, per_device_train_batch_size=2, max_steps=6, logging_steps=1, seed=0,
            learning_rate=1e-3, use_cpu=True, check_every=2, recipe="llama2-7b", use_peft=False,
            forget_weight=1.0, retain_weight=0.0, continuation_min_prefix_tokens=4,
            continuation_min_suffix_tokens=4, confirm_rule="mean",
        )
        trainer = MASCTrainer(model, args, train_dataset=forget, processing_class=tok)
        if rank == 1:
            probe = trainer.stopping_callback.probe

            def forgotten(model, stage, step):
                found = probe(model, stage, step)
                return (0, 1) if stage == "heldout" else [0.0 for _ in found]

            trainer.stopping_callback.probe = forgotten
        trainer.train()
        cb = trainer.stopping_callback
        with open(f"{out_path}.rank{rank}", "w") as f:
            json.dump({"step": trainer.state.global_step, "stopped_at_step": cb.stopped_at_step,
                       "history": cb.violation_history}, f)
        trainer.end_training()


    if __name__ == "__main__":
        run(sys.argv[1], sys.argv[2])
    '''
)


def test_masc_ranks_stop_at_the_same_step(tiny_pair, tmp_path):
    script = tmp_path / "masc_worker.py"
    script.write_text(MASC_WORKER)
    out = tmp_path / "masc"
    _torchrun([str(script), str(tiny_pair.target), str(out)], tmp_path / "masc.log")
    ranks = [json.loads(Path(f"{out}.rank{r}").read_text()) for r in (0, 1)]
    assert ranks[0]["step"] == ranks[1]["step"]
    assert ranks[0]["stopped_at_step"] == ranks[1]["stopped_at_step"]
    checks = [h for h in ranks[1]["history"] if h.get("check")]
    assert checks and checks[0]["violation_rate"] == 0.0  # rank 1 alone would have stopped at its first check
    if ranks[0]["stopped_at_step"] != checks[0]["step"]:  # rank 0 decided otherwise, and rank 1 followed it
        assert checks[0]["confirmed"] is True and checks[0]["main_process_decision"] is False


NAN_WORKER = textwrap.dedent(
    '''
    """GradDiff whose loss turns NaN at step 2 on rank 1 only; each rank records the error it raised."""
    import json
    import os
    import sys

    import datasets
    import torch


    def run(model_path, out_path):
        from hf_unlearn.demo import load_tiny
        from hf_unlearn.data import synthetic_tofu
        from hf_unlearn.methods.baselines import GradDiffConfig, GradDiffTrainer

        class NaNOnRankOne(GradDiffTrainer):
            def compute_unlearning_loss(self, model, inputs, denominators):
                loss = super().compute_unlearning_loss(model, inputs, denominators)
                if os.environ["RANK"] == "1" and self.state.global_step >= 1:
                    loss = loss * float("nan")
                return loss

        datasets.disable_progress_bars()
        torch.set_num_threads(1)
        rank = int(os.environ["RANK"])
        data = synthetic_tofu()
        model, tok = load_tiny(model_path)
        args = GradDiffConfig(
            output_dir=out_path + ".run", report_to="none", save_strategy="no", gradient_checkpointing=False,
            disable_tqdm=True, per_device_train_batch_size=2, max_steps=4, logging_steps=1, seed=0,
            learning_rate=1e-3, use_cpu=True,
        )
        trainer = NaNOnRankOne(model, args, train_dataset=list(data["forget10"][:8]),
                               retain_dataset=list(data["retain90"][:16]), processing_class=tok)
        try:
            trainer.train()
            error = None
        except Exception as exc:
            error = [type(exc).__name__, str(exc)]
        with open(f"{out_path}.rank{rank}", "w") as f:
            json.dump({"error": error, "step": trainer.state.global_step}, f)
        if error is not None:
            raise SystemExit(3)


    if __name__ == "__main__":
        run(sys.argv[1], sys.argv[2])
    '''
)


def test_nan_on_one_rank_stops_every_rank(tiny_pair, tmp_path):
    script = tmp_path / "nan_worker.py"
    script.write_text(NAN_WORKER)
    out = tmp_path / "nan"
    rc = _torchrun([str(script), str(tiny_pair.target), str(out)], tmp_path / "nan.log", expect_ok=False)
    assert rc != 0
    ranks = [json.loads(Path(f"{out}.rank{r}").read_text()) for r in (0, 1)]
    assert [r["error"][0] for r in ranks] == ["NonFiniteLossError", "NonFiniteLossError"], ranks
    assert "on another process" in ranks[0]["error"][1] and "on another process" not in ranks[1]["error"][1]
    assert ranks[0]["step"] == ranks[1]["step"] == 1


# ----- partitioned weights (DeepSpeed ZeRO-3 mocked: every parameter a shape-[0] tensor carrying ds_shape) --------


def _zero3(model):
    for p in model.parameters():
        shape = tuple(p.shape)
        p.data = p.data.new_empty(0)
        p.ds_shape = shape
    return model


def _reference_stub(model):
    """What ``UnlearningTrainer._create_reference_model`` reads of a trainer, without building one."""
    import functools
    from types import SimpleNamespace

    from hf_unlearn.methods.base.trainer import UnlearningTrainer

    stub = SimpleNamespace(
        model=model, is_deepspeed_enabled=False, is_fsdp_enabled=False,
        args=SimpleNamespace(model_init_kwargs=None, distributed_state=SimpleNamespace(distributed_type="NO")),
        accelerator=SimpleNamespace(unwrap_model=lambda m: m, prepare_model=lambda m, evaluation_mode: m),
    )
    stub._reload_reference = functools.partial(UnlearningTrainer._reload_reference, stub)
    return functools.partial(UnlearningTrainer._create_reference_model, stub)


def test_vocab_size_comes_from_the_config_when_the_head_is_partitioned(tiny_target):
    from hf_unlearn.partitioning import is_partitioned, vocab_size

    model, _ = tiny_target
    rows = model.get_output_embeddings().weight.shape[0]
    assert vocab_size(model) == rows and not is_partitioned(model)
    model.config.vocab_size = rows + 7  # told apart from ds_shape: the config is read first
    _zero3(model)
    assert is_partitioned(model) and model.get_output_embeddings().weight.shape == (0,)
    assert vocab_size(model) == rows + 7
    model.config.__dict__["vocab_size"] = None  # a config that does not say (past the config's own validation)
    assert vocab_size(model) == rows  # ZeRO-3's ds_shape when the config does not say


def test_zero3_reference_is_reloaded_from_the_path_not_copied(tiny_pair, monkeypatch):
    import torch

    import hf_unlearn.methods.base.reference as reference_module
    from hf_unlearn.demo import load_tiny

    def no_copy(model):
        raise AssertionError("a partitioned model was deep-copied")

    monkeypatch.setattr(reference_module, "independent_copy", no_copy)
    model, _ = load_tiny(tiny_pair.target)
    model.config._name_or_path = str(tiny_pair.target)
    _zero3(model)
    ref = _reference_stub(model)(None)
    fresh, _ = load_tiny(tiny_pair.target)
    assert not ref.training and not any(p.requires_grad for p in ref.parameters())
    for (name, got), (_, want) in zip(ref.state_dict().items(), fresh.state_dict().items(), strict=True):
        assert torch.equal(got, want), name

    model.config._name_or_path = "not-a-folder"  # no path to reload from: refused, naming ref_model=
    with pytest.raises(ValueError, match="ref_model="):
        _reference_stub(model)(None)
    given, _ = load_tiny(tiny_pair.target)
    assert _reference_stub(model)(None, given) is given


def test_reference_of_a_model_changed_in_memory_is_a_copy_of_it(tiny_pair):
    import torch

    from hf_unlearn.demo import load_tiny

    model, _ = load_tiny(tiny_pair.target)
    model.config._name_or_path = str(tiny_pair.target)
    same = _reference_stub(model)(None)  # unchanged since loaded: reloaded, equal to it
    assert same is not model and all(torch.equal(a, b) for a, b in zip(same.parameters(), model.parameters()))
    with torch.no_grad():
        next(model.parameters()).add_(1.0)  # changed in memory: the reload differs, so the live model is copied
    ref = _reference_stub(model)(None)
    assert all(torch.equal(a, b) for a, b in zip(ref.parameters(), model.parameters()))
    assert ref.get_input_embeddings().weight.data_ptr() != model.get_input_embeddings().weight.data_ptr()


def test_selection_callback_refuses_sharded_weights(tiny_target):
    from types import SimpleNamespace

    from hf_unlearn.selection import SelectionCallback

    model, _ = tiny_target
    SelectionCallback._check_not_sharded(SimpleNamespace(fsdp=""), model)  # DDP / one process: accepted
    with pytest.raises(ValueError, match="FSDP"):
        SelectionCallback._check_not_sharded(SimpleNamespace(fsdp="full_shard"), model)
    with pytest.raises(ValueError, match="ZeRO-3"):
        SelectionCallback._check_not_sharded(SimpleNamespace(fsdp=""), _zero3(model))


SWAP_WORKER = textwrap.dedent(
    '''
    """Both ranks build one folder with atomic_directory(all_ranks=True); with "fail", rank 1 raises inside."""
    import json
    import os
    import sys
    from pathlib import Path

    from hf_unlearn.safe_output import atomic_directory


    def run(out, mode):
        rank = int(os.environ["RANK"])
        try:
            with atomic_directory(out, all_ranks=True) as work:
                (Path(work) / f"part{rank}.txt").write_text(str(work))
                if mode == "fail" and rank == 1:
                    raise ValueError("rank 1 failed")
            error = None
        except Exception as exc:
            error = type(exc).__name__
        with open(f"{out}.{mode}.rank{rank}", "w") as f:
            json.dump({"error": error}, f)


    if __name__ == "__main__":
        run(sys.argv[1], sys.argv[2])
        import torch.distributed as dist

        if dist.is_initialized():  # a clean shutdown: no gloo thread left running at interpreter exit
            dist.barrier()
            dist.destroy_process_group()
    '''
)


def test_a_rank_failing_inside_the_shared_folder_fails_every_rank(tmp_path):
    script = tmp_path / "swap_worker.py"
    script.write_text(SWAP_WORKER)
    out = tmp_path / "out"
    _torchrun([str(script), str(out), "ok"], tmp_path / "ok.log")
    assert sorted(p.name for p in out.iterdir()) == ["part0.txt", "part1.txt"]
    assert (out / "part0.txt").read_text() == (out / "part1.txt").read_text()  # one folder, shared by both
    failed = tmp_path / "failed"
    _torchrun([str(script), str(failed), "fail"], tmp_path / "fail.log")
    errors = [json.loads(Path(f"{failed}.fail.rank{r}").read_text())["error"] for r in (0, 1)]
    assert errors == ["OutputWriteError", "ValueError"]
    assert not failed.exists()
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name or p.name.endswith(".lock")] == []
