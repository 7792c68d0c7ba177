"""Two CPU processes (torchrun, gloo, Accelerate MULTI_CPU) give the loss trajectory of one process with the same
global batch, and exit cleanly (process group destroyed)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

WORKER = textwrap.dedent(
    '''
    """Run a few NPO steps (reference model + retain term) and write the log history from the main process."""
    import json
    import os
    import sys

    import datasets
    import torch


    def run(model_path, out_path, batch_size):
        from hf_unlearn.data import synthetic_tofu
        from hf_unlearn.demo import load_tiny
        from hf_unlearn.methods.base import UnlearningConfig
        from hf_unlearn.methods.baselines import NPOTrainer

        datasets.disable_progress_bars()
        torch.set_num_threads(1)
        data = synthetic_tofu()
        model, tok = load_tiny(model_path)
        args = UnlearningConfig(
            output_dir=out_path + ".run", report_to="none", save_strategy="no", gradient_checkpointing=False,
            disable_tqdm=True, per_device_train_batch_size=batch_size, max_steps=3, logging_steps=1, seed=0,
            learning_rate=1e-3, retain_loss="kl", use_cpu=True,
        )
        trainer = NPOTrainer(model, args, train_dataset=data["forget10"], retain_dataset=data["retain90"][:40],
                             processing_class=tok)
        trainer.train()
        if trainer.accelerator.is_main_process:
            with open(out_path, "w") as f:
                json.dump({"history": trainer.state.log_history[:-1],
                           "distributed_type": str(trainer.accelerator.distributed_type),
                           "num_processes": trainer.accelerator.num_processes}, f)
        trainer.end_training()  # releases DDP, then destroys the process group
        rank = trainer.accelerator.process_index
        with open(f"{out_path}.rank{rank}", "w") as f:
            json.dump({"group_destroyed": not torch.distributed.is_initialized()}, f)


    if __name__ == "__main__":
        run(sys.argv[1], sys.argv[2], int(sys.argv[3]))
    '''
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_processes_match_one_process_with_the_same_global_batch(tiny_pair, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    procs = {}
    for name, launcher, batch_size in (
        ("two", [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(_free_port())], 2),
        ("one", [sys.executable], 4),  # one process, the same global batch
    ):
        log = open(tmp_path / f"{name}.log", "w")
        cmd = [*launcher, str(script), str(tiny_pair.target), str(tmp_path / f"{name}.json"), str(batch_size)]
        # own session, so that a timeout kills torchrun's workers too, not only the launcher
        popen = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        procs[name] = (popen, log)
    for name, (proc, log) in procs.items():
        try:
            proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            for other, _ in procs.values():
                if other.poll() is None:
                    os.killpg(other.pid, signal.SIGKILL)
            log.flush()
            tail = (tmp_path / f"{name}.log").read_text()[-3000:]
            pytest.fail(f"the {name}-process run did not finish within 300 s; its log ends with:\n{tail}")
        finally:
            log.close()
        assert proc.returncode == 0, (tmp_path / f"{name}.log").read_text()[-3000:]
    for rank in (0, 1):  # each process destroyed its process group before exiting
        assert json.loads((tmp_path / f"two.json.rank{rank}").read_text())["group_destroyed"]

    one = json.loads((tmp_path / "one.json").read_text())
    two_res = json.loads((tmp_path / "two.json").read_text())
    assert two_res["num_processes"] == 2 and two_res["distributed_type"].endswith("MULTI_CPU")
    assert one["num_processes"] == 1
    # loss and gradient norm are global quantities; forget_nll/retain_nll are per-process means (diagnostics)
    keys = ("loss", "grad_norm", "retain_loss", "log_ratio")
    for step_one, step_two in zip(one["history"], two_res["history"], strict=True):
        for key in keys:
            assert step_two[key] == pytest.approx(step_one[key], rel=2e-4, abs=1e-5), (key, step_one, step_two)
    losses = [h["loss"] for h in one["history"]]
    assert len(losses) == 3 and losses[-1] < losses[0]  # the run actually moves
