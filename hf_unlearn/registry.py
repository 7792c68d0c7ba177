"""The method registry: each unlearning method's name, title, paper, artifact kind, entry point and CLI help.

Core and light: this module imports only the standard library. It holds metadata (strings) and dotted paths
(``"package.module:attribute"``) that are imported only when used, so importing it, or ``hf_unlearn``, imports
no torch. Each method registers itself once, in the ``__init__`` of its folder ``hf_unlearn.methods.<name>``
(``baselines``, ``masc``, ``atwu``, ``grom``, ``t3``, ``rmu``, ``pdu``), from the class attributes its trainer or
artifact carries (``_method``, ``_title``, ``_paper``, ``_cli_help``, as TRL's trainers carry ``_name`` and
``_paper``)::

    from hf_unlearn.registry import get_method, method_names
    method_names()                  # ('grom', 't3', 'masc', 'atwu', 'grad_ascent', ...)
    get_method("npo").paper         # {'title': 'Negative Preference Optimization: ...', 'id': '2404.05868'}

A lookup (:func:`get_method`, :func:`method_names`) imports the built-in method packages the first time it
runs. Adding a method is one :func:`register_method` call (see its docstring for what the entry point is); the
CLI's ``--method``, the model cards and the benchmark read the registry.
"""

from __future__ import annotations

import importlib
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BUILTIN_PACKAGES", "MethodInfo", "MethodView", "get_method", "method_for_artifact", "method_names",
    "register_class", "register_method", "resolve", "unregister_method",
]

#: Packages whose ``__init__`` registers the built-in methods; imported by the first lookup. Their order is
#: the order of :func:`method_names` (then any method registered elsewhere, in registration order).
BUILTIN_PACKAGES = (
    "hf_unlearn.methods.grom", "hf_unlearn.methods.t3", "hf_unlearn.methods.masc", "hf_unlearn.methods.atwu",
    "hf_unlearn.methods.baselines", "hf_unlearn.methods.rmu", "hf_unlearn.methods.pdu",
)

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_DOTTED = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def resolve(path: str) -> Any:
    """The object a dotted path ``"package.module:attribute"`` names (imported now)."""
    if not isinstance(path, str) or not _DOTTED.match(path):
        raise ValueError(f"Expected a dotted path 'package.module:attribute', got {path!r}.")
    module_name, _, attribute = path.partition(":")
    value: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        value = getattr(value, part)
    return value


def dotted_path(obj: Any) -> str:
    """The dotted path ``"module:qualname"`` of a class or function (the inverse of :func:`resolve`)."""
    return f"{obj.__module__}:{obj.__qualname__}"


@dataclass(frozen=True)
class MethodInfo:
    """One registered method.

    ``name``: the key (``--method``, card tag). ``title``: its display name in cards. ``paper``: ``{"title",
    "id"}`` (arXiv id) or ``None`` when the method has no paper to cite. ``artifact_kind``: the kind of artifact
    it produces, a key of :data:`hf_unlearn.hub.ARTIFACT_KINDS`. ``entry_point``: dotted path of how to run it
    (a trainer class, a fit function, or a runner; see :func:`register_method`). ``cli_help``: one line for the
    command line. ``config_class``: dotted path of its config dataclass (its fields are the CLI's options).
    ``trainer_class``: dotted path of its trainer class, for the methods trained by a TRL trainer.
    """

    name: str
    title: str
    paper: Mapping[str, str] | None
    artifact_kind: str
    entry_point: str
    cli_help: str
    config_class: str | None = None
    trainer_class: str | None = None

    @property
    def is_trainer(self) -> bool:
        """Whether the method is trained by a trainer class (checkpoints, ``--resume``, TRL options)."""
        return self.trainer_class is not None

    def load(self) -> Any:
        """The entry point object (imported now)."""
        return resolve(self.entry_point)

    def load_config_class(self) -> type | None:
        """The config dataclass (imported now), or ``None`` when the method has none."""
        return resolve(self.config_class) if self.config_class else None

    def load_trainer_class(self) -> type | None:
        """The trainer class (imported now), or ``None`` for a method without one."""
        return resolve(self.trainer_class) if self.trainer_class else None


_METHODS: dict[str, MethodInfo] = {}
_LOCK = threading.RLock()
_builtin_loaded = False


def _check_text(name: str, field: str, value: Any) -> None:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"Method {name!r}: {field} must be a non-empty string, got {value!r}.")


def register_method(
    name: str,
    *,
    title: str,
    paper: Mapping[str, str] | None,
    artifact_kind: str,
    entry_point: str,
    cli_help: str,
    config_class: str | None = None,
    trainer_class: str | None = None,
    replace: bool = False,
) -> MethodInfo:
    """Register an unlearning method; returns its :class:`MethodInfo`.

    ``entry_point`` is the dotted path ``"package.module:attribute"`` of how to run the method: for a method
    trained by a trainer, the trainer class (give ``trainer_class`` too); for GROM and T3 their fit function;
    for any other method a runner ``run(model, tokenizer, forget, retain, output_dir, settings)`` returning a
    :class:`hf_unlearn.run.Unlearned`, which is what ``hf-unlearn unlearn --method NAME`` calls.
    ``config_class`` (dotted path of a dataclass) gives the command line its options and validates settings.

    Registering the same information again is a no-op; a different method under a taken name raises
    ``ValueError`` unless ``replace``. Nothing is imported here (paths resolve on use).
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"Method name must be lowercase letters, digits and '_' (starting with a letter), got {name!r}.")
    for field_name, value in (("title", title), ("artifact_kind", artifact_kind), ("cli_help", cli_help)):
        _check_text(name, field_name, value)
    for field_name, value in (("entry_point", entry_point), ("config_class", config_class),
                              ("trainer_class", trainer_class)):
        if value is not None and (not isinstance(value, str) or not _DOTTED.match(value)):
            raise ValueError(f"Method {name!r}: {field_name} must be a dotted path 'package.module:attribute', "
                             f"got {value!r}.")
    if entry_point is None:
        raise ValueError(f"Method {name!r} needs an entry_point.")
    if paper is not None:
        if not isinstance(paper, Mapping) or not all(isinstance(paper.get(k), str) and paper.get(k)
                                                     for k in ("title", "id")):
            raise ValueError(f"Method {name!r}: paper must be None or a mapping with a 'title' and an 'id', got {paper!r}.")
        paper = {"title": paper["title"], "id": paper["id"]}
    info = MethodInfo(name, title, paper, artifact_kind, entry_point, cli_help, config_class, trainer_class)
    with _LOCK:
        old = _METHODS.get(name)
        if old is not None and old != info and not replace:
            raise ValueError(f"Method {name!r} is already registered (entry point {old.entry_point}); pass "
                             "replace=True to replace it.")
        _METHODS[name] = info
    return info


def register_class(cls: type, *, artifact_kind: str, entry_point: str | None = None, trainer: bool = False,
                   config_class: type | None = None) -> MethodInfo:
    """Register the method a trainer or artifact class describes with its class attributes ``_method`` (the
    name), ``_title``, ``_paper`` and ``_cli_help``.

    With ``trainer`` the class is the entry point and trainer class, and its ``config_class`` the config;
    otherwise give ``entry_point`` (a dotted path) and ``config_class``.
    """
    if trainer:
        entry_point = dotted_path(cls)
        config_class = config_class or cls.config_class
    if entry_point is None:
        raise ValueError(f"register_class({cls.__name__}) needs entry_point= (or trainer=True).")
    return register_method(
        cls._method, title=cls._title, paper=cls._paper, artifact_kind=artifact_kind, entry_point=entry_point,
        cli_help=cls._cli_help, config_class=dotted_path(config_class) if config_class is not None else None,
        trainer_class=dotted_path(cls) if trainer else None,
    )


def unregister_method(name: str) -> None:
    """Remove a registered method (no-op when it is not registered)."""
    with _LOCK:
        _METHODS.pop(name, None)


def _load_builtin() -> None:
    """Import the built-in method packages once (their ``__init__`` registers them)."""
    global _builtin_loaded
    if _builtin_loaded:
        return
    with _LOCK:
        if _builtin_loaded:
            return
        for package in BUILTIN_PACKAGES:
            importlib.import_module(package)
        _builtin_loaded = True


def _package_rank(info: MethodInfo) -> int:
    module = info.entry_point.partition(":")[0]
    for rank, package in enumerate(BUILTIN_PACKAGES):
        if module == package or module.startswith(package + "."):
            return rank
    return len(BUILTIN_PACKAGES)


def method_names() -> tuple[str, ...]:
    """Names of every registered method: the built-in ones (in :data:`BUILTIN_PACKAGES` order), then the others."""
    _load_builtin()
    with _LOCK:
        infos = sorted(_METHODS.values(), key=_package_rank)  # stable: registration order within a package
    return tuple(info.name for info in infos)


def get_method(name: str) -> MethodInfo:
    """The :class:`MethodInfo` of ``name``; ``KeyError`` naming the registered methods when there is none."""
    _load_builtin()
    with _LOCK:
        if name in _METHODS:
            return _METHODS[name]
    raise KeyError(f"Unknown method {name!r}; registered methods: {', '.join(sorted(method_names()))}.")


def method_for_artifact(obj: Any) -> str | None:
    """The registered method an object (trainer or artifact) belongs to, by the ``_method`` class attribute of
    its class, most derived first; ``None`` when no class in its MRO names a registered method."""
    cls = obj if isinstance(obj, type) else type(obj)
    for klass in cls.__mro__:
        name = vars(klass).get("_method")
        if isinstance(name, str):
            names = method_names()
            if name in names:
                return name
    return None


class MethodView(Mapping):
    """A read-only ``{method name: value}`` view of the registry (``value = read(MethodInfo)``), read on access,
    so that it also shows methods registered later. ``skip_none`` leaves out methods whose value is ``None``."""

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

    def __repr__(self) -> str:
        return f"MethodView({self._items()!r})"
