"""Each method's demo setting on TOFU-tiny, as data: ``settings.toml`` beside this module, one table per method."""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SETTINGS_FILE = Path(__file__).with_name("settings.toml")
"""The demo settings: ``[<method>]`` tables of the method's config fields, in the order the demo runs them."""


@functools.lru_cache(maxsize=1)
def _settings_tables() -> dict[str, dict[str, Any]]:
    with open(SETTINGS_FILE, "rb") as fh:
        return tomllib.load(fh)


def demo_methods() -> list[str]:
    """Every registered method: those with a demo setting in the file's order, then the others."""
    from ..registry import method_names

    names = method_names()
    tables = _settings_tables()
    return [n for n in tables if n in names] + [n for n in names if n not in tables]


def demo_settings(method: str) -> dict[str, Any]:
    """A copy of ``method``'s demo setting; ``{}`` (its config's defaults) for a method without one."""
    return dict(_settings_tables().get(method, {}))
