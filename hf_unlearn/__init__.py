"""hf-unlearn: machine unlearning for causal language models, native to the Hugging Face ecosystem.

Importing the package registers its model classes (the T3 classifier head) with the
transformers Auto classes, so ``AutoModel.from_pretrained`` loads them without
``trust_remote_code``.
"""

from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"

METRIC_NAMES = ("tofu_truth_ratio", "tofu_forget_quality", "tofu_model_utility")


def _artifact_dir(name: str) -> Path:
    """Folder of a shipped Hub artifact (``evaluate_metrics`` or ``hub_cards``).

    Installed wheels carry them as ``hf_unlearn.<name>``; a source checkout has them at the
    repository root.
    """
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
    """Folder of the model-card templates shipped with the package."""
    return str(_artifact_dir("hub_cards"))


def _register_t3() -> None:
    """Register the T3 classifier head with AutoConfig/AutoModel (idempotent)."""
    from transformers import AutoConfig, AutoModel

    from .t3.config import T3ClassifierConfig
    from .t3.modeling import T3Classifier

    AutoConfig.register(T3ClassifierConfig.model_type, T3ClassifierConfig, exist_ok=True)
    AutoModel.register(T3ClassifierConfig, T3Classifier, exist_ok=True)


_register_t3()
