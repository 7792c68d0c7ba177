"""One pass of a scoring loop for many candidates: the loop runs once with a scorer that keeps ``per_batch(...)`` of
every batch and returns, at every scored position of row ``r`` of batch ``b``, the code ``c = b * 2^20 + r``
(float64, exact); :meth:`RowBatches.rows_of` maps per-batch ``[B, L]`` scores back to per-row arrays."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from .logprobs import answer_mask

_ROWS_PER_BATCH = 2**20


class RowBatches:
    """Run ``score_rows(scorer)`` once; keep each batch's ``per_batch`` value and inputs, and where each row is."""

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
        return [np.zeros(0) if loc is None else on_cpu[loc[0]][loc[1]][self._masks[loc[0]][loc[1]]].numpy()
                for loc in self.where]
