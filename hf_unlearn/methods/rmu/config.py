"""Configuration of the RMU (Representation Misdirection for Unlearning) trainer."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from ..base.config import BaseUnlearningConfig

__all__ = ["RMU_ALL_PARAMETERS", "RMU_WMDP_PARAMETERS", "RMUConfig", "decoder_layer_count", "default_layer"]

#: open-unlearning's ``configs/trainer/RMU.yaml``: every parameter is trained (``trainable_params_regex: [.*]``).
RMU_ALL_PARAMETERS = ".*"
#: The WMDP authors' choice (and the default of open-unlearning's ``RMU`` class): the MLP down-projections of
#: the steered layer and the two below it, here for layer 7.
RMU_WMDP_PARAMETERS = r"model\.layers\.(5|6|7)\.mlp\.down_proj\.weight"


#: open-unlearning's (and the WMDP authors') steered layer and the depth of the 7B models it was chosen for.
REFERENCE_LAYER, REFERENCE_DEPTH = 7, 32


def default_layer(num_layers: int | None) -> int:
    """RMU's default steered layer for a model of ``num_layers`` decoder layers: the relative depth of
    open-unlearning's layer 7 in a 32-layer 7B model,

        layer = floor(7 * num_layers / 32)

    so 7 for 32 layers (Llama-2-7B, Zephyr-7B), 3 for 16, 1 for 8 and 0 below 5; 7 when the depth is unknown."""
    if num_layers is None:
        return REFERENCE_LAYER
    return REFERENCE_LAYER * num_layers // REFERENCE_DEPTH


def decoder_layer_count(model_config: Any) -> int | None:
    """The number of decoder layers of a model config (its text config for a multimodal one), ``None`` when the
    config does not say."""
    if model_config is None:
        return None
    text = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    for name in ("num_hidden_layers", "n_layer", "num_layers"):
        value = getattr(text, name, None)
        if isinstance(value, int):
            return value
    return None


@dataclass
class RMUConfig(BaseUnlearningConfig):
    r"""
    Configuration class for the [`RMUTrainer`].

    RMU steers the hidden state of the forget answers at one decoder layer towards a fixed random direction and
    keeps the retain answers' hidden states at that layer where the frozen starting model has them:

    `loss = forget_weight * MSE(h_layer(forget), c * u) + retain_weight * MSE(h_layer(retain), h0_layer(retain))`

    with `u` a random unit vector drawn once from `seed` and `c = steering_coeff`
    ([`~hf_unlearn.methods.rmu.loss.rmu_loss`]). The defaults are open-unlearning's `configs/trainer/RMU.yaml`.

    Parameters:
        layer (`int` or `None`, *optional*, defaults to `None`):
            Decoder layer (0-based) whose output hidden state is steered. `None` takes it from the model's depth:
            `floor(7 * num_hidden_layers / 32)` ([`default_layer`]), the relative depth of open-unlearning's
            `module_regex: model\.layers\.7` in a 32-layer 7B model, so 7 there and a valid layer for a model of
            any depth. It must exist in the model (`0 <= layer < num_hidden_layers`); a
            layer out of range is refused before any work. It is read as transformers'
            `output_hidden_states[layer + 1]`, which for the last layer is the output after the model's final
            norm (open-unlearning's module hook reads it before that norm; for every other layer they agree).
        steering_coeff (`float`, *optional*, defaults to `2.0`):
            Length `c` of the control vector the forget hidden states are pushed to, `> 0` (open-unlearning's
            `RMU.yaml`; its `RMU` class defaults to 20).
        forget_weight (`float`, *optional*, defaults to `1.0`):
            Weight of the forget term (open-unlearning's `gamma`), `>= 0`.
        retain_weight (`float`, *optional*, defaults to `1.0`):
            Weight of the retain term (open-unlearning's `alpha`), `>= 0`; `0` needs no retain set and no frozen
            model.
        trainable_params (`str`, *optional*, defaults to `".*"`):
            Regular expression (`re.fullmatch`) on the parameter names: only the parameters it matches are
            trained, the others are frozen (`requires_grad=False`) for the run and stay frozen on the returned
            model. `".*"` trains every parameter, as open-unlearning's `RMU.yaml`; the WMDP authors train
            `model\.layers\.(5|6|7)\.mlp\.down_proj\.weight` (the down-projections of the steered layer and the
            two below it: [`RMU_WMDP_PARAMETERS`]). With a PEFT adapter the names are matched with and without
            PEFT's `base_model.model.` prefix, and only the adapter's parameters can be trained. A pattern that
            matches no trainable parameter is refused before any work.

    > [!NOTE]
    > Everything else is as in [`BaseUnlearningConfig`] (`learning_rate` `1e-5`, 10 epochs, open-unlearning's
    > trainer defaults for TOFU).
    """

    layer: int | None = field(
        default=None,
        metadata={"help": "Decoder layer (0-based) whose output hidden state is steered; must exist in the model. "
                          "Default: floor(7 * num_hidden_layers / 32), the depth of open-unlearning's "
                          "model.layers.7 in a 32-layer 7B model (7 there)."},
    )
    steering_coeff: float = field(
        default=2.0, metadata={"help": "Length of the random control vector the forget hidden states go to (> 0)."}
    )
    forget_weight: float = field(default=1.0, metadata={"help": "Weight of the forget (steering) term (>= 0)."})
    retain_weight: float = field(
        default=1.0, metadata={"help": "Weight of the retain hidden-state MSE against the frozen model (>= 0)."}
    )
    trainable_params: str = field(
        default=RMU_ALL_PARAMETERS,
        metadata={"help": "Regex (fullmatch) of the parameter names to train; '.*' (default) trains all, the WMDP "
                          r"authors train 'model\.layers\.(5|6|7)\.mlp\.down_proj\.weight'."},
    )

    def __post_init__(self):
        if self.layer is not None and (isinstance(self.layer, bool) or not isinstance(self.layer, int)
                                       or self.layer < 0):
            raise ValueError(f"`layer` must be None or an integer >= 0 (a decoder layer index), got {self.layer!r}.")
        if not 0 < self.steering_coeff < math.inf:
            raise ValueError(f"`steering_coeff` must be a finite number > 0, got {self.steering_coeff}.")
        for name in ("forget_weight", "retain_weight"):
            if not 0 <= getattr(self, name) < math.inf:
                raise ValueError(f"`{name}` must be a finite number >= 0, got {getattr(self, name)}.")
        try:
            re.compile(self.trainable_params)
        except (re.error, TypeError) as err:
            raise ValueError(f"`trainable_params` is not a regular expression ({err}): {self.trainable_params!r}.") from None
        super().__post_init__()

    def check_layer(self, model_config: Any) -> None:
        """Set an unset ``layer`` from the model's depth (:func:`default_layer`), then refuse (``ValueError``) a
        ``layer`` the model does not have."""
        n = decoder_layer_count(model_config)
        if self.layer is None:
            self.layer = default_layer(n)
        if n is not None and self.layer >= n:
            raise ValueError(
                f"RMU's layer={self.layer} does not exist: the model has {n} decoder layers (0..{n - 1}). Choose "
                f"a layer in 0..{n - 1} (open-unlearning steers layer 7 of a 16-layer or deeper model)."
            )
