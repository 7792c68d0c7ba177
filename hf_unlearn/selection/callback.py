"""Best-checkpoint selection for trainers (:class:`SelectionCallback`): the criterion measured every few
optimizer steps, the preferred weights kept and restored at the end."""

from __future__ import annotations

import os
import weakref
from pathlib import Path
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from ..jsonutil import json_safe
from ..safe_output import gated_path
from .criterion import SelectionCriterion
from .record import SELECTION_WEIGHTS, SelectionRecord, select_candidate

_LIVE_CALLBACKS: list[weakref.ReferenceType] = []


class SelectionCallback(TrainerCallback, ExportableState):
    """Best-checkpoint selection for any ``Trainer``: measure the criterion every ``selection_steps`` optimizer
    steps (and at step 0 and the last), keep the weights the rule (:meth:`SelectionCriterion.select`, steps weak ->
    strong) prefers, restore them when training ends (``restore=False``: keep the record, leave the weights).

    ``keep="memory"`` holds a CPU copy of the trainable parameters, ``keep="disk"`` writes them under
    ``<output_dir>/selection-best/``. Checkpoints carry the callback's state (and with ``keep="memory"`` the kept
    weights), so a resumed run selects as an uninterrupted one. After training :attr:`record` is the
    :class:`SelectionRecord`. ``scorer_factory(model)`` gives the scorer to measure with. Under DDP only the main
    process writes files; ZeRO-3 and FSDP are refused (``ValueError``) at the start of training.
    """

    def __init__(
        self, criterion: SelectionCriterion | None = None, selection_steps: int = 50, keep: str = "memory",
        scorer_factory: Any = None, restore: bool = True,
    ) -> None:
        if keep not in ("memory", "disk"):
            raise ValueError(f"keep must be 'memory' or 'disk', got {keep!r}.")
        if int(selection_steps) < 1:
            raise ValueError(f"selection_steps must be >= 1, got {selection_steps}.")
        if criterion is None:  # the Trainer rebuilds stateful callbacks from state() args on resume
            criterion = next((cb().criterion for cb in reversed(_LIVE_CALLBACKS)
                              if cb() is not None and cb().criterion is not None), None)
        self.criterion = criterion
        self.selection_steps = int(selection_steps)
        self.keep = keep
        self.scorer_factory = scorer_factory
        self.restore = bool(restore)
        self.steps: list[int] = []
        self.measurements: list[dict[str, Any]] = []
        self.best_step: int | None = None
        self.original: dict[str, Any] | None = None
        self.record: SelectionRecord | None = None
        self._best: dict[str, Any] | None = None
        _LIVE_CALLBACKS[:] = [ref for ref in _LIVE_CALLBACKS if ref() is not None]
        _LIVE_CALLBACKS.append(weakref.ref(self))

    # ExportableState
    def state(self) -> dict[str, Any]:
        return {
            "args": {"selection_steps": self.selection_steps, "keep": self.keep, "restore": self.restore},
            "attributes": json_safe({"steps": self.steps, "measurements": self.measurements,
                                     "best_step": self.best_step, "original": self.original}),
        }

    def _require_criterion(self) -> SelectionCriterion:
        if self.criterion is None:
            raise ValueError("SelectionCallback needs a SelectionCriterion (pass criterion=).")
        return self.criterion

    @staticmethod
    def _best_dir(args: Any) -> Path:
        return Path(args.output_dir) / "selection-best"

    def _trainable(self, model: Any) -> dict[str, Any]:
        return {n: p.detach().to("cpu", copy=True).contiguous() for n, p in model.named_parameters() if p.requires_grad}

    def _keep(self, args: Any, model: Any, main: bool = True) -> None:
        weights = self._trainable(model)
        if self.keep == "memory" or not main:  # one writer per launch: the other processes keep theirs in memory
            self._best = weights
            return
        from safetensors.torch import save_file

        folder = gated_path(self._best_dir(args))
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / (SELECTION_WEIGHTS + ".partial")
        save_file(weights, str(tmp))
        os.replace(tmp, folder / SELECTION_WEIGHTS)  # never a half-written file under the final name
        self._best = None

    def _load_best(self, args: Any) -> dict[str, Any] | None:
        if self._best is not None:
            return self._best
        path = self._best_dir(args) / SELECTION_WEIGHTS
        if self.keep == "disk" and path.is_file():
            from safetensors.torch import load_file

            return load_file(str(path))
        return None

    def _measure(self, args: Any, state: Any, model: Any, tokenizer: Any) -> None:
        criterion = self._require_criterion()
        step = int(state.global_step)
        if self.steps and self.steps[-1] == step:
            return
        scorer = self.scorer_factory(model) if self.scorer_factory is not None else None
        if criterion.original is None and self.original is not None:
            criterion.original = dict(self.original)
        measurement = criterion.measure(model, tokenizer, scorer=scorer)
        self.original = dict(criterion.original or {})
        self.steps.append(step)
        self.measurements.append(measurement)
        index, _, _ = select_candidate(self.measurements, criterion.retain_tolerance, criterion.holdout_level,
                                       criterion.holdout_margin)
        if index == len(self.measurements) - 1:
            self.best_step = step
            if self.restore:
                self._keep(args, model, main=bool(getattr(state, "is_world_process_zero", True)))

    def _restore_from_checkpoint(self, args: Any, state: Any) -> None:
        saved = (getattr(state, "stateful_callbacks", None) or {}).get(type(self).__name__)
        if isinstance(saved, list):
            saved = saved[-1] if saved else None
        attributes = (saved or {}).get("attributes") or {}
        if not attributes.get("steps"):
            return
        self.steps = [int(s) for s in attributes["steps"]]
        self.measurements = [dict(m) for m in attributes["measurements"]]
        self.best_step = attributes.get("best_step")
        self.original = attributes.get("original")
        if self.criterion is not None and self.original:
            self.criterion.original = dict(self.original)
        if self.keep == "memory" and self.restore:
            path = Path(args.output_dir) / f"checkpoint-{state.global_step}" / SELECTION_WEIGHTS
            if not path.is_file():
                raise FileNotFoundError(
                    f"Resuming with SelectionCallback(keep='memory') needs {path} (written with every checkpoint); "
                    "it is missing, so the kept weights cannot be restored."
                )
            from safetensors.torch import load_file

            self._best = load_file(str(path))

    @staticmethod
    def _check_not_sharded(args: Any, model: Any) -> None:
        """Refuse a run whose weights are partitioned across processes (DeepSpeed ZeRO-3, FSDP 1 or 2, from the
        Trainer's ``fsdp`` option, accelerate's launch or ``DTensor`` parameters): the callback
        copies and restores the trainable parameters locally, which would keep and restore shards only."""
        from transformers.integrations import is_deepspeed_zero3_enabled

        from ..partitioning import is_partitioned

        sharded = (bool(getattr(args, "fsdp", None)) or is_deepspeed_zero3_enabled()
                   or os.environ.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true"))
        if sharded or (model is not None and is_partitioned(model)):
            raise ValueError(
                "SelectionCallback keeps and restores the trainable weights on each process, and under DeepSpeed "
                "ZeRO-3 / FSDP each process holds only a shard of them; it does not gather shards. Select with "
                "DDP (torchrun / accelerate launch without FSDP or ZeRO-3), ZeRO-1/2, or one process."
            )

    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        self._require_criterion()
        self._check_not_sharded(args, model)
        if state.global_step > 0:  # resumed: the measurements so far come from the checkpoint
            self._restore_from_checkpoint(args, state)
        if not self.steps:
            self._measure(args, state, model, processing_class)

    def on_step_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        if state.global_step % self.selection_steps == 0:
            self._measure(args, state, model, processing_class)

    def on_save(self, args, state, control, model=None, **kwargs):
        if self.keep != "memory" or self._best is None:
            return
        from safetensors.torch import save_file

        folder = gated_path(Path(args.output_dir) / f"checkpoint-{state.global_step}")
        if folder.is_dir() and getattr(state, "is_world_process_zero", True):  # one writer per launch
            save_file(self._best, str(folder / SELECTION_WEIGHTS))

    def on_train_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        import torch

        self._measure(args, state, model, processing_class)
        criterion = self._require_criterion()
        self.record = criterion.decide([{"step": s} for s in self.steps], self.measurements)
        if not self.restore:
            return
        best = self._load_best(args)
        if best is None:
            raise RuntimeError("SelectionCallback lost the kept weights; cannot restore the chosen step.")
        params = dict(model.named_parameters())
        with torch.no_grad():
            for name, value in best.items():
                params[name].copy_(value.to(device=params[name].device, dtype=params[name].dtype))
