"""Loading TOFU-shaped data: from the Hub (`locuslab/TOFU`), a local folder, or the synthetic set.

A row is TOFU-shaped: ``question``, ``answer`` and, in the ``*_perturbed`` configurations used
for evaluation, ``paraphrased_answer`` and ``perturbed_answer`` (a list). See ``DESIGN.md``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

TOFU_HUB_ID = "locuslab/TOFU"
SYNTHETIC_SOURCE = "synthetic"

FORGET_SPLITS = ("forget01", "forget05", "forget10")
RETAIN_FOR_FORGET = {"forget01": "retain99", "forget05": "retain95", "forget10": "retain90"}
HOLDOUT_FOR_FORGET = {"forget01": "holdout01", "forget05": "holdout05", "forget10": "holdout10"}

# configuration name -> fields every row must carry
TOFU_CONFIGS: dict[str, tuple[str, ...]] = {
    "full": ("question", "answer"),
    **{name: ("question", "answer") for name in FORGET_SPLITS},
    **{name: ("question", "answer") for name in RETAIN_FOR_FORGET.values()},
    **{name: ("question", "answer") for name in HOLDOUT_FOR_FORGET.values()},
    **{
        f"{name}_perturbed": ("question", "answer", "paraphrased_answer", "perturbed_answer")
        for name in FORGET_SPLITS
    },
    "retain_perturbed": ("question", "answer", "paraphrased_answer", "perturbed_answer"),
    "real_authors": ("question", "answer"),
    "real_authors_perturbed": ("question", "answer", "perturbed_answer"),
    "world_facts": ("question", "answer"),
    "world_facts_perturbed": ("question", "answer", "perturbed_answer"),
}


def validate_rows(rows: list[dict[str, Any]], config: str, origin: str) -> None:
    """Raise a ``ValueError`` naming the first row that lacks a field ``config`` requires."""
    if not rows:
        raise ValueError(f"TOFU config {config!r} from {origin} has no rows.")
    required = TOFU_CONFIGS.get(config, ("question", "answer"))
    for i, row in enumerate(rows):
        missing = [f for f in required if f not in row or row[f] is None]
        if missing:
            raise ValueError(
                f"Row {i} of TOFU config {config!r} from {origin} lacks required field(s) {missing}; "
                f"it has {sorted(row)}."
            )


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read a JSON Lines file into a list of dicts (blank lines skipped)."""
    rows = []
    with open(path, encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}:{line_no}: not valid JSON ({err.msg}).") from None
    return rows


def load_tofu_rows(config: str, source: str = TOFU_HUB_ID) -> list[dict[str, Any]]:
    """Rows of one TOFU configuration as plain dicts; see :func:`load_tofu`."""
    if config not in TOFU_CONFIGS:
        raise ValueError(f"Unknown TOFU config {config!r}; known configs: {sorted(TOFU_CONFIGS)}.")
    if source == SYNTHETIC_SOURCE or source.startswith(SYNTHETIC_SOURCE + ":"):
        from .synthetic import synthetic_tofu

        seed = int(source.split(":", 1)[1]) if ":" in source else 0
        rows = synthetic_tofu(seed=seed)[config]
        origin = f"the synthetic set (seed {seed})"
    elif os.path.isdir(source):
        path = Path(source) / f"{config}.jsonl"
        if not path.is_file():
            raise FileNotFoundError(
                f"TOFU config {config!r} not found in local folder {source}: expected {path}."
            )
        rows = read_jsonl(path)
        origin = str(path)
    elif source.startswith((".", "/", "~")) or source.count("/") > 1:
        raise FileNotFoundError(f"TOFU source folder {source} does not exist.")
    else:
        rows = _load_from_hub(source, config)
        origin = f"the Hub dataset {source}"
    validate_rows(rows, config, origin)
    return rows


def _load_from_hub(repo_id: str, config: str) -> list[dict[str, Any]]:
    import datasets

    try:
        ds = datasets.load_dataset(repo_id, config, split="train")
    except (ConnectionError, OSError) as err:
        raise ConnectionError(
            f"Could not load {repo_id!r} ({config}) from the Hub ({type(err).__name__}: {err}). "
            "Without network access, pass a local folder of <config>.jsonl files as the source "
            "(for example a copy of TOFU) or source='synthetic'."
        ) from err
    return [dict(r) for r in ds]


def load_tofu(config: str, source: str = TOFU_HUB_ID):
    """Load one TOFU configuration as a ``datasets.Dataset``.

    Args:
        config: a TOFU configuration name (``forget10``, ``retain90``, ``forget10_perturbed``,
            ``retain_perturbed``, ``real_authors_perturbed``, ``world_facts_perturbed``, ...).
        source: a Hub dataset id (default ``locuslab/TOFU``), a local folder holding
            ``<config>.jsonl`` files, or ``"synthetic"`` (``"synthetic:<seed>"``) for the
            package's own fictitious-author set, which needs no download.

    Raises:
        ValueError: unknown configuration, or rows lacking the configuration's fields.
        FileNotFoundError: a local folder without ``<config>.jsonl``.
        ConnectionError: a Hub id that cannot be reached.
    """
    import datasets

    return datasets.Dataset.from_list(load_tofu_rows(config, source))
