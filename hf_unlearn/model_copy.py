"""Deep copies of a model that run their own weights (the NPO reference, the NF4 re-check's quantized copy).

TRL's ``SFTTrainer`` patches ``forward`` on the model instance (its fused LM head, ``trl.trainer.utils``); the
patch's closure calls the forward bound to the *original* model. ``copy.deepcopy`` keeps that instance attribute,
so a plain copy of a trained model silently computes with the original's weights: a quantized or frozen copy
would give exactly the original's outputs. On a ``PeftModel`` the patch sits on the wrapped model
(``base_model.model``), not on the top-level module. :func:`independent_copy` drops every instance-level
``forward`` of the copy, at any depth, that still reaches a module of the original (through its closure, its
bound ``self`` or a ``functools.partial``), so each copied module falls back to its class's ``forward``; instance
``forward`` wrappers that refer only to the copy (accelerate's hooks, after the copy) are kept.
"""

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
