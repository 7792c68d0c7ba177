"""Forget/retain pairing: which retain example accompanies each forget example in a batch."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any


def retain_partner_indices(num_forget: int, num_retain: int, seed: int = 0, epoch: int = 0) -> list[int]:
    """For each forget index, the index of the retain example paired with it in ``epoch``.

    Retain examples are drawn without replacement from a seeded permutation (cycled when the
    retain set is smaller than the forget set), and a new permutation is drawn each epoch, so over
    epochs the forget set meets all of the retain set.
    """
    if num_forget < 1:
        raise ValueError("The forget set is empty: nothing to unlearn.")
    if num_retain < 1:
        raise ValueError("The retain set is empty: a retain example is needed for each forget example.")
    rng = random.Random(seed * 1_000_003 + epoch)
    order = list(range(num_retain))
    rng.shuffle(order)
    return [order[i % num_retain] for i in range(num_forget)]


def overlapping_examples(
    forget: Sequence[dict[str, Any]], retain: Sequence[dict[str, Any]], keys: tuple[str, ...] | None = None
) -> int:
    """Number of forget examples that also occur in the retain set (same values for ``keys``; default
    ``("question", "answer")``, or ``("text",)`` when the forget examples are documents, ``{"text"}`` rows)."""
    if keys is None:
        documents = bool(forget) and all(isinstance(r, dict) and set(r) == {"text"} for r in forget)
        keys = ("text",) if documents else ("question", "answer")
    seen = {tuple(str(r.get(k)) for k in keys) for r in retain}
    return sum(tuple(str(f.get(k)) for k in keys) in seen for f in forget)
