"""What a method run produces: :class:`Unlearned` (the model to evaluate, the native artifact, the settings and
sizes), :class:`TrainingOutcome` (how a trainer's run ended) and :class:`Decoding` (the scorer and ``generate``
keywords of a method that changes decoding rather than weights). Imports no torch, so that a method's fit can build
its result without importing :mod:`hf_unlearn.run`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .locking import _is_secondary_rank
from .safe_output import gated_path

__all__ = ["Decoding", "TrainingOutcome", "Unlearned", "num_params"]


def num_params(model: Any) -> int:
    """The number of parameters of a module (trainable or not)."""
    return sum(p.numel() for p in model.parameters())


@dataclass(frozen=True)
class TrainingOutcome:
    """How a trainer's run ended, as the core reads it from any trainer (``trainer.training_outcome()``).

    ``global_step``: optimizer steps taken. ``stopped_at_step`` and ``stop_reason`` (``"rule"`` or ``"budget"``):
    set by a trainer that stops itself (``None`` otherwise). ``history``: that trainer's per-check records.
    """

    global_step: int
    stopped_at_step: int | None = None
    stop_reason: str | None = None
    history: tuple[dict[str, Any], ...] = ()

    @property
    def stopped_itself(self) -> bool:
        return self.stopped_at_step is not None

    def as_info(self) -> dict[str, Any]:
        """The outcome as the run's ``info`` keys (the stopping fields only when set)."""
        info: dict[str, Any] = {"global_step": self.global_step}
        if self.stop_reason is not None:
            info.update(stopped_at_step=self.stopped_at_step, stop_reason=self.stop_reason,
                        violation_history=list(self.history))
        return info


@dataclass
class Decoding:
    """How to score and generate with a decoding-time artifact on a model: ``scorer`` (the answer scorer the
    evaluator takes as ``scorer=``) and ``generation_kwargs`` (e.g. ``{"logits_processor": ...}`` for
    ``model.generate``). ``close`` releases what the artifact attached to the model (its hooks); a ``Decoding`` is
    also a context manager that closes on exit."""

    scorer: Callable
    generation_kwargs: dict[str, Any]
    close: Callable[[], None] = field(default=lambda: None)

    def __enter__(self) -> Decoding:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@dataclass
class Unlearned:
    """What a method produced.

    ``model`` is what the evaluator scores and generates with (for an edit the merged model, for a decoding-time
    method the untouched base); ``scorer`` and ``generation_kwargs`` are set for methods that change the
    decoding distribution rather than the weights. ``artifact`` is the native object that ``save_pretrained`` /
    :func:`hf_unlearn.hub.push_unlearned` handle (a model, an adapter, a head). ``metrics`` holds numbers only the
    method can measure; the benchmark runner copies them into the method's result row and table.
    """

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

    @property
    def trainable_share(self) -> float:
        return self.trainable_params / max(1, self.total_params)

    def use_decoding(self, decoding: Decoding) -> None:
        """Score and generate through ``decoding`` (its scorer and ``generate`` keywords)."""
        self.scorer = decoding.scorer
        self.generation_kwargs = dict(decoding.generation_kwargs)

    def save_pretrained(self, path: str | os.PathLike) -> None:
        """Save the native artifact; trainer methods save through ``trainer.save_model`` so that what they keep
        beside the weights (a stopping record, a token scorer) is written too."""
        path = gated_path(path)  # never through a link (a trainer's save_model checks the folder further)
        trainer = self.info.get("trainer")
        if trainer is not None:
            trainer.save_model(str(path))
        elif not _is_secondary_rank():  # one writer per launch
            self.artifact.save_pretrained(path)
