"""The method registry: each unlearning method registers one spec (:class:`MethodInfo`), and the core reads it.

Core and light: this module imports only the standard library. A spec holds metadata (strings) and dotted paths
(``"package.module:attribute"``) that are imported only when used, so importing it, or ``hf_unlearn``, imports
no torch. Each method registers itself once, in the ``__init__`` of its folder ``hf_unlearn.methods.<name>``
(the folders are listed, in order, by ``hf_unlearn.methods.BUILTIN_PACKAGES``), as PEFT's tuners call
``register_peft_method``::

    from hf_unlearn.registry import get_method, method_names
    method_names()                  # ('grom', 't3', 'masc', 'atwu', 'grad_ascent', ...)
    get_method("npo").paper         # {'title': 'Negative Preference Optimization: ...', 'id': '2404.05868'}

The method contract (what a spec gives, and who reads it; nothing outside ``hf_unlearn/methods`` names a method):

* ``config_class``: its config dataclass; its fields are the command line's options, and it refuses bad settings
  when built (``validate_settings``). A config may define ``check_for(model)``, run before any work.
* how it runs: a trainer method gives its ``trainer_class`` (a TRL trainer subclass of
  :class:`~hf_unlearn.methods.base.trainer.UnlearningTrainer`), which the core's trainer runner drives; any other
  method gives ``entry_point``, a runner ``run(model, tokenizer, forget, retain, output_dir, settings) ->``
  :class:`~hf_unlearn.result.Unlearned`.
* ``selection``: how it picks its own strength under a criterion (``--select``): ``"best_checkpoint"`` (a
  trainer: the criterion is measured every few steps and the best step restored), ``"own_stop"`` (a trainer with
  its own stopping rule: the criterion is recorded, nothing restored), a dotted path of a selector
  ``select(run, model, tokenizer, forget, retain, output_dir, settings, criterion) -> Unlearned`` (``run`` runs
  the method plainly with the caller's run options), or ``None`` (no selection).
* ``artifact_kind``: a key of :data:`hf_unlearn.artifact_kinds.ARTIFACT_KINDS` (how the artifact is carded,
  recognised, pinned and pushed); a method with an artifact of its own registers that kind from its folder.
* ``decoding``: for a method that changes decoding rather than weights, a dotted path of
  ``decoding(model, artifact, check_base_weights=True) ->`` :class:`~hf_unlearn.result.Decoding` (the scorer and
  ``generate`` keywords the evaluator and the attacks use).
* ``metrics``: a dotted path of ``metrics(trainer, tokenizer, forget, retain) -> {name: float}``, numbers only
  the method can measure, copied into the run's result.
* ``retain_rows_read``: a dotted path of ``rows_read(config, retain) -> rows``, the retain rows the method reads
  when it does not read them all (each must fit ``max_length``, checked before work).

A lookup (:func:`get_method`, :func:`method_names`) imports the built-in method packages the first time it
runs, then the plugins of installed packages (entry-point group ``hf_unlearn.methods``, :func:`load_plugins`).
Adding a method is one :func:`register_method` (or :func:`register_class`) call, from any module; the command
line, ``--select``, the cards, the Hub push and the benchmark then know it.
"""

from __future__ import annotations

import importlib
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BEST_CHECKPOINT", "ENTRY_POINT_GROUP", "METHODS_PACKAGE", "OWN_STOP", "MethodInfo", "MethodView", "decoding_of",
    "get_method", "load_plugins", "method_for_artifact", "method_names", "register_class", "register_method",
    "resolve", "unregister_method",
]

#: The package whose ``BUILTIN_PACKAGES`` lists the built-in method folders (imported by the first lookup; their
#: order is the order of :func:`method_names`, then any method registered elsewhere, in registration order).
METHODS_PACKAGE = "hf_unlearn.methods"

#: The entry-point group through which an installed package adds methods (see :func:`load_plugins`).
ENTRY_POINT_GROUP = "hf_unlearn.methods"

#: How a trainer method selects its strength when its spec says nothing: keep the best checkpoint.
BEST_CHECKPOINT, OWN_STOP = "best_checkpoint", "own_stop"

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
    ``selection``, ``decoding``, ``metrics``, ``retain_rows_read``: the hooks of the method contract (see the
    module docstring).
    """

    name: str
    title: str
    paper: Mapping[str, str] | None
    artifact_kind: str
    entry_point: str
    cli_help: str
    config_class: str | None = None
    trainer_class: str | None = None
    selection: str | None = None
    decoding: str | None = None
    metrics: str | None = None
    retain_rows_read: str | None = None

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

    def hook(self, name: str) -> Any:
        """The hook ``name`` (``"decoding"``, ``"metrics"``, ``"retain_rows_read"``, or a selector given as
        ``"selection"``), imported now; ``None`` when the method has none."""
        path = getattr(self, name)
        return resolve(path) if path and _DOTTED.match(path) else None


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
    selection: str | None = None,
    decoding: str | None = None,
    metrics: str | None = None,
    retain_rows_read: str | None = None,
    replace: bool = False,
) -> MethodInfo:
    """Register an unlearning method; returns its :class:`MethodInfo`.

    ``entry_point`` is the dotted path ``"package.module:attribute"`` of how to run the method: for a method
    trained by a trainer, the trainer class (give ``trainer_class`` too); for GROM and T3 their fit function;
    for any other method a runner ``run(model, tokenizer, forget, retain, output_dir, settings)`` returning a
    :class:`hf_unlearn.run.Unlearned`, which is what ``hf-unlearn unlearn --method NAME`` calls.
    ``config_class`` (dotted path of a dataclass) gives the command line its options and validates settings.
    ``selection`` defaults to ``"best_checkpoint"`` for a trainer method and ``None`` otherwise; ``decoding``,
    ``metrics`` and ``retain_rows_read`` are optional hooks (dotted paths; see the module docstring).

    Registering the same information again is a no-op; a different method under a taken name raises
    ``ValueError`` unless ``replace``. Nothing is imported here (paths resolve on use).
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"Method name must be lowercase letters, digits and '_' (starting with a letter), got {name!r}.")
    for field_name, value in (("title", title), ("artifact_kind", artifact_kind), ("cli_help", cli_help)):
        _check_text(name, field_name, value)
    if selection is None and trainer_class is not None:
        selection = BEST_CHECKPOINT
    if selection in (BEST_CHECKPOINT, OWN_STOP) and trainer_class is None:
        raise ValueError(f"Method {name!r}: selection {selection!r} applies to trainer methods; give a selector.")
    hooks = (("selection", None if selection in (BEST_CHECKPOINT, OWN_STOP) else selection),
             ("decoding", decoding), ("metrics", metrics), ("retain_rows_read", retain_rows_read))
    for field_name, value in (("entry_point", entry_point), ("config_class", config_class),
                              ("trainer_class", trainer_class), *hooks):
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
    info = MethodInfo(name, title, paper, artifact_kind, entry_point, cli_help, config_class, trainer_class,
                      selection, decoding, metrics, retain_rows_read)
    with _LOCK:
        old = _METHODS.get(name)
        if old is not None and old != info and not replace:
            raise ValueError(f"Method {name!r} is already registered (entry point {old.entry_point}); pass "
                             "replace=True to replace it.")
        _METHODS[name] = info
    return info


def register_class(cls: type, *, artifact_kind: str, entry_point: str | None = None, trainer: bool = False,
                   config_class: type | None = None, **hooks: str | None) -> MethodInfo:
    """Register the method a trainer or artifact class describes with its class attributes ``_method`` (the
    name), ``_title``, ``_paper`` and ``_cli_help``.

    With ``trainer`` the class is the entry point and trainer class, and its ``config_class`` the config;
    otherwise give ``entry_point`` (a dotted path) and ``config_class``. ``hooks`` are :func:`register_method`'s
    ``selection``, ``decoding``, ``metrics`` and ``retain_rows_read``.
    """
    if trainer:
        entry_point = dotted_path(cls)
        config_class = config_class or cls.config_class
    if entry_point is None:
        raise ValueError(f"register_class({cls.__name__}) needs entry_point= (or trainer=True).")
    return register_method(
        cls._method, title=cls._title, paper=cls._paper, artifact_kind=artifact_kind, entry_point=entry_point,
        cli_help=cls._cli_help, config_class=dotted_path(config_class) if config_class is not None else None,
        trainer_class=dotted_path(cls) if trainer else None, **hooks,
    )


def unregister_method(name: str) -> None:
    """Remove a registered method (no-op when it is not registered)."""
    with _LOCK:
        _METHODS.pop(name, None)


def _load_builtin() -> None:
    """Import the built-in method packages once (their ``__init__`` registers them), then the method plugins of
    installed packages (:func:`load_plugins`)."""
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
    """Load the methods other installed packages declare under the entry-point group :data:`ENTRY_POINT_GROUP`
    (``[options.entry_points] hf_unlearn.methods = name = package.module`` in their ``setup.cfg``): each entry
    point names a module whose import registers its methods, or a function to call that does. Returns the names
    of the entry points loaded; one that fails to load is skipped with a warning naming it (a broken plugin
    does not take the built-in methods down)."""
    import warnings
    from importlib.metadata import entry_points

    loaded = []
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            target = entry.load()
            if callable(target):
                target()
        except Exception as err:  # noqa: BLE001 (any failure of a third-party plugin is reported, not raised)
            warnings.warn(f"hf-unlearn: the method plugin {entry.name!r} ({entry.value}) did not load: "
                          f"{type(err).__name__}: {err}", stacklevel=2)
            continue
        loaded.append(entry.name)
    return loaded


def _builtin_packages() -> tuple[str, ...]:
    return tuple(importlib.import_module(METHODS_PACKAGE).BUILTIN_PACKAGES)


def _package_rank(info: MethodInfo) -> int:
    module = info.entry_point.partition(":")[0]
    packages = _builtin_packages()
    for rank, package in enumerate(packages):
        if module == package or module.startswith(package + "."):
            return rank
    return len(packages)


def method_names() -> tuple[str, ...]:
    """Names of every registered method: the built-in ones (in ``hf_unlearn.methods.BUILTIN_PACKAGES`` order), then
    the others."""
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


def decoding_of(artifact: Any) -> Callable[..., Any] | None:
    """The ``decoding`` hook of the method an artifact belongs to (:func:`method_for_artifact`), imported now;
    ``None`` for an artifact of no registered method, or of a method that changes weights, not decoding."""
    name = method_for_artifact(artifact)
    return get_method(name).hook("decoding") if name is not None else None


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
