"""T3 (Temper-Then-Tilt): inference-time unlearning with a frozen base model and a guidance head. Decode from
``softmax(log p(v | x, y_<t) / T + w log f(x, y_<t, v))``, ``f = sigmoid(U (D pool_t + c))`` a low-rank head on the
causal mean-pooled hidden state of the prefix (``docs/methods/t3.md``).
"""

from ...artifact_kinds import ArtifactKind as _ArtifactKind
from ...artifact_kinds import config_base_model as _config_base_model
from ...artifact_kinds import read_json as _read_json
from ...artifact_kinds import register_artifact_kind as _register_artifact_kind
from ...registry import register_method
from .calibration import calibrate_t3
from .config import T3ClassifierConfig
from .fit import fit_t3
from .modeling import T3Classifier
from .processor import T3LogitsProcessor
from .provenance import t3_integrity_entry as _t3_integrity_entry
from .runner import T3Fit
from .scoring import t3_log_probs, t3_scorer

register_method("t3", config_cls=T3ClassifierConfig, fit=T3Fit())


def _t3_card_settings(head):
    keep = ("rank", "layer", "pooling", "temperature", "tilt_weight", "hidden_size", "vocab_size")
    return {k: getattr(head.config, k) for k in keep if getattr(head.config, k, None) is not None}


_register_artifact_kind(_ArtifactKind(
    "t3_classifier", "t3_classifier.md", "t3", lambda: (T3Classifier,), "transformers",
    base_model=_config_base_model, settings=_t3_card_settings, integrity=_t3_integrity_entry,
    folder_matches=lambda folder: _read_json(folder / "config.json").get("model_type") == T3ClassifierConfig.model_type,
))

__all__ = ["T3Classifier", "T3ClassifierConfig", "T3Fit", "T3LogitsProcessor", "calibrate_t3", "fit_t3",
           "t3_log_probs", "t3_scorer"]
