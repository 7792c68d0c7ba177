"""Import machinery of the top level: a lazy module (TRL's ``_LazyModule`` pattern), a post-import hook, and
the aliases of the module paths the methods had before they moved to ``hf_unlearn.methods``.

:class:`_LazyModule` stands in for ``hf_unlearn`` in ``sys.modules``: each public name is imported
from its submodule the first time it is used, so ``import hf_unlearn`` imports neither torch nor
transformers' model code.

:func:`call_after_import` runs a function once a module has been imported (right away when it
already is). The package uses it to register the T3 head with the transformers Auto classes when
``transformers.models.auto.modeling_auto`` loads (the Auto classes import torch, so registering
eagerly would import it too).

:func:`install_module_aliases` puts a finder first on ``sys.meta_path`` that answers each old module path of
:data:`MODULE_ALIASES` (``hf_unlearn.grom.path``, ``hf_unlearn.trainers.masc``, ...) with the module at its new
path: the same module object, so classes, ``isinstance`` checks and registries are shared. The two old
umbrella packages, ``hf_unlearn.trainers`` and ``hf_unlearn.losses``, have no single new module; they are
answered by a module that forwards each of their old names to its new home (:data:`DEPRECATED_PACKAGES`).
Each old path imports with a ``DeprecationWarning`` naming the new one; they are kept for one release.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any


class _LazyModule(ModuleType):
    """A package module whose attributes listed in ``import_structure`` ({submodule: [names]}) are
    imported on first access; ``extra_objects`` are set eagerly."""

    def __init__(self, name: str, module_file: str, import_structure: dict[str, Sequence[str]],
                 module_spec: importlib.machinery.ModuleSpec | None = None,
                 extra_objects: dict[str, Any] | None = None):
        super().__init__(name)
        self._import_structure = {k: list(v) for k, v in import_structure.items()}
        self._name_to_module = {name: module for module, names in import_structure.items() for name in names}
        self.__all__ = list(self._name_to_module) + [k for k in (extra_objects or {}) if not k.startswith("_")]
        self.__file__ = module_file
        self.__spec__ = module_spec
        self.__path__ = [os.path.dirname(module_file)]
        self.__package__ = name
        for key, value in (extra_objects or {}).items():
            setattr(self, key, value)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self.__all__))

    def __getattr__(self, name: str) -> Any:
        if name in self._name_to_module:
            value = getattr(self._get_module(self._name_to_module[name]), name)
        elif name in self._import_structure or any(key.startswith(name + ".") for key in self._import_structure):
            value = self._get_module(name)
        elif f"{self.__name__}.{name}" in MODULE_ALIASES or f"{self.__name__}.{name}" in DEPRECATED_PACKAGES:
            value = importlib.import_module(f"{self.__name__}.{name}")  # an old path: warns, returns the module
        else:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        setattr(self, name, value)
        return value

    def _get_module(self, module_name: str) -> ModuleType:
        return importlib.import_module("." + module_name, self.__name__)

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self.__name__, self.__file__, self._import_structure))


class _AfterImportLoader(importlib.abc.Loader):
    """Wraps a module's loader; runs the hooks once the module has executed."""

    def __init__(self, loader: importlib.abc.Loader, hooks: list[Callable[[], None]]):
        self._loader = loader
        self._hooks = hooks

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        for hook in self._hooks:
            hook()


class _AfterImportFinder(importlib.abc.MetaPathFinder):
    """Meta path finder that wraps the loader of the watched modules (and only theirs)."""

    def __init__(self) -> None:
        self.hooks: dict[str, list[Callable[[], None]]] = {}
        self._lock = threading.Lock()

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.hooks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        with self._lock:
            hooks = self.hooks.pop(fullname, [])
        if spec.loader is not None and hooks:
            spec.loader = _AfterImportLoader(spec.loader, hooks)
        return spec


_FINDER = _AfterImportFinder()


def call_after_import(module_name: str, hook: Callable[[], None]) -> None:
    """Call ``hook()`` once ``module_name`` has been imported: now if it is, else right after its import."""
    if module_name in sys.modules:
        hook()
        return
    with _FINDER._lock:
        _FINDER.hooks.setdefault(module_name, []).append(hook)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


# ----- old module paths (kept for one release) ---------------------------------------------------------------

_GROM = ("attribution", "config", "keys", "model", "path", "peft_export", "provenance", "solve", "targets")
_T3 = ("calibration", "config", "fit", "hidden", "modeling", "processor", "provenance", "scoring", "tilt")

#: ``{old module path: new module path}``: importing the old path gives the module of the new one.
MODULE_ALIASES: dict[str, str] = {
    "hf_unlearn.trainers.unlearning_config": "hf_unlearn.methods.baselines.config",
    "hf_unlearn.trainers.unlearning_trainer": "hf_unlearn.methods.base",
    "hf_unlearn.trainers.baselines": "hf_unlearn.methods.baselines.trainer",
    "hf_unlearn.trainers.masc": "hf_unlearn.methods.masc",
    "hf_unlearn.trainers.masc.config": "hf_unlearn.methods.masc.config",
    "hf_unlearn.trainers.masc.trainer": "hf_unlearn.methods.masc.trainer",
    "hf_unlearn.trainers.atwu": "hf_unlearn.methods.atwu",
    "hf_unlearn.trainers.atwu.config": "hf_unlearn.methods.atwu.config",
    "hf_unlearn.trainers.atwu.trainer": "hf_unlearn.methods.atwu.trainer",
    "hf_unlearn.trainers.atwu.weighter": "hf_unlearn.methods.atwu.weighter",
    "hf_unlearn.losses.common": "hf_unlearn.methods.base.losses",
    "hf_unlearn.losses.baselines": "hf_unlearn.methods.baselines.loss",
    "hf_unlearn.losses.masc": "hf_unlearn.methods.masc.loss",
    "hf_unlearn.losses.atwu": "hf_unlearn.methods.atwu.loss",
    "hf_unlearn.grom": "hf_unlearn.methods.grom",
    **{f"hf_unlearn.grom.{m}": f"hf_unlearn.methods.grom.{m}" for m in _GROM},
    "hf_unlearn.t3": "hf_unlearn.methods.t3",
    **{f"hf_unlearn.t3.{m}": f"hf_unlearn.methods.t3.{m}" for m in _T3},
}

_BASE, _BASELINES = "hf_unlearn.methods.base", "hf_unlearn.methods.baselines"
_MASC, _ATWU = "hf_unlearn.methods.masc", "hf_unlearn.methods.atwu"

#: ``{old package: {name it exported: the new module that holds it}}``.
DEPRECATED_PACKAGES: dict[str, dict[str, str]] = {
    "hf_unlearn.trainers": {
        **dict.fromkeys((
            "BaseUnlearningConfig", "UnlearningConfig", "UnlearningTrainer", "LossDenominators", "NonFiniteLossError",
            "NonFiniteWeightsError", "PairedCollator", "PairedForgetRetainDataset", "RetainDivergenceGuard",
            "ScoredBatch", "TrainingDivergedError", "to_trl_format"), _BASE),
        **dict.fromkeys((
            "GradAscentConfig", "GradDiffConfig", "NPOConfig", "SimNPOConfig", "GradAscentTrainer", "GradDiffTrainer",
            "NPOTrainer", "SimNPOTrainer"), _BASELINES),
        **dict.fromkeys(("MASCConfig", "MASCTrainer", "MarginStoppingCallback"), _MASC),
        **dict.fromkeys(("ATWUConfig", "ATWUTokenWeighter", "ATWUTrainer"), _ATWU),
    },
    "hf_unlearn.losses": {
        **dict.fromkeys(("answer_mask", "sequence_log_probs", "nll_loss", "kl_retain_loss"), f"{_BASE}.losses"),
        **dict.fromkeys(("grad_ascent_loss", "grad_diff_loss", "npo_loss", "simnpo_loss"), f"{_BASELINES}.loss"),
        **dict.fromkeys((
            "masc_threshold_from_probability", "masc_probability_from_threshold", "restricted_margin",
            "margin_hinge_loss", "masc_violation_counts", "violation_rate", "buffered_hinge_loss",
            "continuation_mask", "sample_cut_ratios", "per_example_violation_rates", "hoeffding_upper_bound"),
            f"{_MASC}.loss"),
        **dict.fromkeys((
            "satga_plus_exponent", "satga_plus_loss", "satga_plus_weight", "weighted_npo_loss",
            "weighted_simnpo_loss", "score_entropy", "straight_through_indicator", "budget_penalty"), f"{_ATWU}.loss"),
    },
}

_NEW_HOME = {"hf_unlearn.trainers": "hf_unlearn.methods (one folder per method)",
             "hf_unlearn.losses": "hf_unlearn.methods.<method>.loss"}


def _warn_moved(old: str, new: str) -> None:
    warnings.warn(f"`{old}` has moved to `{new}`; the old path is deprecated and will be removed in the next "
                  "release.", DeprecationWarning, stacklevel=3)


class _DeprecatedPackage(ModuleType):
    """An old umbrella package: each name it exported is read from the new module that holds it now."""

    def __init__(self, name: str, exports: dict[str, str]):
        super().__init__(name, f"Deprecated: the names of ``{name}`` now live in {_NEW_HOME[name]}.")
        self._exports = dict(exports)
        self.__all__ = sorted(exports)
        self.__path__: list[str] = []  # a package: its old submodules import (through the alias finder)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self.__all__))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_exports":
            raise AttributeError(name)
        if name in self._exports:
            value = getattr(importlib.import_module(self._exports[name]), name)
        elif f"{self.__name__}.{name}" in MODULE_ALIASES:
            value = importlib.import_module(f"{self.__name__}.{name}")
        else:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        setattr(self, name, value)
        return value


class _AliasLoader(importlib.abc.Loader):
    """Loads an old module path as the module of its new path (the same object)."""

    def __init__(self, old: str):
        self.old = old
        self._spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        if self.old in DEPRECATED_PACKAGES:
            _warn_moved(self.old, _NEW_HOME[self.old])
            return _DeprecatedPackage(self.old, DEPRECATED_PACKAGES[self.old])
        new = MODULE_ALIASES[self.old]
        _warn_moved(self.old, new)
        module = importlib.import_module(new)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        if self._spec is not None:  # the import system set the alias spec on the module: give back its own
            module.__spec__ = self._spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Meta path finder answering the old module paths (and only those)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MODULE_ALIASES and fullname not in DEPRECATED_PACKAGES:
            return None
        is_package = fullname in DEPRECATED_PACKAGES or any(k.startswith(fullname + ".") for k in MODULE_ALIASES)
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(fullname), is_package=is_package)


_ALIAS_FINDER = _AliasFinder()


def install_module_aliases() -> None:
    """Put the finder of the old module paths first on ``sys.meta_path`` (idempotent)."""
    if _ALIAS_FINDER in sys.meta_path:
        sys.meta_path.remove(_ALIAS_FINDER)
    sys.meta_path.insert(0, _ALIAS_FINDER)


def current_name(dotted: str) -> str:
    """``dotted`` (``"module.Name"`` or ``"module"``) with an old module path of :data:`MODULE_ALIASES`
    replaced by the new one (the longest matching prefix); other names are returned unchanged."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        new = MODULE_ALIASES.get(".".join(parts[:cut]))
        if new is not None:
            return ".".join([new, *parts[cut:]])
    return dotted
