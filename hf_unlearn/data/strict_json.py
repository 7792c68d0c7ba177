"""JSON inputs read strictly: a text that starts with a UTF-8 byte-order mark, or a JSON object that repeats a
key, is refused with a ``ValueError`` naming where it is, instead of being read silently (Python's ``json``
keeps the last value of a repeated key, and a byte-order mark would otherwise be dropped or become text)."""

from __future__ import annotations

import json
from typing import Any

BYTE_ORDER_MARK = "\ufeff"


def refuse_byte_order_mark(text: str, where: str) -> None:
    """A ``ValueError`` naming ``where`` when ``text`` starts with a UTF-8 byte-order mark."""
    if text.startswith(BYTE_ORDER_MARK):
        raise ValueError(f"{where}: the file starts with a UTF-8 byte-order mark; save it as UTF-8 without one "
                         "(e.g. `sed -i '1s/^\\xEF\\xBB\\xBF//' FILE`).")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"the key {key!r} occurs twice in one object (JSON readers disagree on which value "
                             "counts); keep one")
        seen[key] = value
    return seen


def parse_json(text: str, where: str) -> Any:
    """The JSON value of ``text``; a ``ValueError`` ``"<where>: not valid JSON (...)"`` when it is not JSON, starts
    with a byte-order mark or holds an object that repeats a key."""
    refuse_byte_order_mark(text, where)
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: not valid JSON ({err.msg}).") from None
    except ValueError as err:
        raise ValueError(f"{where}: {err}.") from None
