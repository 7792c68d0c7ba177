"""hf-unlearn: machine unlearning for causal language models, native to the Hugging Face ecosystem. The top level
is lazy (TRL's ``_LazyModule``): ``import hf_unlearn`` imports neither torch nor transformers' model code. The T3
head is registered with the Auto classes once they are imported (loaded without ``trust_remote_code``)."""

from __future__ import annotations

import sys

from ._import_utils import _LazyModule, call_after_import
from .assets import METRIC_NAMES, __version__, hub_cards_dir, metric_path

_import_structure = {
    "methods.base": ["UnlearningConfig", "UnlearningTrainer"],
    "methods.baselines": [
        "BaselineTrainer", "GradAscentConfig", "GradAscentTrainer", "GradDiffConfig", "GradDiffTrainer", "NPOConfig",
        "NPOTrainer", "SimNPOConfig", "SimNPOTrainer", "WGAConfig", "WGATrainer", "SatImpConfig", "SatImpTrainer",
        "CEUConfig", "CEUTrainer", "UNDIALConfig", "UNDIALTrainer", "UnlearnDPOConfig", "UnlearnDPOTrainer",
        "IdkDPOConfig", "IdkDPOTrainer",
    ],
    "methods.masc": ["MASCConfig", "MASCTrainer"],
    "methods.atwu": ["ATWUConfig", "ATWUTrainer", "ATWUTokenWeighter"],
    "methods.rmu": ["RMUConfig", "RMUTrainer"],
    "methods.pdu": ["PDUConfig", "PDUTrainer"],
    "methods.grom": ["GROMConfig", "GROMEdit", "GROMPath", "fit_grom", "fit_grom_path"],
    "methods.t3": ["T3ClassifierConfig", "T3Classifier", "T3LogitsProcessor", "calibrate_t3", "fit_t3", "t3_scorer"],
    "selection": ["SelectionCallback", "SelectionCriterion", "SelectionRecord"],
    "evaluation": ["TOFUReport", "evaluate_tofu", "quantization_attack", "relearning_attack"],
    "result": ["Unlearned"],
    "run": ["TrainOptions", "UnlearnRequest", "fit_or_train", "prepare_inputs", "unlearn"],
    "data": ["PromptTemplate", "load_tofu"],
    "hub": ["push_unlearned"],
}


def _register_t3() -> None:
    from transformers import AutoConfig, AutoModel

    from .methods.t3.config import T3ClassifierConfig
    from .methods.t3.modeling import T3Classifier

    AutoConfig.register(T3ClassifierConfig.model_type, T3ClassifierConfig, exist_ok=True)
    AutoModel.register(T3ClassifierConfig, T3Classifier, exist_ok=True)


# The Auto classes import torch: register when transformers imports them (now, if it already has).
call_after_import("transformers.models.auto.modeling_auto", _register_t3)

sys.modules[__name__] = _LazyModule(
    __name__, globals()["__file__"], _import_structure, module_spec=__spec__,
    extra_objects={"__version__": __version__, "__doc__": __doc__, "METRIC_NAMES": METRIC_NAMES,
                   "metric_path": metric_path, "hub_cards_dir": hub_cards_dir},
)
