"""Checkpoints of an unlearning run: the staged, atomic write from every process, and the run fingerprint that a
resume is checked against."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from datasets import Dataset
from transformers import TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ...safe_output import OutputWriteError, atomic_directory, gated_path
from .pairing import MODEL_COLUMNS

# entries of a run folder kept when the final model is swapped in
RUN_ENTRIES = (f"{PREFIX_CHECKPOINT_DIR}-*", "runs", "logs", "README.md")  # logs: the CLI's per-step JSON Lines
TRAINER_STATE_NAME = "trainer_state.json"
# the run's identity (method, settings, data digests) in every checkpoint, checked on resume
FINGERPRINT_NAME = "unlearning_run.json"
# what the command line asked a checkpointing run to do, in logs/ (hf_unlearn.preconditions.check_resume_request)
RUN_REQUEST_NAME = "run_request.json"


class ResumeMismatchError(ValueError):
    """A checkpoint was written by another method, other settings or other data than the trainer resuming it."""


def _checkpoint_dirs(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return [p for p in folder.glob(f"{PREFIX_CHECKPOINT_DIR}-*") if p.is_dir() and p.name.split("-")[-1].isdigit()]


def stage_checkpoint(
    run_dir: str | os.PathLike, name: str, write: Callable[[Path], None], is_main_process: bool = True,
    wait_for_everyone: Callable[[], None] = lambda: None,
) -> Path:
    """Write the checkpoint ``run_dir/name`` from every process (``write(staging)``) into one staging folder that
    the main process renames into place once all have written (barriers: ``wait_for_everyone``), so ``run_dir``
    only ever holds complete checkpoints."""
    run_dir = gated_path(run_dir)
    staging = run_dir / f".{name}.staging"
    if is_main_process:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    wait_for_everyone()
    try:
        write(staging)
    except BaseException:
        if is_main_process:
            shutil.rmtree(staging, ignore_errors=True)
        raise
    wait_for_everyone()
    if is_main_process:
        try:
            if not (staging / name).is_dir():
                raise OutputWriteError(f"The checkpoint {name} was not written into {staging}.")
            with atomic_directory(run_dir / name, overwrite=True, lock=False) as tmp:
                tmp.rmdir()
                os.replace(staging / name, tmp)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    wait_for_everyone()
    return run_dir / name


# settings that do not change the weights a run produces up to a step: a resume may change them
_UNTRACKED_SETTINGS = frozenset({
    "max_steps", "num_train_epochs", "output_dir", "overwrite", "overwrite_output_dir", "run_name", "report_to", "project", "push_to_hub",
    "resume_from_checkpoint", "disable_tqdm", "local_rank", "ddp_timeout", "use_cpu", "skip_memory_metrics",
    "torch_empty_cache_steps", "debug", "dataset_num_proc", "restore_callback_states_from_checkpoint",
    "per_device_eval_batch_size", "do_eval", "do_predict", "do_train", "prediction_loss_only", "batch_eval_metrics",
    "include_for_metrics", "include_num_input_tokens_seen", "metric_for_best_model", "greater_is_better",
    "load_best_model_at_end", "bf16_full_eval", "fp16_full_eval", "ignore_data_skip", "enable_jit_checkpoint",
    "max_retain_loss_ratio", "min_retain_loss_reference", "eos_token", "pad_token",
})
_UNTRACKED_PREFIXES = (
    "logging_", "log_", "save_", "eval_", "hub_", "trackio_", "activation_checkpointing", "activation_offloading",
    "gradient_checkpointing", "dataloader_num_workers", "dataloader_pin_memory", "dataloader_persistent_workers",
    "dataloader_prefetch_factor", "dataloader_multiprocessing_context",
)


def _tracked_settings(args: TrainingArguments) -> dict[str, Any]:
    values = {
        k: v for k, v in args.to_dict().items()
        if k not in _UNTRACKED_SETTINGS and not k.startswith(_UNTRACKED_PREFIXES)
    }
    return json.loads(json.dumps(values, sort_keys=True, default=repr))


def _rows_digest(dataset: Any) -> str | None:
    """SHA-256 of a prepared dataset's tokens and labels, ``None`` when it is not a ``datasets.Dataset``."""
    if not isinstance(dataset, Dataset):
        return None
    columns = [c for c in MODEL_COLUMNS if c in dataset.column_names] or list(dataset.column_names)
    rows = dataset.select_columns(columns).with_format(None)[:]
    digest = hashlib.sha256()
    digest.update(json.dumps(rows, sort_keys=True, default=repr).encode("utf-8"))
    return f"{len(dataset)}:{digest.hexdigest()}"


def fingerprint_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """What differs between two run fingerprints (:func:`run_fingerprint`), one phrase each."""
    diffs = []
    if saved.get("method") != current.get("method"):
        diffs.append(f"method {saved.get('method')} (now {current.get('method')})")
    old, new = saved.get("settings", {}), current.get("settings", {})
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key):
            diffs.append(f"{key}={old.get(key)!r} (now {new.get(key)!r})")
    for part in ("forget", "retain"):
        a, b = saved.get("data", {}).get(part), current.get("data", {}).get(part)
        if a != b and a is not None and b is not None:
            diffs.append(f"other {part} rows ({a.split(':')[0]} rows, now {b.split(':')[0]})")
        elif (a is None) != (b is None):
            diffs.append(f"{'no' if a is None else 'a'} {part} set (now {'a' if a is None else 'no'} {part} set)")
    return diffs


def run_fingerprint(method: type, args: TrainingArguments, forget: Any, retain: Any) -> dict[str, Any]:
    """What a resuming trainer must match: the method, the settings that change the weights, and the digests of
    the prepared forget and retain rows."""
    return {
        "method": f"{method.__module__}.{method.__qualname__}", "settings": _tracked_settings(args),
        "data": {"forget": _rows_digest(forget), "retain": _rows_digest(retain)},
    }


def check_resume(checkpoint: Path, fingerprint: dict[str, Any]) -> None:
    """Refuse (:class:`ResumeMismatchError`) a checkpoint whose saved run fingerprint differs from ``fingerprint``;
    warn when it records none."""
    saved_file = checkpoint / FINGERPRINT_NAME
    if not saved_file.is_file():
        warnings.warn(
            f"{checkpoint} records no run fingerprint ({FINGERPRINT_NAME}); it cannot be checked to belong to "
            "this method, these settings and this data.", stacklevel=3,
        )
        return
    try:
        saved = json.loads(saved_file.read_text())
    except ValueError as exc:
        raise ResumeMismatchError(f"Cannot resume from {checkpoint}: {saved_file} is not valid JSON ({exc}).") from None
    diffs = fingerprint_differences(saved, fingerprint)
    if diffs:
        shown = "; ".join(diffs[:6]) + (f"; and {len(diffs) - 6} more" if len(diffs) > 6 else "")
        raise ResumeMismatchError(
            f"Cannot resume from {checkpoint}: it was written by another run ({shown}). Resume with the "
            "checkpoint's method, settings and data, or start afresh in another folder (or with overwrite)."
        )
