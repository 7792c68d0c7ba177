"""The benchmark's presets of the methods: each registered method's demo setting and grid, from the subject TOML
files (``benchmarks/configs/<subject>.toml``).

The methods themselves are those of the core registry (:mod:`hf_unlearn.registry`) and run through the library's
:func:`hf_unlearn.run.fit_or_train`; this module holds only their presets, as data: :class:`MethodPresets` (a
method's demo setting and benchmark grid), :data:`PRESETS` (every registered method's, TOFU-tiny's by default)
and :func:`method_presets`.

Adding a method is one :func:`hf_unlearn.registry.register_method` call (and, for the benchmark, its presets
in the subject TOML files).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf_unlearn import registry as core_registry

__all__ = [
    "DEFAULT_SUBJECT", "PRESETS", "MethodPresets", "configs_dir", "load_subject_presets", "method_presets",
    "subject_config_path",
]

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass(frozen=True)
class MethodPresets:
    """A registered method's benchmark presets: its demo setting and its benchmark grid (<= 6 settings), each a
    dict of fields of the method's config, and its one-line description (the registry's CLI help)."""

    name: str
    demo: dict[str, Any]
    grid: tuple[dict[str, Any], ...]
    description: str


#: Every registered method's presets from the default subject's file (TOFU-tiny), in that file's order.
PRESETS: dict[str, MethodPresets] = {}


def method_presets(name: str) -> MethodPresets:
    """The :class:`MethodPresets` of ``name``: from :data:`PRESETS`, else, for a method registered with
    :mod:`hf_unlearn.registry` after this module loaded, empty presets (its config's defaults)."""
    if name in PRESETS:
        return PRESETS[name]
    try:
        info = core_registry.get_method(name)
    except KeyError:
        raise ValueError(f"Unknown method {name!r}; choose from {sorted(core_registry.method_names())}.") from None
    return MethodPresets(name, demo={}, grid=({},), description=info.cli_help)


# Each method's demo setting and benchmark grid are data, one TOML file per benchmark subject
# (``benchmarks/configs/<subject>.toml``).
DEFAULT_SUBJECT = "tofu_tiny"


def configs_dir() -> Path:
    """Folder of the subject TOML files: ``benchmarks/configs`` beside this package."""
    return Path(__file__).resolve().parents[1] / "configs"


def subject_config_path(subject: str | os.PathLike) -> Path:
    """The TOML file of ``subject``: a name (``"tofu_tiny"``) in :func:`configs_dir`, or a path to a ``.toml``."""
    if str(subject).endswith(".toml"):
        path = Path(subject)
    else:
        path = configs_dir() / f"{subject}.toml"
    if not path.is_file():
        known = sorted(p.stem for p in configs_dir().glob("*.toml"))
        raise FileNotFoundError(f"No benchmark config {path}; shipped subjects: {known}.")
    return path


def _merge(shared: dict[str, Any], names: Sequence[str], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in names:
        if name not in shared:
            raise ValueError(f"{where}: unknown shared table {name!r}; defined: {sorted(shared)}.")
        out.update(shared[name])
    return out


def load_subject_presets(subject: str | os.PathLike = DEFAULT_SUBJECT) -> dict[str, dict[str, Any]]:
    """Every method's ``{"demo": settings, "grid": (settings, ...)}`` from a subject's TOML file.

    Each method's table is assembled as the file's header describes: ``[shared.<name>]`` tables named
    in ``use``, then ``settings``, then ``demo`` (the demo setting) or, for each grid entry, the shared
    tables named in ``grid_use`` and then the entry. A file with ``demo_settings = "hf_unlearn.demo"`` takes each
    method's demo setting from :func:`hf_unlearn.demo.demo_settings`.
    """
    from hf_unlearn.demo import demo_settings

    path = subject_config_path(subject)
    with open(path, "rb") as fh:
        data = tomllib.load(fh)
    shared = data.get("shared", {})
    library_demo = data.get("demo_settings") == "hf_unlearn.demo"  # the demo settings the library ships
    presets: dict[str, dict[str, Any]] = {}
    for name, table in data.get("methods", {}).items():
        unknown = set(table) - {"use", "settings", "demo", "grid_use", "grid"}
        if unknown:
            raise ValueError(f"{path}: method {name!r} has unknown keys {sorted(unknown)}.")
        base = {**_merge(shared, table.get("use", ()), f"{path} [{name}]"), **table.get("settings", {})}
        grid_base = {**base, **_merge(shared, table.get("grid_use", ()), f"{path} [{name}]")}
        presets[name] = {
            "demo": demo_settings(name) if library_demo else {**base, **table.get("demo", {})},
            "grid": tuple({**grid_base, **entry} for entry in table.get("grid", ())),
        }
    return presets


def _load_presets(subject: str | os.PathLike = DEFAULT_SUBJECT) -> None:
    """Fill :data:`PRESETS` with every method of the core registry, in the subject file's order (then the methods
    it has no table for, with empty presets). Each built-in method must have a table."""
    presets = load_subject_presets(subject)
    names = core_registry.method_names()
    for name in [n for n in presets if n in names] + [n for n in names if n not in presets]:
        info = core_registry.get_method(name)
        if name not in presets and info.described_by.__module__.startswith("hf_unlearn."):
            raise ValueError(f"{subject_config_path(subject)} has no [methods.{name}] table.")
        preset = presets.get(name, {"demo": {}, "grid": ({},)})
        PRESETS[name] = MethodPresets(name, demo=preset["demo"], grid=preset["grid"], description=info.cli_help)


_load_presets()
