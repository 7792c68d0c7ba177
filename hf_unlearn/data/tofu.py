"""Loading TOFU-shaped data (``question``, ``answer`` and, in the ``*_perturbed`` configurations,
``paraphrased_answer`` and ``perturbed_answer``) from the Hub (``locuslab/TOFU``), a local folder or the synthetic
set. :func:`check_rows` refuses, naming the source and the row, a row that is no JSON object, lacks a field, or
holds an empty, null, non-string or invalid-Unicode text, before any method sees it."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .strict_json import parse_json

TOFU_HUB_ID = "locuslab/TOFU"
SYNTHETIC_SOURCE = "synthetic"

FORGET_SPLITS = ("forget01", "forget05", "forget10")
RETAIN_FOR_FORGET = {"forget01": "retain99", "forget05": "retain95", "forget10": "retain90"}
HOLDOUT_FOR_FORGET = {"forget01": "holdout01", "forget05": "holdout05", "forget10": "holdout10"}

_QA = ("question", "answer")
_PERTURBED = (*_QA, "paraphrased_answer", "perturbed_answer")
# configuration name -> fields every row must carry
TOFU_CONFIGS: dict[str, tuple[str, ...]] = {
    **{name: _QA for name in ("full", *FORGET_SPLITS, *RETAIN_FOR_FORGET.values(), *HOLDOUT_FOR_FORGET.values())},
    **{f"{name}_perturbed": _PERTURBED for name in FORGET_SPLITS}, "retain_perturbed": _PERTURBED,
    "real_authors": _QA, "real_authors_perturbed": (*_QA, "perturbed_answer"),
    "world_facts": _QA, "world_facts_perturbed": (*_QA, "perturbed_answer"),
}


#: Fields that hold one text (a non-empty string) and fields that hold a list of texts.
TEXT_FIELDS = ("question", "answer", "paraphrased_answer", "paraphrased_question")
TEXT_LIST_FIELDS = ("perturbed_answer",)


def _text_problem(value: Any) -> str | None:
    """Why ``value`` is not a usable text (``None`` when it is a string with a non-blank character)."""
    if value is None:
        return "is null"
    if not isinstance(value, str):
        shown = repr(value)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        article = "an" if type(value).__name__[0] in "aeiou" else "a"
        return f"is {article} {type(value).__name__} ({shown}), not a string"
    if not value.strip():
        return "is empty" if not value else "is blank (whitespace only)"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:  # JSON's "\ud800" escapes decode to a lone surrogate, which no tokenizer takes
        return f"holds a lone surrogate ({value[err.start]!r} at character {err.start}), which is not valid Unicode text"
    return None


def row_problem(row: Any, required: Sequence[str] = ("question", "answer")) -> str | None:
    """What is wrong with one TOFU-shaped row, or ``None``: it must be a JSON object whose ``required`` fields are
    present, whose text fields (``question``, ``answer``, ``paraphrased_answer``, ``paraphrased_question``) are
    non-empty strings and whose ``perturbed_answer`` is a non-empty list of such strings."""
    if not isinstance(row, dict):
        return f"the row is {'an' if type(row).__name__[0] in 'aeiou' else 'a'} {type(row).__name__}, not a JSON object"
    missing = [f for f in required if f not in row]
    if missing:
        return f"the row lacks required field(s) {missing} (it has {sorted(row)})"
    for name in row:
        if name in TEXT_LIST_FIELDS:
            values = row[name]
            if not isinstance(values, list) or not values:
                shown = repr(values)
                return f"{name!r} is {shown if len(shown) <= 40 else shown[:37] + '...'}, not a non-empty list of strings"
            for j, value in enumerate(values):
                problem = _text_problem(value)
                if problem:
                    return f"{name}[{j}] {problem}"
        elif name in TEXT_FIELDS or name in required:
            problem = _text_problem(row[name])
            if problem:
                return f"{name!r} {problem}"
    return None


def check_rows(
    rows: Sequence[Any], origin: str, required: Sequence[str] = ("question", "answer"),
    line_numbers: Sequence[int] | None = None,
) -> None:
    """Raise a ``ValueError`` naming ``origin`` and the first bad row (``origin:line`` with ``line_numbers``, else
    ``Row i of origin``, 0-based): see :func:`row_problem`. Empty, blank, null and non-string questions and answers
    are refused here, when rows are loaded, so that no method trains or evaluates on them."""
    if not rows:
        raise ValueError(f"{origin} has no rows.")
    for i, row in enumerate(rows):
        problem = row_problem(row, required)
        if problem:
            where = f"{origin}:{line_numbers[i]}" if line_numbers is not None else f"Row {i} of {origin}"
            raise ValueError(f"{where}: {problem}; questions and answers must be non-empty strings.")


def _read_jsonl_lines(path: str | os.PathLike) -> tuple[list[Any], list[int]]:
    """The JSON values of the non-blank lines of ``path`` and their line numbers; a ``ValueError`` names the file and
    the line that is not UTF-8 text or not valid JSON (:func:`~hf_unlearn.data.strict_json.parse_json`: a
    byte-order mark or a repeated key is refused too)."""
    rows, lines = [], []
    with open(path, "rb") as fh:
        for line_no, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(f"{path}:{line_no}: not UTF-8 text (byte {raw[err.start]:#04x} at column {err.start + 1}); "
                                 "save the file as UTF-8.") from None
            if line.strip():
                rows.append(parse_json(line, f"{path}:{line_no}"))
                lines.append(line_no)
    return rows, lines


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read a JSON Lines file into a list of dicts (blank lines skipped)."""
    return _read_jsonl_lines(path)[0]


def read_qa_file(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The question/answer rows of the JSON Lines file ``path``, checked as :func:`check_rows` checks them (a
    ``ValueError`` names the file and the line of the first bad row)."""
    rows, lines = _read_jsonl_lines(path)
    check_rows(rows, str(path), line_numbers=lines)
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
            raise FileNotFoundError(f"TOFU config {config!r} not found in local folder {source}: expected {path}.")
        rows = read_jsonl(path)
        origin = str(path)
    elif source.startswith((".", "/", "~")) or source.count("/") > 1:
        raise FileNotFoundError(f"TOFU source folder {source} does not exist.")
    else:
        rows = _load_from_hub(source, config)
        origin = f"the Hub dataset {source}"
    check_rows(rows, f"TOFU config {config!r} from {origin}", TOFU_CONFIGS[config])
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
    """One TOFU configuration (``forget10``, ``retain_perturbed``, ...) as a ``datasets.Dataset`` from a Hub id, a
    folder of ``<config>.jsonl`` files or ``"synthetic[:<seed>]"``. ``ValueError``: unknown configuration or rows
    lacking fields; ``FileNotFoundError``: no ``<config>.jsonl``; ``ConnectionError``: an unreachable Hub."""
    import datasets

    return datasets.Dataset.from_list(load_tofu_rows(config, source))
