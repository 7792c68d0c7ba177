"""JSON-safe values: the package's one converter from the objects it records to what strict JSON accepts.

Reports, selection records and edit metadata are written with ``json.dumps(..., allow_nan=False)``
(:func:`hf_unlearn.safe_output.atomic_write_json`); :func:`json_safe` turns what they hold into plain JSON values
first, and :func:`is_jsonable` tells whether a value is plain JSON already. This module imports nothing beyond the
standard library (tensors and NumPy values are recognised by their ``tolist`` method).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["is_jsonable", "json_safe"]


def json_safe(obj: Any) -> Any:
    """A copy of ``obj`` that ``json.dumps(allow_nan=False)`` accepts.

    * an object with a ``to_dict()`` method (a report) that is not a ``dict``: its ``to_dict()``, converted;
    * a mapping: a ``dict`` with ``str`` keys and converted values; a list or tuple: a list of converted values;
    * ``None``, ``bool``, ``str``: as they are; an ``int``: ``int(obj)``; a ``float``: ``float(obj)`` when finite,
      else ``None`` (NaN and infinities are no JSON);
    * a tensor, a NumPy array or a NumPy scalar (anything with ``tolist()``): its ``tolist()``, converted;
    * anything else (a class included): ``str(obj)``.
    """
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
