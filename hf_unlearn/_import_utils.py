"""Import machinery of the top level: :class:`_LazyModule` (TRL's pattern) and :func:`call_after_import`."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any


class _LazyModule(ModuleType):
    """A package module whose ``import_structure`` names ({submodule: [names]}) import on first access."""

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
    """Wraps the loader of the watched modules only."""

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
            if (spec := finder.find_spec(fullname, path, target)) is not None:
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
    """Call ``hook()`` once ``module_name`` is imported (now if it is)."""
    if module_name in sys.modules:
        hook()
        return
    with _FINDER._lock:
        _FINDER.hooks.setdefault(module_name, []).append(hook)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
