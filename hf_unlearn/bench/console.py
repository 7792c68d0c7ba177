"""Console progress for the benchmark runner and the CLI: one line per method and phase.

A phase (``training``, ``evaluation``, ``NF4 re-check``) prints ``<method> <phase> ...`` when it starts and
completes the same line with ``done`` and its duration, or with ``FAILED``, the error and the log file that
holds the traceback. The per-step Trainer logs never reach the console here: they go to a JSON Lines file
(:class:`hf_unlearn.bench.registry.JsonlLogCallback`), and are echoed only with ``--verbose``, in which
case each phase line is printed whole when the phase ends so that the echoed logs do not split it.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, TextIO


class PhaseReporter:
    """Prints one line per (label, phase); see the module docstring. ``enabled=False`` prints nothing."""

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
        """End the open phase successfully: ``done <seconds> s[, note]``."""
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
        """End the open phase with a failure, printed as one line naming the label, the phase and the log file.

        Returns that line (without the padding of the progress column)."""
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
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"event": event, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), **fields}
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record, default=str) + "\n")


def log_exception(path: str | os.PathLike | None, phase: str, error: BaseException) -> None:
    """Append the failure of ``phase`` with its full traceback to the log at ``path``."""
    log_event(
        path, "error", phase=phase, error=f"{type(error).__name__}: {error}",
        traceback="".join(traceback.format_exception(type(error), error, error.__traceback__)),
    )
