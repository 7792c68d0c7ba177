"""Deep copies of a model that run their own weights (the NPO reference, the NF4 re-check's quantized copy).

TRL's ``SFTTrainer`` patches ``forward`` on the model instance (its fused LM head, ``trl.trainer.utils``); the
patch's closure calls the forward bound to the *original* model. ``copy.deepcopy`` keeps that instance attribute,
so a plain copy of a trained model silently computes with the original's weights: a quantized or frozen copy
would give exactly the original's outputs. :func:`independent_copy` drops the instance-level ``forward`` so the
copy falls back to its class's.
"""

from __future__ import annotations

import copy
from typing import TypeVar

import torch

ModuleT = TypeVar("ModuleT", bound=torch.nn.Module)


def independent_copy(model: ModuleT) -> ModuleT:
    """``copy.deepcopy(model)`` whose ``forward`` is its class's, not an instance patch bound to ``model``."""
    clone = copy.deepcopy(model)
    clone.__dict__.pop("forward", None)
    return clone
