"""What the commands of ``hf-unlearn`` share."""

from __future__ import annotations

import argparse
import os
import typing
from typing import Any

from ..options import RunFailure, UserError
from ..registry import get_method

#: Environment variable naming a local folder of TOFU ``<config>.jsonl`` files: the default of ``--data``.
TOFU_DIR_ENV = "HF_UNLEARN_TOFU_DIR"
DATA_HELP = (f"TOFU source: a local folder of <config>.jsonl files, 'synthetic', or a Hub dataset id (default: "
             f"${TOFU_DIR_ENV} when set, else the Hub dataset locuslab/TOFU)")
AUTOCAST_CHOICES = ["none", "bfloat16", "float16"]
"""``--autocast-dtype`` / ``--eval-autocast`` values: ``evaluate_tofu``'s ``autocast_dtype`` options, ``none`` for ``None``."""
RETAIN_REFERENCE_HELP = (
    "the retain model's numbers for forget quality: our report or saved truth ratios, open-unlearning's "
    "TOFU_EVAL.json, or TOFU's eval_log_forget.json (or its results folder)"
)


class ArgumentParser(argparse.ArgumentParser):
    """argparse that raises :class:`~hf_unlearn.options.UserError` (one line) instead of exiting."""

    def error(self, message: str) -> typing.NoReturn:
        raise UserError(message)


def default_data_source() -> str:
    """``--data`` when not given: ``$HF_UNLEARN_TOFU_DIR`` when set, else the Hub id ``locuslab/TOFU``."""
    from ..data import TOFU_HUB_ID

    if not (folder := os.environ.get(TOFU_DIR_ENV, "").strip()):
        return TOFU_HUB_ID
    if not os.path.isdir(os.path.expanduser(folder)):
        raise UserError(f"{TOFU_DIR_ENV}={folder} is not a folder; point it at a folder of TOFU <config>.jsonl files, "
                        "or unset it to use the Hub dataset.")
    return os.path.expanduser(folder)


def autocast_dtype(choice: str | None, default: str | None = None) -> str | None:
    """``evaluate_tofu``'s ``autocast_dtype`` from a CLI choice."""
    choice = default if choice is None else choice
    return None if choice in (None, "none") else choice


def resolve_cli_device(args: argparse.Namespace, method: str | None = None,
                       settings: dict[str, Any] | None = None) -> str:
    """``--device`` resolved, refused in one line before any work. A trainer runs on the Trainer's device:
    ``--device cpu`` on a CUDA machine sets ``use_cpu``; a contradicting ``--use_cpu`` or another GPU is refused."""
    from ..devices import resolve_device

    try:
        device = resolve_device(args.device)
    except ValueError as err:
        raise UserError(str(err)) from None
    if settings is None or not get_method(method).is_trainer:
        return device
    use_cpu = settings.get("use_cpu")
    if device == "cpu":
        if use_cpu is False:
            raise UserError("--device cpu contradicts --use_cpu False; pass one of them.")
        if use_cpu is None and device != resolve_device(None):  # a GPU machine asked to stay on the CPU
            settings["use_cpu"] = True
        return device
    if use_cpu:
        raise UserError(f"--device {args.device} contradicts --use_cpu True; pass one of them.")
    trainer_gpu = f"cuda:{os.environ.get('LOCAL_RANK', '0')}"
    if ":" in device and device != trainer_gpu:
        raise UserError(f"--device {device}: {method} trains on the Trainer's GPU ({trainer_gpu} in this process); "
                        f"choose the GPU with CUDA_VISIBLE_DEVICES={device.split(':')[1]} and --device cuda.")
    return device


def in_phase(say: Any, label: str, phase: str, work: Any, note: Any = lambda result: "") -> Any:
    """``work()`` as one progress line of ``say`` (a ``PhaseReporter``); a failure is a :class:`RunFailure`
    naming the phase."""
    say.start(label, phase)
    try:
        result = work()
    except Exception as err:
        raise RunFailure(say.fail(err), printed=True) from err
    say.done(note(result))
    return result


def tiny_pair(build: Any, source: str, split: str, recipe: Any, cache_dir: str | None) -> Any:
    """The TOFU-tiny pair from ``build`` (:func:`hf_unlearn.demo.build_tiny_pair`), with one progress line."""
    from ..console import PhaseReporter

    say = PhaseReporter()
    say.start("tiny models", "preparing")
    pair = build(source, split, recipe, cache_dir=cache_dir, progress=False)
    say.done("cached after the first run")
    return pair


def report_failures(results: dict[str, Any]) -> int:
    """Exit status of a comparison: 1 when a method failed."""
    return 1 if any(r.get("error") for r in results["rows"].values()) else 0
