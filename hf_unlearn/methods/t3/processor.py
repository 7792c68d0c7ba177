"""``T3LogitsProcessor``: Temper-Then-Tilt decoding through ``model.generate(logits_processor=...)``,

    s_v = log_softmax(scores)_v / T + w * max(log sigmoid(g_t[v]), floor),    g_t = U (D pool_t + c),

``pool_t`` a running mean of the hidden states a hook reads from ``generate``'s own passes.
"""

from __future__ import annotations

import inspect
import math
import weakref
from typing import Any

import torch
import torch.nn.functional as F
from transformers import LogitsProcessor

from ...devices import device_of
from .hidden import HiddenStateHook, model_max_positions
from .modeling import T3Classifier
from .tilt import tilted_scores


def validate_t3_arguments(
    temperature: float, tilt_weight: float, allow_temperature_below_one: bool = False, log_f_floor: float | None = None
) -> None:
    """Refuse a non-finite or ``< 1`` ``T`` (unless allowed), a non-finite ``w``, a floor ``>= 0``."""
    if isinstance(temperature, bool) or not math.isfinite(float(temperature)) or float(temperature) <= 0:
        raise ValueError(f"temperature must be a finite positive number, got {temperature!r}.")
    if float(temperature) < 1.0 and not allow_temperature_below_one:
        raise ValueError(f"temperature={temperature} < 1: T3 tempers with T >= 1 (T < 1 sharpens the peaks it is meant "
                         "to flatten); pass allow_temperature_below_one=True to use it anyway.")
    if isinstance(tilt_weight, bool) or not math.isfinite(float(tilt_weight)):
        raise ValueError(f"tilt_weight must be a finite number, got {tilt_weight!r}.")
    if log_f_floor is not None and (
        isinstance(log_f_floor, bool) or not math.isfinite(float(log_f_floor)) or float(log_f_floor) >= 0
    ):
        raise ValueError(f"log_f_floor must be a finite negative number or None, got {log_f_floor!r}.")


class T3LogitsProcessor(LogitsProcessor):
    """Temper-Then-Tilt as a ``LogitsProcessor`` on ``model``, the base ``classifier`` was fitted on (another is
    refused); the settings default to the head's. Works with greedy decoding, sampling (at ``generate``'s temperature
    1), left padding, the KV cache and beam search; the hooks stay until :meth:`close` or the ``with`` block's end.
    """

    def __init__(
        self, model: Any, classifier: T3Classifier, temperature: float | None = None, tilt_weight: float | None = None,
        *, log_f_floor: float | None = None, allow_temperature_below_one: bool = False, check_base_weights: bool = True,
    ) -> None:
        temperature = classifier.config.temperature if temperature is None else temperature
        tilt_weight = classifier.config.tilt_weight if tilt_weight is None else tilt_weight
        log_f_floor = classifier.config.log_f_floor if log_f_floor is None else log_f_floor
        validate_t3_arguments(temperature, tilt_weight, allow_temperature_below_one, log_f_floor)
        classifier.check_finite()
        classifier.check_base(model, check_weights=check_base_weights)
        self.model = model
        self.classifier = classifier.to(device=device_of(model), dtype=torch.float32).eval()
        self._down, self._offset, self._up = classifier.down.weight, classifier.down.bias, classifier.up.weight
        self.temperature = float(temperature)
        self.tilt_weight = float(tilt_weight)
        self.log_f_floor = None if log_f_floor is None else float(log_f_floor)
        self.layer = int(classifier.config.layer)
        self.vocab_size = int(classifier.config.vocab_size)
        self.max_positions = model_max_positions(model)
        self._hook: HiddenStateHook | None = None
        self.attach()

    @classmethod
    def from_pretrained(
        cls, model: Any, repo_or_dir: str, *, temperature: float | None = None, tilt_weight: float | None = None,
        log_f_floor: float | None = None, allow_temperature_below_one: bool = False, check_base_weights: bool = True,
        **load_kwargs: Any,
    ) -> T3LogitsProcessor:
        """The processor of a saved or pushed head (``load_kwargs`` go to its ``from_pretrained``)."""
        classifier = T3Classifier.from_pretrained(repo_or_dir, **load_kwargs)
        return cls(
            model, classifier, temperature, tilt_weight, log_f_floor=log_f_floor,
            allow_temperature_below_one=allow_temperature_below_one, check_base_weights=check_base_weights,
        )

    def _record(self, hidden: torch.Tensor, mask: torch.Tensor | None) -> None:
        """Sum the hidden states of the positions one forward encoded (padding excluded)."""
        q = hidden.shape[1]
        if mask is None:
            m = torch.ones(hidden.shape[:2], device=hidden.device, dtype=torch.float32)
        else:
            m = mask[:, -q:].to(device=hidden.device, dtype=torch.float32)
        total = torch.bmm(m.unsqueeze(1), hidden.float()).squeeze(1)  # sum_q m_q h_q per sequence
        self._pending = (total, m.sum(1), q)

    def reset(self) -> None:
        """Drop the running sums; the next step must come from a forward over the whole input."""
        self._pending: tuple[torch.Tensor, torch.Tensor, int] | None = None
        self._sum: torch.Tensor | None = None
        self._count: torch.Tensor | None = None
        self._ids: torch.Tensor | None = None

    def _follow_reordering(self, input_ids: torch.Tensor, n: int) -> torch.Tensor | None:
        """Index of the previous sequence each current one continues (beam search reorders them)."""
        prefix = input_ids[:, :n]
        if torch.equal(prefix, self._ids):
            return None
        same = (prefix.unsqueeze(1) == self._ids.unsqueeze(0)).all(-1)
        if not bool(same.any(1).all()):
            raise RuntimeError("T3LogitsProcessor: the input does not continue the previous step's sequences; call "
                               "processor.reset() before reusing it on other sequences.")
        return same.float().argmax(1)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._hook is None:
            raise RuntimeError("T3LogitsProcessor was closed (its hooks are removed); call attach() first.")
        pending, self._pending = self._pending, None
        if pending is None:
            raise RuntimeError("T3LogitsProcessor: its hook saw no forward pass of the base model before this step; use "
                               "it in `generate` of the model it was built with.")
        if scores.shape[-1] != self.vocab_size:
            raise ValueError(f"scores have {scores.shape[-1]} entries but the T3 head {self.vocab_size}.")
        total, count, q = pending
        batch, length = input_ids.shape
        if total.shape[0] != batch:
            raise RuntimeError(f"T3LogitsProcessor: the last forward encoded {total.shape[0]} sequences but generate "
                               f"passed {batch}.")
        if q == length:  # a forward over the whole input: a new generate call (or a re-encoding)
            self._sum, self._count = total, count
        elif self._ids is not None and self._ids.shape[0] == batch and q == length - self._ids.shape[1]:
            order = self._follow_reordering(input_ids, self._ids.shape[1])
            if order is not None:
                self._sum, self._count = self._sum[order], self._count[order]
            self._sum = self._sum + total
            self._count = self._count + count
        else:
            expected = length if self._ids is None else f"{length} or {length - self._ids.shape[1]}"
            raise RuntimeError(f"T3LogitsProcessor: the last forward encoded {q} positions, expected {expected} for an "
                               f"input of {length} tokens (another input, or a prefilled cache).")
        self._ids = input_ids
        pooled = self._sum / self._count.clamp_min(1.0).unsqueeze(-1)
        # g = U (D pool + c), called on the weights directly (no module dispatch: this runs every step).
        guidance = F.linear(F.linear(pooled, self._down, self._offset), self._up)
        return tilted_scores(scores, guidance, self.temperature, self.tilt_weight, self.log_f_floor).to(scores.dtype)

    def attach(self) -> None:
        """Register the forward hooks on the base model (done by the constructor; idempotent)."""
        self.reset()
        if self._hook is not None:
            return
        ref = weakref.ref(self)

        def on_forward(hidden: torch.Tensor, mask: torch.Tensor | None) -> None:
            proc = ref()
            if proc is not None:
                proc._record(hidden, mask)

        self._hook = HiddenStateHook(self.model, self.layer, on_forward, max_positions=self.max_positions)
        self._finalizer = weakref.finalize(self, self._hook.remove)

    def close(self) -> None:
        """Remove the forward hooks from the base model (idempotent; :meth:`attach` registers them again)."""
        if self._hook is not None:
            self._hook.remove()
            self._finalizer.detach()
            self._hook = None
        self.reset()

    def __enter__(self) -> T3LogitsProcessor:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# ``LogitsProcessorList`` calls ``inspect.signature(processor.__call__)`` for every processor at every step; a
# signature stored on the function is returned without re-deriving it (a measurable share of a small model's step).
T3LogitsProcessor.__call__.__signature__ = inspect.signature(T3LogitsProcessor.__call__)
