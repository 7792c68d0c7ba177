"""Console progress for the benchmark runner: the library's :mod:`hf_unlearn.console` (one line per method and
phase, JSON Lines event logs), which the command line uses too."""

from __future__ import annotations

from ..console import PhaseReporter, log_event, log_exception

__all__ = ["PhaseReporter", "log_event", "log_exception"]
