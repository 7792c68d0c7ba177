"""The package's version and the assets it ships beside its code (the ``evaluate`` metric modules and the
model-card templates). Standard library only, so that every layer can read them."""

from __future__ import annotations

from pathlib import Path

__all__ = ["METRIC_NAMES", "__version__", "hub_cards_dir", "metric_path"]

__version__ = "0.1.0"

#: The ``evaluate`` metric modules the package ships.
METRIC_NAMES = (
    "tofu_truth_ratio", "tofu_forget_quality", "tofu_model_utility", "tofu_privleak",
    "muse_verbmem", "muse_knowmem", "muse_privleak",
)


def _artifact_dir(name: str) -> Path:
    """Folder of a shipped asset: ``hf_unlearn.<name>`` in a wheel, the repository root in a checkout."""
    import importlib.util

    spec = importlib.util.find_spec(f"hf_unlearn.{name}")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(__file__).resolve().parent.parent / name


def metric_path(name: str) -> str:
    """Local folder of one of the package's ``evaluate`` metric modules, for ``evaluate.load``."""
    if name not in METRIC_NAMES:
        raise ValueError(f"Unknown metric {name!r}; the package ships {list(METRIC_NAMES)}.")
    path = _artifact_dir("evaluate_metrics") / name
    if not (path / f"{name}.py").is_file():
        raise FileNotFoundError(f"Metric module {name} is missing from {path}; reinstall hf-unlearn.")
    return str(path)


def hub_cards_dir() -> str:
    return str(_artifact_dir("hub_cards"))
