"""Tiny memorizing models on the synthetic set, shared by the test suite, the demo and examples.

``tiny_models()`` trains (once, then cached) a TOFU-tiny *target* on all synthetic authors plus
the real-author and world-fact rows, and a *retain reference* on the retain authors only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .data import synthetic_tofu
from .tofu_tiny import TinyRecipe, corpus_texts, recipe_for, train_or_load


@dataclass
class TinyPair:
    """Folders of a cached target model and its retain reference (tokenizer included)."""

    target: Path
    retain: Path
    source: str
    forget_split: str


def tiny_models(
    source: str = "synthetic",
    forget_split: str = "forget10",
    recipe: TinyRecipe | None = None,
    cache_dir: str | os.PathLike | None = None,
    progress: bool = False,
) -> TinyPair:
    """Build or reuse a target/retain-reference pair trained on the synthetic set."""
    from .data import RETAIN_FOR_FORGET, load_tofu_rows

    recipe = recipe or recipe_for("test")
    seed = int(source.split(":", 1)[1]) if ":" in source else 0
    data = synthetic_tofu(seed=seed)
    extra = data["real_authors"] + data["world_facts"]
    texts = corpus_texts(
        data[f"{forget_split}_perturbed"] + data["retain_perturbed"] + data["full"]
        + data["real_authors_perturbed"] + data["world_facts_perturbed"]
    )
    target = train_or_load("target", load_tofu_rows("full", source) + extra, texts, recipe, cache_dir, progress)
    retain_rows = load_tofu_rows(RETAIN_FOR_FORGET[forget_split], source) + extra
    retain = train_or_load("retain", retain_rows, texts, recipe, cache_dir, progress)
    return TinyPair(target, retain, source, forget_split)
