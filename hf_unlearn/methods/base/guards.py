"""The guards every unlearning run has: the divergence guard, the finite-weight and vanishing-update checks."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from .checkpoints import TRAINER_STATE_NAME


class NonFiniteLossError(ValueError):
    """The unlearning loss became NaN or infinite; training stops at that step."""


class NonFiniteWeightsError(RuntimeError):
    """A trainable weight is NaN or infinite; nothing is saved and training stops."""


class TrainingDivergedError(RuntimeError):
    """The divergence guard fired: the retain NLL exceeded its allowed multiple of the starting value."""


def any_process(flag: bool, accelerator: Any = None) -> bool:
    """Whether ``flag`` holds on any process (one all-reduce); every process must call it at the same point, so
    that all raise or stop together."""
    if accelerator is None or getattr(accelerator, "num_processes", 1) <= 1:
        return bool(flag)
    value = torch.tensor([1.0 if flag else 0.0], device=accelerator.device)
    return bool(accelerator.reduce(value, reduction="sum").item() > 0)


class RetainDivergenceGuard(TrainerCallback, ExportableState):
    """Stops training when the retain NLL explodes: a step whose mean :meth:`observe`d value exceeds
    ``max_ratio * max(r0, floor)`` (``r0``: the first step's, saved in checkpoints) or is not finite raises
    :class:`TrainingDivergedError` before the weights reach a checkpoint."""

    def __init__(self, max_ratio: float | None = 100.0, floor: float = 0.1, reference: float | None = None):
        self.max_ratio = max_ratio
        self.floor = floor
        self.reference = reference
        self._values: list[torch.Tensor] = []
        # averages a step's local value over processes (the trainer sets it), so every process decides alike
        self.reduce: Callable[[torch.Tensor], float] = float

    def state(self) -> dict[str, Any]:
        return {"args": {"max_ratio": self.max_ratio, "floor": self.floor}, "attributes": {"reference": self.reference}}

    def observe(self, value: torch.Tensor) -> None:
        """Record one retain NLL (a micro-batch's) of the current optimizer step."""
        self._values.append(value.detach().float().reshape(()).cpu())

    def limit(self) -> float | None:
        """The retain NLL above which training stops (``None`` before the first step or when disabled)."""
        if self.max_ratio is None or self.reference is None:
            return None
        return self.max_ratio * max(self.reference, self.floor)

    def on_step_end(self, args, state, control, **kwargs):
        if not self._values:
            return
        value = self.reduce(torch.stack(self._values).mean())
        self._values.clear()
        if self.max_ratio is None:
            return
        if self.reference is None:
            if math.isfinite(value):
                self.reference = value
            return
        limit = self.limit()
        if not value <= limit:
            raise TrainingDivergedError(
                f"Training diverged at step {state.global_step}: the retain NLL is {value:.4g}, above "
                f"max_retain_loss_ratio={self.max_ratio:g} x its starting value {self.reference:.4g} "
                f"(limit {limit:.4g}). Nothing was saved from this step; lower the learning rate or raise "
                "`max_retain_loss_ratio` (None disables the guard)."
            )

    def on_train_begin(self, args, state, control, **kwargs):
        self._values.clear()


def non_finite_parameters(model: torch.nn.Module, trainable_only: bool = True) -> list[str]:
    """Names of the (trainable) parameters of ``model`` holding a NaN or an infinity."""
    return [
        name for name, p in model.named_parameters()
        if (p.requires_grad or not trainable_only) and p.numel() and not bool(torch.isfinite(p.detach()).all())
    ]


def fraction_of_vanishing_updates(model: torch.nn.Module, learning_rate: float, max_elements: int = 1 << 16) -> float:
    """Fraction of the trainable bf16/fp16 weights ``w`` with ``round(w + lr) == w == round(w - lr)`` in their
    own dtype (at most ``max_elements`` per tensor inspected, an even stride)."""
    vanishing = total = 0
    for p in model.parameters():
        if not p.requires_grad or not p.numel():
            continue
        flat = p.detach().reshape(-1)
        if flat.numel() > max_elements:
            flat = flat[:: flat.numel() // max_elements + 1]
        total += flat.numel()
        if p.dtype in (torch.bfloat16, torch.float16):
            wide = flat.double()
            up, down = (wide + learning_rate).to(p.dtype), (wide - learning_rate).to(p.dtype)
            vanishing += int(((up == flat) & (down == flat)).sum())
    return vanishing / total if total else 0.0


def saved_guard_state(checkpoint: Path) -> dict[str, Any] | None:
    """The state :class:`RetainDivergenceGuard` saved in ``checkpoint``, ``None`` when it records none."""
    state_file = checkpoint / TRAINER_STATE_NAME
    if not state_file.is_file():
        return None
    saved = json.loads(state_file.read_text()).get("stateful_callbacks", {}).get(RetainDivergenceGuard.__name__)
    if isinstance(saved, list):
        saved = saved[-1] if saved else None
    return saved or None
