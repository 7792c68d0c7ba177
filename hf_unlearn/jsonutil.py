"""JSON values and files. Standard library only."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["is_jsonable", "json_safe", "read_json_file"]


def json_safe(obj: Any) -> Any:
    """A copy of ``obj`` that ``json.dumps(allow_nan=False)`` accepts (``None`` for a non-finite float,
    ``to_dict()`` / ``tolist()`` where there is one, ``str`` otherwise)."""
    if isinstance(obj, type):  # a class, not an instance: its methods are unbound
        return str(obj)
    to_dict = getattr(obj, "to_dict", None)
    if not isinstance(obj, dict) and callable(to_dict):
        obj = to_dict()
    if isinstance(obj, Mapping):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return float(obj) if math.isfinite(obj) else None
    tolist = getattr(obj, "tolist", None)
    if callable(tolist):
        return json_safe(tolist())
    return str(obj)


def is_jsonable(value: Any) -> bool:
    """Whether ``json.dumps(value)`` succeeds as it is (no conversion)."""
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False


def read_json_file(path: str | os.PathLike, what: str = "") -> Any:
    """The JSON value in the file ``path``; ``FileNotFoundError`` or ``ValueError`` naming ``what`` and
    ``path``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what}{path} does not exist.")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{what}{path} is not valid JSON ({err.msg}).") from None
