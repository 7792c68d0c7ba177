"""The baselines: GradAscent, GradDiff, NPO, SimNPO (``trainer.py``), WGA, SatImp, CE-U, UNDIAL
(``token_trainer.py``), DPO and IdkDPO (``dpo.py``)."""

from ...registry import register_method
from .config import (
    CEUConfig,
    GradAscentConfig,
    GradDiffConfig,
    IdkDPOConfig,
    NPOConfig,
    SatImpConfig,
    SimNPOConfig,
    UNDIALConfig,
    UnlearnDPOConfig,
    WGAConfig,
)
from .dpo import IdkDPOTrainer, UnlearnDPOTrainer
from .token_trainer import CEUTrainer, SatImpTrainer, UNDIALTrainer, WGATrainer
from .trainer import BaselineTrainer, GradAscentTrainer, GradDiffTrainer, NPOTrainer, SimNPOTrainer

for _name, _trainer in (("grad_ascent", GradAscentTrainer), ("grad_diff", GradDiffTrainer), ("npo", NPOTrainer),
                        ("simnpo", SimNPOTrainer), ("wga", WGATrainer), ("satimp", SatImpTrainer), ("ceu", CEUTrainer),
                        ("undial", UNDIALTrainer), ("dpo", UnlearnDPOTrainer), ("idk_dpo", IdkDPOTrainer)):
    register_method(_name, config_cls=_trainer.config_class, trainer_cls=_trainer)
del _name, _trainer

__all__ = [
    "BaselineTrainer", "CEUConfig", "CEUTrainer", "GradAscentConfig", "GradAscentTrainer", "GradDiffConfig",
    "GradDiffTrainer", "IdkDPOConfig", "IdkDPOTrainer", "NPOConfig", "NPOTrainer", "SatImpConfig", "SatImpTrainer",
    "SimNPOConfig", "SimNPOTrainer", "UNDIALConfig", "UNDIALTrainer", "UnlearnDPOConfig", "UnlearnDPOTrainer",
    "WGAConfig", "WGATrainer",
]
