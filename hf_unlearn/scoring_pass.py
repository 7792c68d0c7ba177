"""One pass of a scoring loop for many candidates: what each batch yields is kept, and the batches map back to rows.

A selection criterion scores its rows with a :data:`~hf_unlearn.logprobs.TokenScorer` in batches of its own making
(tokenization, truncation, length sorting), and returns one array of answer-token log-probabilities per row.
Measuring ``K`` candidates whose scores share an expensive part (a frozen base, the blocks before an edited band)
needs that loop to run once, with each batch's shared part kept. :class:`RowBatches` runs the loop once with a
scorer that calls ``per_batch(input_ids, attention_mask, position_ids, labels)`` and keeps its result; to learn where
each row went it returns, at every scored position of row ``r`` of the ``b``-th batch, the code

    c = b * 2^20 + r          (float64, exact),

so the loop's own output says, for row ``i``, its batch and its place in it. :meth:`RowBatches.rows_of` then turns
any per-batch ``[B, L]`` scores into the per-row arrays the loop would have returned for them: row ``r`` of batch
``b`` at its scored positions (:func:`~hf_unlearn.logprobs.answer_mask`), as float64, the same conversion the loop
applies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from .logprobs import answer_mask

_ROWS_PER_BATCH = 2**20


class RowBatches:
    """Run ``score_rows(scorer)`` (the loop: returns one array per row) once; ``kept[b]`` is ``per_batch(...)`` of
    its ``b``-th batch, ``inputs[b]`` that batch's ``(input_ids, attention_mask, position_ids, labels)`` and
    ``where[i]`` row ``i``'s ``(batch, row in batch)`` (None for a row with no scored token)."""

    def __init__(
        self, score_rows: Callable[[Any], Sequence[np.ndarray]], per_batch: Callable[..., Any]
    ) -> None:
        self.kept: list[Any] = []
        self.inputs: list[tuple[torch.Tensor, ...]] = []
        self._masks: list[torch.Tensor] = []

        def scorer(input_ids, attention_mask, position_ids, labels):
            b = len(self.kept)
            self.kept.append(per_batch(input_ids, attention_mask, position_ids, labels))
            self.inputs.append((input_ids, attention_mask, position_ids, labels))
            self._masks.append(answer_mask(labels).cpu())
            codes = b * _ROWS_PER_BATCH + torch.arange(labels.shape[0], dtype=torch.float64, device=labels.device)
            return codes[:, None].expand(labels.shape)

        self.where = [self._locate(np.asarray(c)) for c in score_rows(scorer)]

    @staticmethod
    def _locate(codes: np.ndarray) -> tuple[int, int] | None:
        if codes.size == 0:
            return None
        code = int(codes[0])
        if not (codes == code).all():
            raise RuntimeError("The scoring loop mixed positions of several rows into one row's scores.")
        return code // _ROWS_PER_BATCH, code % _ROWS_PER_BATCH

    def rows_of(self, per_batch_scores: Sequence[torch.Tensor]) -> list[np.ndarray]:
        """The per-row arrays (float64, scored positions only) of per-batch ``[B, L]`` scores, in row order."""
        if len(per_batch_scores) != len(self.kept):
            raise ValueError(f"{len(per_batch_scores)} batches of scores for {len(self.kept)} batches.")
        on_cpu = [s.detach().double().cpu() for s in per_batch_scores]
        out = []
        for loc in self.where:
            if loc is None:
                out.append(np.zeros(0))
                continue
            b, r = loc
            out.append(on_cpu[b][r][self._masks[b][r]].numpy())
        return out
