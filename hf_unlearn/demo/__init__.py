"""The demo: tiny models trained from scratch on TOFU-shaped text, and every method compared on them.

- :mod:`.tofu_tiny`: TOFU-tiny, a small ``LlamaForCausalLM`` (with its own byte-level BPE tokenizer) trained on
  the question/answer text of every author (the *target*) and of the retain authors only (the *retain
  reference*), built once into a cache: :func:`build_tiny_pair`, :func:`load_tiny`.
- :mod:`.references`: the target and the retain reference evaluated on TOFU, and the sanity gate that makes the
  comparison meaningful: :func:`reference_rows`, :func:`sanity_gate`.
- :mod:`.settings`: each method's demo setting (``settings.toml``): :func:`demo_settings`.
- :mod:`.compare`: ``hf-unlearn demo``'s comparison: :func:`run_demo`, :func:`write_demo_results`.
"""

from __future__ import annotations

from .compare import DEMO_COLUMNS, demo_table, forget_rows_with_other_answers, run_demo, write_demo_results
from .references import format_gate, reference_rows, sanity_gate
from .settings import demo_methods, demo_settings
from .tofu_tiny import (
    CACHE_ENV,
    TinyPair,
    TinyRecipe,
    build_tiny_llama,
    build_tiny_pair,
    default_cache_dir,
    fit_causal_lm,
    load_tiny,
    recipe_for,
    tiny_models,
    train_bpe_tokenizer,
)

__all__ = [
    "CACHE_ENV",
    "DEMO_COLUMNS",
    "TinyPair",
    "TinyRecipe",
    "build_tiny_llama",
    "build_tiny_pair",
    "default_cache_dir",
    "demo_methods",
    "demo_settings",
    "demo_table",
    "fit_causal_lm",
    "forget_rows_with_other_answers",
    "format_gate",
    "load_tiny",
    "recipe_for",
    "reference_rows",
    "run_demo",
    "sanity_gate",
    "tiny_models",
    "train_bpe_tokenizer",
    "write_demo_results",
]
