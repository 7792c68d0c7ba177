"""A Trainer callback that scores the model at the checkpoints a selection callback measures."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback


class CheckpointProbe(TrainerCallback):
    """Score the model (``score(model)``) at every checkpoint a :class:`~hf_unlearn.selection.SelectionCallback`
    with the same ``selection_steps`` measures: step 0, every ``selection_steps`` optimizer steps, and the last step
    (before the selection restores the chosen weights, when the probe is listed first). ``scores[step]`` is what
    ``score`` returned, ``seconds[step]`` the time it took; ``report(step, score)``, if given, is called after each;
    the model's train/eval mode is kept."""

    def __init__(self, score: Callable[[Any], Any], selection_steps: int,
                 report: Callable[[int, Any], None] | None = None) -> None:
        self.score, self.selection_steps, self.report = score, int(selection_steps), report
        self.scores: dict[int, Any] = {}
        self.seconds: dict[int, float] = {}

    def _probe(self, state: Any, model: Any) -> None:
        step = int(state.global_step)
        if step in self.scores:
            return
        training, start = model.training, time.perf_counter()
        model.eval()
        try:
            self.scores[step] = self.score(model)
        finally:
            model.train(training)
        self.seconds[step] = time.perf_counter() - start
        if self.report is not None:
            self.report(step, self.scores[step])

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._probe(state, model)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.selection_steps == 0:
            self._probe(state, model)

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self._probe(state, model)
