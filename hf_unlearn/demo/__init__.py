"""The demo: tiny models trained from scratch on TOFU-shaped text, and every method compared on them."""

from __future__ import annotations

from .compare import DEMO_COLUMNS, forget_rows_with_other_answers, run_demo, write_demo_results
from .references import format_gate, reference_rows, sanity_gate
from .settings import demo_methods, demo_settings
from .tofu_tiny import (
    TinyPair,
    TinyRecipe,
    build_tiny_pair,
    default_cache_dir,
    load_tiny,
    recipe_for,
    tiny_models,
)

__all__ = [
    "DEMO_COLUMNS", "TinyPair", "TinyRecipe", "build_tiny_pair", "default_cache_dir", "demo_methods", "demo_settings",
    "forget_rows_with_other_answers", "format_gate", "load_tiny", "recipe_for", "reference_rows", "run_demo",
    "sanity_gate", "tiny_models", "write_demo_results",
]
