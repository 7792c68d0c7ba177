"""Deep copies of a model that run their own weights (the NPO reference, the quantized copies). TRL's
``SFTTrainer`` patches ``forward`` on the model instance with a closure over the *original* model, which
``copy.deepcopy`` keeps; :func:`independent_copy` drops every instance ``forward`` of the copy, at any depth, that
still reaches a module of the original (closure, bound ``self`` or ``functools.partial``)."""
from __future__ import annotations

import copy
import functools
import types
from typing import Any, TypeVar

import torch

ModuleT = TypeVar("ModuleT", bound=torch.nn.Module)


def _reaches(obj: Any, originals: set[int], depth: int = 3) -> bool:
    """Whether ``obj`` (a function, bound method or partial) refers to a module whose id is in ``originals``."""
    if depth < 0 or obj is None:
        return False
    if id(obj) in originals:
        return True
    if isinstance(obj, types.MethodType):
        return _reaches(obj.__self__, originals, depth - 1) or _reaches(obj.__func__, originals, depth - 1)
    if isinstance(obj, functools.partial):
        return any(_reaches(a, originals, depth - 1) for a in (obj.func, *obj.args, *obj.keywords.values()))
    for cell in getattr(obj, "__closure__", None) or ():
        try:
            content = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if _reaches(content, originals, depth - 1):
            return True
    return False


def independent_copy(model: ModuleT) -> ModuleT:
    """``copy.deepcopy(model)`` in which no module's ``forward`` is an instance patch that still runs ``model``."""
    originals = {id(m) for m in model.modules()}
    clone = copy.deepcopy(model)
    for module in clone.modules():
        patched = module.__dict__.get("forward")
        if patched is not None and _reaches(patched, originals):
            del module.__dict__["forward"]
    return clone
