"""What a method run produces: :class:`Unlearned`, :class:`TrainingOutcome` (how a trainer's run ended) and
:class:`Decoding` (for a method that changes decoding rather than weights). Imports no torch."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .locking import _is_secondary_rank
from .safe_output import gated_path

__all__ = ["Decoding", "TrainingOutcome", "Unlearned", "num_params"]


def num_params(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


@dataclass(frozen=True)
class TrainingOutcome:
    """How a trainer's run ended (``trainer.training_outcome()``): optimizer steps taken and, for a trainer
    that stops itself, the step, the reason (``"rule"`` or ``"budget"``) and its per-check records."""

    global_step: int
    stopped_at_step: int | None = None
    stop_reason: str | None = None
    history: tuple[dict[str, Any], ...] = ()

    def as_info(self) -> dict[str, Any]:
        """The outcome as the run's ``info`` keys (the stopping fields only when set)."""
        info: dict[str, Any] = {"global_step": self.global_step}
        if self.stop_reason is not None:
            info.update(stopped_at_step=self.stopped_at_step, stop_reason=self.stop_reason,
                        violation_history=list(self.history))
        return info


@dataclass
class Decoding:
    """The ``scorer`` (the evaluator's ``scorer=``) and ``generate`` keywords of a decoding-time artifact on a
    model; ``close`` (also on leaving a ``with`` block) removes what the artifact attached to the model."""

    scorer: Callable
    generation_kwargs: dict[str, Any]
    close: Callable[[], None] = field(default=lambda: None)

    def __enter__(self) -> Decoding:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@dataclass
class Unlearned:
    """What a method produced. ``model`` is what the evaluator scores and generates with (an edit's merged
    model, a decoding-time method's untouched base, with ``scorer`` and ``generation_kwargs`` set); ``artifact`` is
    the native object that ``save_pretrained`` and ``push_unlearned`` handle; ``metrics`` holds numbers only the
    method can measure."""

    method: str
    model: Any
    artifact: Any
    settings: dict[str, Any]
    trainable_params: int
    total_params: int
    seconds: float = 0.0
    scorer: Callable | None = None
    generation_kwargs: dict[str, Any] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    weights_changed: bool = True
    metrics: dict[str, float] = field(default_factory=dict)

    def use_decoding(self, decoding: Decoding) -> None:
        self.scorer = decoding.scorer
        self.generation_kwargs = dict(decoding.generation_kwargs)

    def save_pretrained(self, path: str | os.PathLike) -> None:
        """Save the native artifact (a trainer's through ``trainer.save_model``, which writes what it
        keeps beside the weights)."""
        path = gated_path(path)  # never through a link (a trainer's save_model checks the folder further)
        if (trainer := self.info.get("trainer")) is not None:
            trainer.save_model(str(path))
        elif not _is_secondary_rank():  # one writer per launch
            self.artifact.save_pretrained(path)
