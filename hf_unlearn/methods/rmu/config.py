"""Configuration of the RMU (Representation Misdirection for Unlearning) trainer."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..base.config import BaseUnlearningConfig

#: open-unlearning's ``RMU.yaml``: every parameter is trained.
RMU_ALL_PARAMETERS = ".*"
#: The WMDP authors' choice: the MLP down-projections of the steered layer 7 and the two below it.
RMU_WMDP_PARAMETERS = r"model\.layers\.(5|6|7)\.mlp\.down_proj\.weight"


#: open-unlearning's steered layer and the depth of the 7B models it was chosen for.
REFERENCE_LAYER, REFERENCE_DEPTH = 7, 32


def default_layer(num_layers: int | None) -> int:
    """RMU's default steered layer, ``floor(7 * num_layers / 32)`` (open-unlearning's layer 7 of a 32-layer
    model at the same relative depth); 7 when the depth is unknown."""
    if num_layers is None:
        return REFERENCE_LAYER
    return REFERENCE_LAYER * num_layers // REFERENCE_DEPTH


def decoder_layer_count(model_config: Any) -> int | None:
    """The number of decoder layers of a model config (its text config), ``None`` when it does not say."""
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
    r"""Configuration class for the [`RMUTrainer`].

    RMU steers the forget answers' hidden state at one decoder layer towards a fixed random direction and keeps
    the retain answers' hidden states there where the frozen starting model has them:

    `loss = forget_weight * MSE(h_layer(forget), c * u) + retain_weight * MSE(h_layer(retain), h0_layer(retain))`

    with `u` a random unit vector drawn once from `seed` and `c = steering_coeff`. Defaults: open-unlearning's
    `RMU.yaml`.

    Parameters:
        layer (`int` or `None`, *optional*, defaults to `None`):
            Decoder layer (0-based) whose output hidden state (`output_hidden_states[layer + 1]`) is steered;
            `None`: [`default_layer`] of the model's depth. A layer the model does not have is refused.
        steering_coeff (`float`, defaults to `2.0`): Length `c` of the control vector, `> 0`.
        forget_weight (`float`, defaults to `1.0`): Weight of the forget term, `>= 0`.
        retain_weight (`float`, *optional*, defaults to `1.0`):
            Weight of the retain term, `>= 0`; `0` needs no retain set and no frozen model.
        trainable_params (`str`, *optional*, defaults to `".*"`):
            Regular expression (`re.fullmatch`, with and without PEFT's `base_model.model.` prefix) of the
            parameters trained; the others stay frozen. [`RMU_WMDP_PARAMETERS`] is the WMDP authors' choice. A
            pattern matching no trainable parameter is refused.
    """

    layer: int | None = field(
        default=None,
        metadata={"help": "Decoder layer (0-based) whose output hidden state is steered (default: "
                          "floor(7 * num_hidden_layers / 32))."},
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

    numeric_ranges = {"steering_coeff": "> 0", "forget_weight": ">= 0", "retain_weight": ">= 0"}

    def __post_init__(self):
        if self.layer is not None and (isinstance(self.layer, bool) or not isinstance(self.layer, int)
                                       or self.layer < 0):
            raise ValueError(f"`layer` must be None or an integer >= 0 (a decoder layer index), got {self.layer!r}.")
        try:
            re.compile(self.trainable_params)
        except (re.error, TypeError) as err:
            raise ValueError(f"`trainable_params` is not a regular expression ({err}): {self.trainable_params!r}.") from None
        super().__post_init__()

    def check_layer(self, model_config: Any) -> None:
        """Set an unset ``layer`` from the model's depth, then refuse (``ValueError``) one the model lacks."""
        n = decoder_layer_count(model_config)
        if self.layer is None:
            self.layer = default_layer(n)
        if n is not None and self.layer >= n:
            raise ValueError(
                f"RMU's layer={self.layer} does not exist: the model has {n} decoder layers (0..{n - 1}). Choose "
                f"a layer in 0..{n - 1} (open-unlearning steers layer 7 of a 16-layer or deeper model)."
            )
