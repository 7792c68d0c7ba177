"""The checks of a model's saved files and of what loading them produced (run by ``load_model`` before any work,
each problem one line): safetensors only and readable, weights that fit ``config.json``, finite values."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["PICKLE_FILES", "check_weight_files", "first_non_finite", "loading_problems", "safetensors_files"]

#: Weight files in the pickle format, which hf-unlearn never loads.
PICKLE_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")
SAFETENSORS_INDEX = "model.safetensors.index.json"


def _shown(names: list[str], limit: int = 4) -> str:
    names = sorted(names)
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def safetensors_files(folder: str | os.PathLike) -> list[Path]:
    """The safetensors files a saved model in ``folder`` loads (by its index, else ``model.safetensors``,
    else every ``*.safetensors``); ``ValueError`` for pickle weights only, a bad index or a missing file."""
    folder = Path(folder)
    index = folder / SAFETENSORS_INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as err:
            raise ValueError(f"{index} is not a readable safetensors index ({type(err).__name__}); save the model "
                             "again with model.save_pretrained(folder).") from None
        files = []
        for name in names:
            path = folder / str(name)
            if not isinstance(name, str) or os.path.isabs(name) or ".." in Path(name).parts or "/" in name:
                raise ValueError(f"{index} names the weight file {name!r}, which is not a file inside {folder}.")
            if not path.is_file():
                raise ValueError(f"{index} names the weight file {name}, which is missing from {folder}.")
            files.append(path)
        return files
    single = folder / "model.safetensors"
    files = [single] if single.is_file() else sorted(p for p in folder.glob("*.safetensors") if p.is_file())
    if not files:
        pickles = [name for name in PICKLE_FILES if (folder / name).is_file()]
        if pickles:
            raise ValueError(f"Model folder {folder} holds only {pickles[0]}, a pickle file (loading one can run "
                             "code); hf-unlearn loads safetensors weights only: convert it with "
                             "model.save_pretrained(folder), which writes model.safetensors.")
        raise ValueError(f"Model folder {folder} has no safetensors weights (model.safetensors).")
    return files


def check_weight_files(folder: str | os.PathLike) -> list[Path]:
    """Every safetensors file of the model in ``folder`` has a readable header covering the file exactly;
    ``ValueError`` naming the first that does not. Returns the files."""
    from safetensors import safe_open

    files = safetensors_files(folder)
    for path in files:
        size = path.stat().st_size
        if size == 0:
            raise ValueError(f"Weight file {path} is empty (0 bytes); save the model again with "
                             "model.save_pretrained(folder).")
        try:
            with safe_open(str(path), framework="pt") as handle:
                handle.keys()
        except Exception as err:  # safetensors raises its own SafetensorError (and OSError for unreadable files)
            cause = " ".join(str(err).split())
            raise ValueError(f"Weight file {path} ({size} bytes) is not a complete safetensors file ({cause}): it is "
                             "truncated, damaged or of another format; save the model again with "
                             "model.save_pretrained(folder).") from None
    return files


def loading_problems(info: dict[str, Any]) -> str | None:
    """What ``from_pretrained``'s loading report shows is wrong, as one sentence (weights missing,
    unexpected or of another shape), or ``None``."""
    problems = []
    missing = [str(k) for k in info.get("missing_keys") or ()]
    unexpected = [str(k) for k in info.get("unexpected_keys") or ()]
    mismatched = sorted(info.get("mismatched_keys") or (), key=lambda e: str(e[0] if isinstance(e, (tuple, list)) else e))
    if missing:
        problems.append(f"{len(missing)} weight(s) missing from the checkpoint, which would be initialised at random "
                        f"({_shown(missing)})")
    if unexpected:
        problems.append(f"{len(unexpected)} weight(s) the model does not have, which would be ignored "
                        f"({_shown(unexpected)})")
    if mismatched:
        shown = [f"{e[0]}: checkpoint {tuple(e[1])}, config {tuple(e[2])}" if isinstance(e, (tuple, list)) and len(e) == 3
                 else str(e) for e in mismatched[:3]]
        more = f" and {len(mismatched) - 3} more" if len(mismatched) > 3 else ""
        problems.append(f"{len(mismatched)} weight(s) whose shape differs from the one config.json describes "
                        f"({'; '.join(shown)}{more})")
    return "; ".join(problems) if problems else None


def first_non_finite(model: Any) -> str | None:
    """The name of the first floating-point weight or buffer holding NaN or an infinity, else ``None``."""
    import torch

    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if tensor.is_floating_point() and tensor.numel() and not bool(torch.isfinite(tensor).all()):
                return name
    return None
