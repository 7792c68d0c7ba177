"""The one JSON-safe converter: strict-JSON values out of reports, NumPy values, non-finite floats and unknown
objects; and the plain-JSON check the benchmark filters its rows with."""

from __future__ import annotations

import json
import math

import numpy as np

from hf_unlearn.jsonutil import is_jsonable, json_safe


class _Report:
    def to_dict(self):
        return {"figure": np.float32(0.5), "nested": {"n": np.int64(3)}}


def test_json_safe_gives_values_strict_json_accepts():
    value = {
        "report": _Report(), 1: (np.bool_(True), np.arange(2)), "nan": math.nan, "inf": [-math.inf],
        "plain": {"s": "x", "i": 2, "f": 1.5, "b": False, "none": None}, "other": object, "set": {1},
    }
    out = json_safe(value)
    assert out == {
        "report": {"figure": 0.5, "nested": {"n": 3}}, "1": [True, [0, 1]], "nan": None, "inf": [None],
        "plain": {"s": "x", "i": 2, "f": 1.5, "b": False, "none": None}, "other": str(object), "set": str({1}),
    }
    json.dumps(out, allow_nan=False)
    assert type(out["report"]["nested"]["n"]) is int and type(out["1"][0]) is bool


def test_is_jsonable_says_whether_a_value_is_plain_json_as_it_is():
    assert is_jsonable({"a": [1, 2.5, "x", None, True]})
    assert not is_jsonable({"a": np.int64(1)}) and not is_jsonable(object())
