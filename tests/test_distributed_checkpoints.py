"""Two CPU processes (torchrun, gloo) write each checkpoint through one staging folder that the main process renames
into place once every rank has written: each checkpoint holds both ranks' RNG states and the run fingerprint, no
staging folder is left, and an interrupted two-process run resumes from its latest checkpoint."""

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

WORKER = textwrap.dedent(
    '''
    """GradDiff, 3 steps, a checkpoint per step; phase "first" stops after step 2, phase "resume" resumes."""
    import json
    import sys

    import datasets
    import torch
    from transformers import TrainerCallback


    class Interrupted(Exception):
        pass


    class StopAt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                raise Interrupted("step 2")


    def run(model_path, out_dir, phase):
        from hf_unlearn.demo import load_tiny
        from hf_unlearn.data import synthetic_tofu
        from hf_unlearn.methods.baselines import GradDiffConfig, GradDiffTrainer

        datasets.disable_progress_bars()
        torch.set_num_threads(1)
        data = synthetic_tofu()
        model, tok = load_tiny(model_path)
        args = GradDiffConfig(
            output_dir=out_dir, report_to="none", save_strategy="steps", save_steps=1, gradient_checkpointing=False,
            disable_tqdm=True, per_device_train_batch_size=2, max_steps=3, logging_steps=1, seed=0,
            learning_rate=1e-3, use_cpu=True,
        )
        trainer = GradDiffTrainer(model, args, train_dataset=list(data["forget10"][:8]),
                                  retain_dataset=list(data["retain90"][:16]), processing_class=tok,
                                  callbacks=[StopAt()] if phase == "first" else [])
        try:
            trainer.train(resume_from_checkpoint=True if phase == "resume" else None)
            status = "done"
        except Interrupted:
            status = "interrupted"
        rank = trainer.accelerator.process_index
        with open(f"{out_dir}.{phase}.rank{rank}", "w") as f:
            json.dump({"status": status, "step": trainer.state.global_step,
                       "reference": trainer.divergence_guard.reference}, f)
        trainer.end_training()


    if __name__ == "__main__":
        run(sys.argv[1], sys.argv[2], sys.argv[3])
    '''
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _torchrun(script: Path, model: Path, out: Path, phase: str, log_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
           str(_free_port()), str(script), str(model), str(out), phase]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"the two-process {phase} run did not finish in 300 s:\n{log_path.read_text()[-3000:]}")
    assert proc.returncode == 0, log_path.read_text()[-3000:]


def test_two_process_checkpoints_are_complete_and_resumable(tiny_pair, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = tmp_path / "run"
    _torchrun(script, tiny_pair.target, out, "first", tmp_path / "first.log")
    first = [json.loads(Path(f"{out}.first.rank{r}").read_text()) for r in (0, 1)]
    assert [f["status"] for f in first] == ["interrupted", "interrupted"]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1"]  # step 2 stopped before its save
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no staging folder left
    files = {p.name for p in (out / "checkpoint-1").iterdir()}
    assert {"rng_state_0.pth", "rng_state_1.pth", "unlearning_run.json", "trainer_state.json",
            "model.safetensors", "optimizer.pt"} <= files
    assert not (tmp_path / "run.lock").exists()  # the main process released its lock

    _torchrun(script, tiny_pair.target, out, "resume", tmp_path / "resume.log")
    resumed = [json.loads(Path(f"{out}.resume.rank{r}").read_text()) for r in (0, 1)]
    assert [(r["status"], r["step"]) for r in resumed] == [("done", 3), ("done", 3)]
    assert resumed[0]["reference"] == first[0]["reference"] is not None  # the guard's reference came back
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    for n in (2, 3):
        assert {"rng_state_0.pth", "rng_state_1.pth"} <= {p.name for p in (out / f"checkpoint-{n}").iterdir()}
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]
