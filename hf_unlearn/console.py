"""What a command-line run prints: one line per method and phase (:class:`PhaseReporter`), JSON Lines event logs,
and :func:`quiet_console`, which hides third-party log noise (the CLI calls it; importing ``hf_unlearn`` never does)."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any, TextIO

from .safe_output import append_text

#: Third-party packages whose log messages, progress bars and warnings :func:`quiet_console` hides.
THIRD_PARTY = ("transformers", "trl", "peft", "accelerate", "bitsandbytes", "datasets", "huggingface_hub", "torch")


class PhaseReporter:
    """Prints ``<label> <phase> ...`` then ``done`` and the duration, or ``FAILED``, the error and the log."""

    def __init__(self, enabled: bool = True, stream: TextIO | None = None, inline: bool = True):
        self.enabled = enabled
        self.stream = stream
        self.inline = inline
        self._open: tuple[str, str, float] | None = None

    def _write(self, text: str) -> None:
        stream = self.stream or sys.stdout
        stream.write(text)
        stream.flush()

    def _head(self, label: str, phase: str) -> str:
        return f"{label:<16} {phase:<13}"

    def start(self, label: str, phase: str) -> None:
        """Begin a phase (closing any phase left open)."""
        if self._open is not None:
            self.done()
        self._open = (label, phase, time.perf_counter())
        if self.enabled and self.inline:
            self._write(self._head(label, phase) + " ...")

    def done(self, note: str = "") -> None:
        if self._open is None:
            return
        label, phase, start = self._open
        self._open = None
        if not self.enabled:
            return
        text = f" done {time.perf_counter() - start:7.1f} s" + (f"  {note}" if note else "")
        self._write((text if self.inline else self._head(label, phase) + " ..." + text) + "\n")

    def fail(self, error: BaseException | str, log_path: str | os.PathLike | None = None,
             phase: str | None = None) -> str:
        """End the open phase with a failure line naming the label, the phase and the log; return it."""
        label, open_phase, _ = self._open or ("", "", 0.0)
        phase = phase or open_phase
        self._open = None
        reason = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        reason = " ".join(str(reason).split())[:300]
        where = f" (log: {log_path})" if log_path else ""
        if self.enabled:
            tail = f" FAILED: {reason}{where}\n"
            self._write(tail if self.inline else self._head(label, phase) + " ..." + tail)
        return f"{label} failed during {phase}: {reason}{where}"


def log_event(path: str | os.PathLike | None, event: str, **fields: Any) -> None:
    """Append one ``{"event": ...}`` record to the JSON Lines log at ``path`` (no-op when ``None``)."""
    if path is None:
        return
    record = {"event": event, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), **fields}
    append_text(path, json.dumps(record, default=str) + "\n")


def log_exception(path: str | os.PathLike | None, phase: str, error: BaseException) -> None:
    """Append the failure of ``phase`` with its traceback to the log at ``path``."""
    log_event(path, "error", phase=phase, error=f"{type(error).__name__}: {error}",
              traceback="".join(traceback.format_exception(type(error), error, error.__traceback__)))


def quiet_console(verbose: bool = False) -> Callable[[], None]:
    """Silence third-party log messages (below ERROR, or WARNING with ``verbose``), progress bars and warnings
    for a CLI run; returns a function that restores the previous state."""
    import datasets
    import transformers
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    level = logging.WARNING if verbose else logging.ERROR
    saved_levels = {name: logging.getLogger(name).level for name in THIRD_PARTY}
    saved_filters = list(warnings.filters)
    saved = (transformers.utils.logging.get_verbosity(), transformers.utils.logging.is_progress_bar_enabled(),
             datasets.utils.logging.get_verbosity(), datasets.is_progress_bar_enabled(), are_progress_bars_disabled())

    def drop(record: logging.LogRecord) -> bool:
        return "Failed to load CPU gemm_4bit_forward" not in record.getMessage()

    for name in THIRD_PARTY:
        logging.getLogger(name).setLevel(level)
    for name in ("bitsandbytes", "bitsandbytes.backends.cpu.ops"):
        logging.getLogger(name).addFilter(drop)
    pattern = r"^(" + "|".join(THIRD_PARTY) + r")(\.|$)"
    for category in (FutureWarning, DeprecationWarning, UserWarning):
        warnings.filterwarnings("ignore", category=category, module=pattern)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    transformers.utils.logging.set_verbosity(level)
    transformers.utils.logging.disable_progress_bar()
    datasets.utils.logging.set_verbosity(level)
    datasets.disable_progress_bars()
    disable_progress_bars()

    def restore() -> None:
        for name, old in saved_levels.items():
            logging.getLogger(name).setLevel(old)
        for name in ("bitsandbytes", "bitsandbytes.backends.cpu.ops"):
            logging.getLogger(name).removeFilter(drop)
        warnings.filters[:] = saved_filters
        warnings._filters_mutated()  # noqa: SLF001 (what warnings.catch_warnings does on exit)
        transformers.utils.logging.set_verbosity(saved[0])
        if saved[1]:
            transformers.utils.logging.enable_progress_bar()
        datasets.utils.logging.set_verbosity(saved[2])
        if saved[3]:
            datasets.enable_progress_bars()
        if not saved[4]:
            enable_progress_bars()

    return restore
