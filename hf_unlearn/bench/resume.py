"""Resuming a comparison from its partial results: the key of a comparison (what its rows depend on besides the
method and its settings), the key of one job, and the rows a previous run of the same comparison finished.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def _job_key(method: str, settings: dict[str, Any]) -> str:
    return json.dumps([method, settings], sort_keys=True, default=str)


def comparison_key(pair: Any, source: str, forget_split: str, eval_kwargs: dict[str, Any],
                   target_row: dict[str, Any], retain_row: dict[str, Any], attacks: Any = None,
                   selection_steps: int | None = None, selection_rule: dict[str, Any] | None = None) -> str:
    """What a comparison's rows depend on besides the method and its settings: the pair, the data, the evaluation
    settings, the attacks run on each chosen row, the references' figures and, with selection, the criterion's rule
    (so rows selected under another rule are not resumed into this comparison) (SHA-256, 16 hex digits)."""
    import hashlib

    payload = json.dumps({"target": str(pair.target), "retain": str(pair.retain), "source": str(source),
                          "forget_split": forget_split, "eval_kwargs": eval_kwargs, "attacks": attacks or None,
                          "selection_steps": selection_steps, "selection_rule": selection_rule,
                          "references": [target_row.get("forget_quality"), target_row.get("model_utility"),
                                         retain_row.get("model_utility")]}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def finished_rows(partial_path: str | os.PathLike, run_key: str) -> dict[str, dict[str, Any]]:
    """The rows of ``partial_path`` finished without error, by method and settings; ``{}`` when the file does not
    exist. A file written by a different comparison (another ``run_key``) is refused rather than mixed in."""
    path = Path(partial_path)
    if not path.is_file():
        return {}
    saved = json.loads(path.read_text(encoding="utf-8"))
    if saved.get("run_key") != run_key:
        raise ValueError(
            f"{path} holds the rows of another comparison (other pair, data, evaluation settings or references); "
            "remove it or resume the comparison that wrote it."
        )
    return {_job_key(r["method"], r.get("settings", {})): r for rows in saved.get("grid", {}).values()
            for r in rows if r.get("error") is None}
