"""Exact resume from any step, and resumes of another run refused.

A run interrupted in the middle of a later epoch (epoch 3 of 3-step epochs) and resumed gives the weights of an
uninterrupted run: the retain pairing of the resumed epoch is restored with the data position. A checkpoint is
only resumed by the run that wrote it: another method, other settings or other rows are refused before any work.
"""

from __future__ import annotations

from pathlib import Path

import datasets
import pytest
import torch
from transformers import TrainerCallback

from hf_unlearn.demo import load_tiny
from hf_unlearn.methods.base.checkpoints import FINGERPRINT_NAME, ResumeMismatchError
from hf_unlearn.methods.baselines import GradDiffConfig, GradDiffTrainer, NPOTrainer

datasets.disable_progress_bars()

# 10 forget rows in batches of 4: 3 optimizer steps per epoch, so step 10 is the first step of epoch 3
FORGET_ROWS, RETAIN_ROWS, BATCH, MAX_STEPS, CHECKPOINT, KILL_AT = 10, 16, 4, 13, 10, 11


class _Interrupted(Exception):
    pass


class _InterruptAt(TrainerCallback):
    """Raises after optimizer step ``step`` (its checkpoint, if any, is not written): a crash or Ctrl-C."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise _Interrupted(f"interrupted at step {self.step}")


class _Epochs(TrainerCallback):
    """Records the pairing epoch of the training set at each optimizer step."""

    def __init__(self):
        self.trainer = None
        self.seen: list[tuple[int, int]] = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.seen.append((state.global_step + 1, self.trainer.train_dataset.epoch))


def _config(out: Path, **overrides) -> GradDiffConfig:
    values = dict(
        output_dir=str(out), report_to="none", save_strategy="steps", save_steps=2, gradient_checkpointing=False,
        disable_tqdm=True, per_device_train_batch_size=BATCH, max_steps=MAX_STEPS, logging_steps=1, seed=0,
        learning_rate=1e-3,
    )
    values.update(overrides)
    return GradDiffConfig(**values)


def _params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.fixture()
def rows(synthetic):
    return list(synthetic["forget10"][:FORGET_ROWS]), list(synthetic["retain90"][:RETAIN_ROWS])


def test_resume_in_a_later_epoch_equals_the_uninterrupted_run(tiny_pair, rows, tmp_path):
    forget, retain = rows

    def make(out: Path, *callbacks, cls=GradDiffTrainer, **overrides):
        model, tok = load_tiny(tiny_pair.target)
        trainer = cls(model, _config(out, **overrides), train_dataset=forget, retain_dataset=retain,
                      processing_class=tok, callbacks=list(callbacks))
        for cb in callbacks:
            if isinstance(cb, _Epochs):
                cb.trainer = trainer
        return trainer

    straight_epochs = _Epochs()
    straight = make(tmp_path / "straight", straight_epochs)
    straight.train()
    expected = _params(straight.model)
    # the straight run pairs step s with epoch (s - 1) // 3
    assert straight_epochs.seen == [(s, (s - 1) // 3) for s in range(1, MAX_STEPS + 1)]

    run = tmp_path / "resumed"
    killed = make(run, _InterruptAt(KILL_AT))
    with pytest.raises(_Interrupted):
        killed.train()
    latest = sorted((p for p in run.glob("checkpoint-*")), key=lambda p: int(p.name.split("-")[1]))[-1]
    assert latest.name == f"checkpoint-{CHECKPOINT}" and (latest / FINGERPRINT_NAME).is_file()

    resumed_epochs = _Epochs()
    resumed = make(run, resumed_epochs)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == MAX_STEPS
    got = _params(resumed.model)
    worst = max((got[n] - expected[n]).abs().max().item() for n in expected)
    # same seed, same process, CPU: training is bit-exact by design, so the resumed weights equal the straight ones
    assert all(torch.equal(got[n], expected[n]) for n in expected), f"max weight difference {worst}"
    # it continued from checkpoint-10, mid-epoch 3, with epoch 3's retain partners
    assert resumed_epochs.seen == [(s, (s - 1) // 3) for s in range(CHECKPOINT + 1, MAX_STEPS + 1)]


def test_resume_of_another_method_settings_or_data_is_refused_before_work(tiny_pair, rows, tmp_path):
    forget, retain = rows
    run = tmp_path / "run"
    model, tok = load_tiny(tiny_pair.target)
    killed = GradDiffTrainer(model, _config(run, max_steps=4), train_dataset=forget, retain_dataset=retain,
                             processing_class=tok, callbacks=[_InterruptAt(3)])
    with pytest.raises(_Interrupted):
        killed.train()
    saved = {p.name: p.stat().st_mtime_ns for p in run.rglob("*")}

    def resume(cls=GradDiffTrainer, forget_rows=forget, retain_rows=retain, **overrides):
        fresh, _ = load_tiny(tiny_pair.target)
        before = _params(fresh)
        trainer = cls(fresh, _config(run, **{"max_steps": 4, **overrides}), train_dataset=forget_rows,
                      retain_dataset=retain_rows, processing_class=tok)
        with pytest.raises(ResumeMismatchError) as info:
            trainer.train(resume_from_checkpoint=True)
        after = _params(fresh)
        assert all(torch.equal(after[n], before[n]) for n in before)  # nothing trained
        assert {p.name: p.stat().st_mtime_ns for p in run.rglob("*")} == saved  # nothing written
        message = str(info.value)
        assert "\n" not in message and "checkpoint-2" in message
        return message

    assert "learning_rate=0.001 (now 0.003)" in resume(learning_rate=3e-3)
    assert "lr_scheduler_type='linear' (now 'cosine')" in resume(lr_scheduler_type="cosine")
    assert "per_device_train_batch_size=4 (now 2)" in resume(per_device_train_batch_size=2)
    assert "seed=0 (now 1)" in resume(seed=1)
    assert "weight_decay=0.01 (now 0.0)" in resume(weight_decay=0.0)
    assert "method hf_unlearn.methods.baselines.trainer.GradDiffTrainer (now hf_unlearn.methods.baselines.trainer.NPOTrainer)" in (
        resume(cls=NPOTrainer))
    assert "other retain rows" in resume(retain_rows=retain[::-1])
    assert "other forget rows" in resume(forget_rows=forget[:9])
    # the same settings and rows resume; the logging and saving settings may differ, and the run may be extended
    fresh, _ = load_tiny(tiny_pair.target)
    ok = GradDiffTrainer(fresh, _config(run, max_steps=6, logging_steps=3, save_steps=3), train_dataset=forget,
                         retain_dataset=retain, processing_class=tok)
    ok.train(resume_from_checkpoint=True)
    assert ok.state.global_step == 6
