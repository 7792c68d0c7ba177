"""The divergence guard on objectives without a retain term, and checkpoints staged atomically across processes.

GradAscent has no retain term: given a retain set, the trainer scores its retain half without gradient and the
guard stops a run whose retain NLL explodes, before a diverged checkpoint is written, without changing the
updates of a run that does not diverge. :func:`stage_checkpoint` is exercised with two simulated ranks (threads
sharing a barrier, as the processes of a ``torchrun`` launch share ``accelerator.wait_for_everyone``).
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import datasets
import pytest
import torch
from safetensors.torch import load_file

from hf_unlearn.demo import load_tiny
from hf_unlearn.methods.base import TrainingDivergedError
from hf_unlearn.methods.base.checkpoints import stage_checkpoint
from hf_unlearn.methods.baselines import GradAscentConfig, GradAscentTrainer

datasets.disable_progress_bars()


def _config(out: Path, **overrides) -> GradAscentConfig:
    values = dict(
        output_dir=str(out), report_to="none", save_strategy="no", gradient_checkpointing=False, disable_tqdm=True,
        per_device_train_batch_size=4, max_steps=3, logging_steps=1, seed=0, learning_rate=1e-4,
    )
    values.update(overrides)
    return GradAscentConfig(**values)


@pytest.fixture()
def rows(synthetic):
    return list(synthetic["forget10"][:8]), list(synthetic["retain90"][:16])


def test_grad_ascent_at_a_huge_learning_rate_is_stopped_by_the_guard(tiny_pair, rows, tmp_path):
    forget, retain = rows
    model, tok = load_tiny(tiny_pair.target)
    args = _config(tmp_path / "out", learning_rate=1.0, max_steps=20, save_strategy="steps", save_steps=1,
                   max_retain_loss_ratio=3.0)
    trainer = GradAscentTrainer(model, args, train_dataset=forget, retain_dataset=retain, processing_class=tok)
    with pytest.raises(TrainingDivergedError) as info:
        trainer.train()
    step, value = re.search(r"at step (\d+): the retain NLL is ([0-9.e+-]+|inf|nan)", str(info.value)).groups()
    step = int(step)
    logged = [h["retain_nll"] for h in trainer.state.log_history if "retain_nll" in h]
    assert len(logged) == step - 1 and trainer.divergence_guard.reference == pytest.approx(logged[0], rel=1e-4)
    assert not float(value) <= 3.0 * max(logged[0], 0.1)
    # checkpoints stop before the diverged step, and every saved weight is finite
    saved = sorted(int(p.name.split("-")[1]) for p in (tmp_path / "out").glob("checkpoint-*"))
    assert saved == list(range(1, step))
    for n in saved:
        weights = load_file(tmp_path / "out" / f"checkpoint-{n}" / "model.safetensors")
        assert all(torch.isfinite(t).all() for t in weights.values()), n


def test_the_watched_retain_nll_does_not_change_the_updates(tiny_pair, rows, tmp_path):
    forget, retain = rows
    runs = {}
    for name, retain_rows, ratio in (("watched", retain, 100.0), ("unwatched", None, None)):
        model, tok = load_tiny(tiny_pair.target)
        trainer = GradAscentTrainer(model, _config(tmp_path / name, max_retain_loss_ratio=ratio),
                                    train_dataset=forget, retain_dataset=retain_rows, processing_class=tok)
        trainer.train()
        runs[name] = trainer
    watched, unwatched = runs["watched"], runs["unwatched"]
    assert [h["retain_nll"] for h in watched.state.log_history if "retain_nll" in h]  # the guard saw it ...
    assert not [h for h in unwatched.state.log_history if "retain_nll" in h]
    assert watched.divergence_guard.reference is not None and unwatched.divergence_guard.reference is None
    losses = [[h["loss"] for h in t.state.log_history if "loss" in h] for t in (watched, unwatched)]
    assert losses[0] == losses[1]
    # ... and the updates are those of the unwatched run: the score is taken without gradient, in eval mode, and
    # draws no random numbers; both runs do the same arithmetic, so only a different kernel path could separate
    # them (float32: rtol 1e-6)
    for (n, a), (_, b) in zip(watched.model.named_parameters(), unwatched.model.named_parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-8, msg=n)


def _two_ranks(run_dir: Path, fail_rank: int | None = None) -> tuple[dict[int, BaseException | None], list[str]]:
    """Two simulated ranks saving checkpoint-7: each writes its RNG file, the main one also the weights."""
    barrier = threading.Barrier(2, timeout=20)
    seen_during_write: list[str] = []
    errors: dict[int, BaseException | None] = {}

    def rank(index: int) -> None:
        def write(staging: Path) -> None:
            folder = staging / "checkpoint-7"
            folder.mkdir(exist_ok=True)
            if index == 0:
                (folder / "model.safetensors").write_bytes(b"weights")
            if index == fail_rank:
                barrier.abort()  # the process group breaks when a process dies
                raise OSError("No space left on device")
            (folder / f"rng_state_{index}.pth").write_bytes(b"rng %d" % index)
            # while any rank may still be writing, the checkpoint is not in the run folder
            seen_during_write.append(str(sorted(p.name for p in run_dir.iterdir() if not p.name.startswith("."))))

        try:
            stage_checkpoint(run_dir, "checkpoint-7", write, is_main_process=index == 0,
                             wait_for_everyone=barrier.wait)
            errors[index] = None
        except BaseException as exc:  # noqa: BLE001 - recorded and asserted by the test
            errors[index] = exc

    threads = [threading.Thread(target=rank, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return errors, seen_during_write


def test_a_multi_process_checkpoint_appears_only_when_every_rank_has_written(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "checkpoint-5").mkdir()  # an earlier complete checkpoint
    errors, seen = _two_ranks(run_dir)
    assert errors == {0: None, 1: None}
    assert seen == ["['checkpoint-5']", "['checkpoint-5']"]
    assert sorted(p.name for p in (run_dir / "checkpoint-7").iterdir()) == [
        "model.safetensors", "rng_state_0.pth", "rng_state_1.pth"]
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoint-5", "checkpoint-7"]  # staging removed

    # a rank that fails while writing: the main process never renames the incomplete checkpoint into place
    failed = tmp_path / "failed"
    failed.mkdir()
    errors, _ = _two_ranks(failed, fail_rank=1)
    assert isinstance(errors[1], OSError) and isinstance(errors[0], threading.BrokenBarrierError)
    assert not (failed / "checkpoint-7").exists()
    # the leftover staging folder is hidden (no resume finds it) and replaced by the next save
    from transformers.trainer_utils import get_last_checkpoint

    assert get_last_checkpoint(str(failed)) is None
    errors, _ = _two_ranks(failed)
    assert errors == {0: None, 1: None}
    assert sorted(p.name for p in failed.iterdir()) == ["checkpoint-7"]
