"""The method registry: each method registers its classes, as PEFT's tuners call ``register_peft_method``::

    register_method("npo", config_cls=NPOConfig, trainer_cls=NPOTrainer)     # trained by a TRL trainer
    register_method("grom", config_cls=GROMConfig, fit=GROMFit())            # fitted by a callable

A method is a ``config_cls`` (a dataclass whose fields are the command line's options; it refuses bad settings
when built and may define ``check_for(model)``), and either a ``trainer_cls`` (an ``UnlearningTrainer`` subclass)
or a ``fit`` (a :class:`MethodFit`). The describing class (the trainer class, or the fit's ``artifact_cls``)
carries ``_title``, ``_paper`` (``{"title", "id"}`` or ``None``) and ``_cli_help``.

A lookup imports the built-in method packages once, then the plugins of installed packages (entry-point group
``hf_unlearn.methods``). This module imports only the standard library."""

from __future__ import annotations

import dataclasses
import importlib
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = [
    "ENTRY_POINT_GROUP", "MethodFit", "MethodInfo", "MethodView", "decoding_of", "get_method", "load_plugins",
    "method_for_artifact", "method_names", "register_method", "unregister_method",
]

#: The package whose ``BUILTIN_PACKAGES`` lists the built-in method folders.
METHODS_PACKAGE = "hf_unlearn.methods"

#: The entry-point group through which an installed package adds methods (see :func:`load_plugins`).
ENTRY_POINT_GROUP = "hf_unlearn.methods"

#: The artifact kind of a trainer method: the trained model (or its LoRA adapter).
TRAINED_MODEL_KIND = "unlearned_model"

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


class MethodFit:
    """How a method not trained by a trainer runs; register an instance as ``fit=``.

    ``__call__(model, tokenizer, forget, retain, config) -> Unlearned``: the result's ``settings`` hold only the values
    the fit chose itself. ``artifact_kind``: a key of :data:`hf_unlearn.artifact_kinds.ARTIFACT_KINDS`. Optional
    (``None`` when absent): ``select(..., criterion)`` (the run with its strength chosen by a ``SelectionCriterion``),
    ``retain_rows_read(config, retain)`` (the retain rows it reads when not all), ``decoding(model, artifact,
    check_base_weights=True) -> Decoding`` (for a method that changes decoding rather than weights)."""

    artifact_cls: ClassVar[type]
    artifact_kind: ClassVar[str]
    select: ClassVar[Callable[..., Any] | None] = None
    retain_rows_read: ClassVar[Callable[..., Any] | None] = None
    decoding: ClassVar[Callable[..., Any] | None] = None

    def __call__(self, model: Any, tokenizer: Any, forget: Any, retain: Any, config: Any) -> Any:
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:  # a fit holds no state: two of one class are the same method
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self))


@dataclass(frozen=True)
class MethodInfo:
    """One registered method: its ``name`` (``--method``, card tag) and its classes."""

    name: str
    config_cls: type
    trainer_cls: type | None = None
    fit: MethodFit | None = None

    @property
    def is_trainer(self) -> bool:
        return self.trainer_cls is not None

    @property
    def described_by(self) -> type:
        """The class carrying ``_title``, ``_paper`` and ``_cli_help``."""
        return self.trainer_cls if self.trainer_cls is not None else self.fit.artifact_cls

    @property
    def title(self) -> str:
        return self.described_by._title

    @property
    def paper(self) -> Mapping[str, str] | None:
        return self.described_by._paper

    @property
    def cli_help(self) -> str:
        return self.described_by._cli_help

    @property
    def artifact_kind(self) -> str:
        return TRAINED_MODEL_KIND if self.trainer_cls is not None else self.fit.artifact_kind

    @property
    def stops_itself(self) -> bool:
        """Whether its trainer stops by a rule of its own (then ``--select`` only records the criterion)."""
        return self.trainer_cls is not None and self.trainer_cls.stops_itself

    @property
    def has_selection(self) -> bool:
        """Whether ``--select`` applies: every trainer, a fit with ``select``."""
        return self.trainer_cls is not None or self.fit.select is not None


_METHODS: dict[str, MethodInfo] = {}
_LOCK = threading.RLock()
_builtin_loaded = False


def _check_described(name: str, cls: type) -> None:
    for attribute in ("_title", "_cli_help"):
        value = getattr(cls, attribute, None)
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"Method {name!r}: {cls.__name__}.{attribute} must be a non-empty string, got {value!r}.")
    paper = getattr(cls, "_paper", None)
    if paper is not None and not (isinstance(paper, Mapping) and all(
            isinstance(paper.get(k), str) and paper.get(k) for k in ("title", "id"))):
        raise ValueError(f"Method {name!r}: {cls.__name__}._paper must be None or a mapping with a 'title' and an "
                         f"'id', got {paper!r}.")


def register_method(name: str, *, config_cls: type, trainer_cls: type | None = None, fit: MethodFit | None = None,
                    replace: bool = False) -> MethodInfo:
    """Register a method by its classes; returns its :class:`MethodInfo`. Exactly one of ``trainer_cls`` and
    ``fit`` is given. Registering the same classes again is a no-op; another method under a taken name raises
    ``ValueError`` unless ``replace``."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"Method name must be lowercase letters, digits and '_' (starting with a letter), got {name!r}.")
    if not (isinstance(config_cls, type) and dataclasses.is_dataclass(config_cls)):
        raise ValueError(f"Method {name!r}: config_cls must be a dataclass, got {config_cls!r}.")
    if (trainer_cls is None) == (fit is None):
        raise ValueError(f"Method {name!r}: give exactly one of trainer_cls and fit.")
    if trainer_cls is not None and not isinstance(trainer_cls, type):
        raise ValueError(f"Method {name!r}: trainer_cls must be a class, got {trainer_cls!r}.")
    if fit is not None and not isinstance(fit, MethodFit):
        raise ValueError(f"Method {name!r}: fit must be a MethodFit instance, got {fit!r}.")
    info = MethodInfo(name, config_cls, trainer_cls, fit)
    _check_described(name, info.described_by)
    with _LOCK:
        old = _METHODS.get(name)
        if old is not None and old != info and not replace:
            raise ValueError(f"Method {name!r} is already registered (by {old.described_by.__qualname__}); pass "
                             "replace=True to replace it.")
        _METHODS[name] = info
    return info


def unregister_method(name: str) -> None:
    with _LOCK:
        _METHODS.pop(name, None)


def _load_builtin() -> None:
    """Import the built-in method packages once (their ``__init__`` registers them), then the plugins."""
    global _builtin_loaded
    if _builtin_loaded:
        return
    with _LOCK:
        if _builtin_loaded:
            return
        for package in _builtin_packages():
            importlib.import_module(package)
        _builtin_loaded = True
        load_plugins()


def load_plugins() -> list[str]:
    """Load the methods installed packages declare under :data:`ENTRY_POINT_GROUP` (a module whose import
    registers them, or a function to call); returns the names loaded. One that fails is skipped with a warning."""
    import warnings
    from importlib.metadata import entry_points

    loaded = []
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            target = entry.load()
            if callable(target):
                target()
            loaded.append(entry.name)
        except Exception as err:  # noqa: BLE001 (any failure of a third-party plugin is reported, not raised)
            warnings.warn(f"hf-unlearn: the method plugin {entry.name!r} ({entry.value}) did not load: "
                          f"{type(err).__name__}: {err}", stacklevel=2)
    return loaded


def _builtin_packages() -> tuple[str, ...]:
    return tuple(importlib.import_module(METHODS_PACKAGE).BUILTIN_PACKAGES)


def _package_rank(info: MethodInfo) -> int:
    module = info.described_by.__module__
    packages = _builtin_packages()
    return next((rank for rank, package in enumerate(packages) if module == package or module.startswith(package + ".")),
                len(packages))


def method_names() -> tuple[str, ...]:
    """Every registered method: the built-in ones (in ``BUILTIN_PACKAGES`` order), then the others."""
    _load_builtin()
    with _LOCK:
        infos = sorted(_METHODS.values(), key=_package_rank)  # stable: registration order within a package
    return tuple(info.name for info in infos)


def get_method(name: str) -> MethodInfo:
    """The :class:`MethodInfo` of ``name``; ``KeyError`` naming the registered methods."""
    _load_builtin()
    with _LOCK:
        if name in _METHODS:
            return _METHODS[name]
    raise KeyError(f"Unknown method {name!r}; registered methods: {', '.join(sorted(method_names()))}.")


def method_for_artifact(obj: Any) -> str | None:
    """The method whose trainer or artifact class comes first in the MRO of ``obj`` (or ``None``)."""
    cls = obj if isinstance(obj, type) else type(obj)
    method_names()
    with _LOCK:
        by_class = {info.described_by: info.name for info in _METHODS.values()}
    return next((by_class[klass] for klass in cls.__mro__ if klass in by_class), None)


def decoding_of(artifact: Any) -> Callable[..., Any] | None:
    """The ``decoding`` of the method ``artifact`` belongs to; ``None`` when none."""
    name = method_for_artifact(artifact)
    fit = get_method(name).fit if name is not None else None
    return fit.decoding if fit is not None else None


class MethodView(Mapping):
    """A read-only ``{method name: read(MethodInfo)}`` view of the registry, read on access; ``skip_none``
    leaves out ``None`` values."""

    def __init__(self, read: Callable[[MethodInfo], Any], skip_none: bool = False):
        self._read = read
        self._skip_none = skip_none

    def _items(self) -> dict[str, Any]:
        out = {name: self._read(get_method(name)) for name in method_names()}
        return {k: v for k, v in out.items() if v is not None} if self._skip_none else out

    def __getitem__(self, key: str) -> Any:
        return self._items()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items())

    def __len__(self) -> int:
        return len(self._items())
