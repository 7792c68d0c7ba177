"""The cache folder every subject is built into: ``$HF_UNLEARN_CACHE`` or ``~/.cache/hf_unlearn``."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """``$HF_UNLEARN_CACHE`` or ``~/.cache/hf_unlearn``."""
    return Path(os.environ.get("HF_UNLEARN_CACHE", Path.home() / ".cache" / "hf_unlearn"))
