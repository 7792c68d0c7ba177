"""Resuming a comparison from its partial results: the key of a comparison (what its rows depend on besides the
method and its settings), the key of one job, and the rows a previous run of the same comparison finished.

The key names the pair and the data by content, not by where they lie: a partial file resumes on another machine,
or with the cache in another folder, when the models, rows, settings and anchor figures are the same.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

#: The files of a model folder that its fingerprint reads: the weights and the architecture.
FINGERPRINT_PATTERNS = ("*.safetensors", "config.json")


def _job_key(method: str, settings: dict[str, Any]) -> str:
    return json.dumps([method, settings], sort_keys=True, default=str)


def model_fingerprint(model: str | os.PathLike) -> str:
    """SHA-256 (16 hex digits) of a model folder's weights and ``config.json``, each file under its name relative to
    the folder, so the same model in another folder has the same fingerprint; a Hub id (no such folder) is itself.
    Reads every weight byte once (about a second per GB)."""
    folder = Path(model)
    if not folder.is_dir():
        return str(model)
    digest = hashlib.sha256()
    files = sorted({f for pattern in FINGERPRINT_PATTERNS for f in folder.glob(pattern) if f.is_file()})
    if not files:
        raise ValueError(f"{folder} holds no safetensors weights or config.json to name the model by.")
    for file in files:
        digest.update(file.name.encode() + b"\0")
        file_digest = hashlib.sha256()
        with file.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 24), b""):
                file_digest.update(chunk)
        digest.update(file_digest.digest())
    return digest.hexdigest()[:16]


def rows_digest(*row_lists: list[dict[str, Any]]) -> str:
    """SHA-256 (16 hex digits) of the rows a comparison reads (forget rows with their other answers, retain rows),
    so the key follows the data, not the folder or Hub id it was read from."""
    payload = json.dumps(row_lists, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def comparison_key(pair: Any, data_digest: str, forget_split: str, eval_kwargs: dict[str, Any],
                   target_row: dict[str, Any], retain_row: dict[str, Any], attacks: Any = None,
                   selection_steps: int | None = None, selection_rule: dict[str, Any] | None = None) -> str:
    """What a comparison's rows depend on besides the method and its settings: the pair
    (:func:`model_fingerprint` of the target and the retain reference), the data (:func:`rows_digest`), the
    evaluation settings, the attacks run on each chosen row, the references' figures and, with selection, the
    criterion's rule (so rows selected under another rule are not resumed into this comparison) (SHA-256, 16 hex
    digits)."""
    payload = json.dumps({"target": model_fingerprint(pair.target), "retain": model_fingerprint(pair.retain),
                          "data": data_digest, "forget_split": forget_split, "eval_kwargs": eval_kwargs,
                          "attacks": attacks or None, "selection_steps": selection_steps,
                          "selection_rule": selection_rule,
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
            f"{path} holds the rows of another comparison (other models, data, evaluation settings, selection rule "
            "or references); remove it or resume the comparison that wrote it."
        )
    return {_job_key(r["method"], r.get("settings", {})): r for rows in saved.get("grid", {}).values()
            for r in rows if r.get("error") is None}
