"""hf-unlearn: machine unlearning for causal language models, native to the Hugging Face ecosystem.

The top level is lazy (TRL's ``_LazyModule`` pattern): ``import hf_unlearn`` imports neither torch
nor transformers' model code; each exported name is imported from its submodule when first used::

    from hf_unlearn import NPOTrainer, UnlearningConfig, evaluate_tofu

The T3 classifier head is registered with the transformers Auto classes as soon as they are imported, so
``AutoModel.from_pretrained`` loads a saved head without ``trust_remote_code``. Each method lives in one folder,
``hf_unlearn.methods.<name>``; :func:`hf_unlearn.run.fit_or_train` runs any of them.
"""

# ruff: noqa: F401  (the TYPE_CHECKING imports are re-exports)

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

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

if TYPE_CHECKING:  # for type checkers and IDEs; at run time the names resolve lazily
    from .data import PromptTemplate, load_tofu
    from .evaluation import TOFUReport, evaluate_tofu, quantization_attack, relearning_attack
    from .hub import push_unlearned
    from .methods.atwu import ATWUConfig, ATWUTokenWeighter, ATWUTrainer
    from .methods.base import UnlearningConfig, UnlearningTrainer
    from .methods.baselines import (
        BaselineTrainer,
        CEUConfig,
        CEUTrainer,
        GradAscentConfig,
        GradAscentTrainer,
        GradDiffConfig,
        GradDiffTrainer,
        IdkDPOConfig,
        IdkDPOTrainer,
        NPOConfig,
        NPOTrainer,
        SatImpConfig,
        SatImpTrainer,
        SimNPOConfig,
        SimNPOTrainer,
        UNDIALConfig,
        UNDIALTrainer,
        UnlearnDPOConfig,
        UnlearnDPOTrainer,
        WGAConfig,
        WGATrainer,
    )
    from .methods.grom import GROMConfig, GROMEdit, GROMPath, fit_grom, fit_grom_path
    from .methods.masc import MASCConfig, MASCTrainer
    from .methods.pdu import PDUConfig, PDUTrainer
    from .methods.rmu import RMUConfig, RMUTrainer
    from .methods.t3 import (
        T3Classifier,
        T3ClassifierConfig,
        T3LogitsProcessor,
        calibrate_t3,
        fit_t3,
        t3_scorer,
    )
    from .result import Unlearned
    from .run import TrainOptions, UnlearnRequest, fit_or_train, prepare_inputs, unlearn
    from .selection import SelectionCallback, SelectionCriterion, SelectionRecord


def _register_t3() -> None:
    """Register the T3 classifier head with AutoConfig/AutoModel (idempotent)."""
    from transformers import AutoConfig, AutoModel

    from .methods.t3.config import T3ClassifierConfig
    from .methods.t3.modeling import T3Classifier

    AutoConfig.register(T3ClassifierConfig.model_type, T3ClassifierConfig, exist_ok=True)
    AutoModel.register(T3ClassifierConfig, T3Classifier, exist_ok=True)


# The Auto classes import torch: register when transformers imports them (now, if it already has).
call_after_import("transformers.models.auto.modeling_auto", _register_t3)

sys.modules[__name__] = _LazyModule(
    __name__,
    globals()["__file__"],
    _import_structure,
    module_spec=__spec__,
    extra_objects={
        "__version__": __version__,
        "__doc__": __doc__,
        "METRIC_NAMES": METRIC_NAMES,
        "metric_path": metric_path,
        "hub_cards_dir": hub_cards_dir,
    },
)
