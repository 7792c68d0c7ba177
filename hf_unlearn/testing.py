"""Tiny memorizing models on the synthetic set, shared by the test suite, the demo and examples."""

from __future__ import annotations

import os

from .tofu_tiny import TinyPair, TinyRecipe, build_tiny_pair

__all__ = ["TinyPair", "tiny_models"]


def tiny_models(
    source: str = "synthetic",
    forget_split: str = "forget10",
    recipe: TinyRecipe | None = None,
    cache_dir: str | os.PathLike | None = None,
    progress: bool = False,
) -> TinyPair:
    """Target (memorizes every author) and retain reference on the synthetic set, test size."""
    return build_tiny_pair(source, forget_split, recipe, cache_dir, progress)
