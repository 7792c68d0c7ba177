"""Overlap between two sets of examples: how many forget examples also occur in another set (retain, holdout)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


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
