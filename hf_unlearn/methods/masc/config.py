"""Configuration of the MASC (Margin Self-Correction) trainer."""

from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass, field
from typing import Any

from transformers.trainer_utils import SchedulerType

from ..base.config import BaseUnlearningConfig
from .loss import MASC_CONFIRM_RULES, masc_probability_from_threshold

MASC_HINGES = ("buffered", "plain")
MASC_PENALTIES = ("continuation", "full")
MASC_STOP_PROBES = ("train", "heldout")
MASC_EPOCH_LENGTHS = ("forget", "max(forget,retain)")
# The step budget (a ceiling): the authors' longest TOFU run, 3 epochs of 1,800 steps.
MASC_DEFAULT_MAX_STEPS = 5400
# The authors' two TOFU recipes: their Qwen2.5 runs ("small") and their Llama-2-7B-chat script ("llama2-7b").
MASC_RECIPES: dict[str, dict[str, Any]] = {
    "small": {
        "forget_weight": 0.1, "margin_probability": 0.5, "buffer_eta": 0.5, "retain_weight": 1.0,
        "stop_trigger": 0.2, "stop_tolerance": 0.2, "confirm_examples": 64,
    },
    "llama2-7b": {
        "forget_weight": 0.05, "margin_probability": 0.7, "buffer_eta": 0.25, "retain_weight": 0.0,
        "stop_trigger": 0.475, "stop_tolerance": 0.475, "confirm_examples": 32,
    },
}
MASC_RECIPE_CHOICES = ("auto", *MASC_RECIPES)
#: ``recipe="auto"``: models with fewer parameters than this get the "small" recipe, the others "llama2-7b".
MASC_SMALL_MODEL_MAX_PARAMETERS = 2_000_000_000


def masc_recipe_for(num_parameters: int) -> str:
    """The recipe ``"auto"`` resolves to: ``"small"`` below :data:`MASC_SMALL_MODEL_MAX_PARAMETERS`, else
    ``"llama2-7b"``."""
    return "small" if int(num_parameters) < MASC_SMALL_MODEL_MAX_PARAMETERS else "llama2-7b"


def config_parameter_count(config: Any) -> int:
    """Parameters of a decoder-only transformer from its config alone,
    ``N = V*H*(1 + [not tie_word_embeddings]) + L*(H*d*(2*n_q + 2*n_kv) + 3*H*I + 2*H) + H``."""
    from ...model_shape import ModelShape, parameter_count

    return parameter_count(ModelShape.from_config(config))


def model_parameter_count(model: Any) -> int:
    """Parameters of ``model`` (a module, name or path) as ``recipe="auto"`` counts them: from its config when
    it has one, so that a partitioned or 4-bit model counts at full size; else its non-LoRA parameters."""
    if isinstance(model, (str, os.PathLike)):
        from transformers import AutoConfig

        return config_parameter_count(AutoConfig.from_pretrained(model, trust_remote_code=False))
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    if config is not None and hasattr(config, "hidden_size"):
        return config_parameter_count(config)
    return sum(p.numel() for name, p in base.named_parameters() if "lora_" not in name)


@dataclass
class MASCConfig(BaseUnlearningConfig):
    r"""Configuration class for the [`MASCTrainer`].

    MASC pushes the *restricted margin* of forget answer tokens,
    `m_t = beta * z(y_t) - logsumexp_{v in top-k(z) \ y_t} beta * z(v)` (`z` the logits, the `k` rivals chosen
    without gradient), below `tau = log(rho / (1 - rho))`, and stops by itself. Loss of a step:
    `forget_weight * (1/|A|) sum_{t in A} relu(m_t - (tau - eta)) / eta` over the active positions `A`, plus
    `retain_weight * KL(pi_0 || pi_theta)` on retain answers (`pi_0`: the model with its LoRA adapter disabled).

    Stopping rule (`stop_probe="train"`): every `check_every` steps, when the mean per-example violation rate
    (share of active tokens with `m_t > tau`) of the first `stop_probe_batches` forget batches is
    `<= stop_trigger`, the `confirm_rule` statistic (mean, or its anytime Hoeffding bound
    `mean + sqrt(log(1/delta_j) / (2 n))`, `delta_j = 6 delta / (pi^2 (j + 1)^2)`) of the first `confirm_examples`
    forget examples stops the run when `<= stop_tolerance`. `stop_probe="heldout"`: the pooled violation rate of
    a held-out slice `<= stop_tolerance`. With `calibrate_stop` and never-seen rows, both thresholds become the
    starting model's violation rate on them. `max_steps` is a ceiling (`stop_reason="budget"`).

    The seven recipe fields default to `None` and take the value of `recipe` ([`MASC_RECIPES`]; `"auto"` picks by
    the model's parameter count); a value given explicitly wins.

    Parameters:
        recipe (`str`, defaults to `"auto"`): `"small"`, `"llama2-7b"` or `"auto"`.
        top_k (`int`, defaults to `10`): Number of rival tokens `k`, in `[1, vocab_size - 1]`.
        margin_beta (`float`, defaults to `1.0`): Inverse temperature `beta` of the margin, `> 0`.
        margin_probability (`float`): Threshold as a restricted probability `rho` in `(0, 1)`.
        margin_threshold (`float`): Threshold `tau` given directly; replaces `margin_probability`.
        forget_weight (`float`): Weight `lambda_fg` of the hinge term, `> 0`.
        hinge (`str`, *optional*, defaults to `"buffered"`):
            `"buffered"`: `relu(m_t - (tau - eta)) / eta`; `"plain"`: `relu(m_t - tau)`.
        buffer_eta (`float`): Buffer `eta > 0` of the buffered hinge.
        penalty (`str`, *optional*, defaults to `"continuation"`):
            `"continuation"`: the answer suffix after a random cut counts; `"full"`: the whole answer.
        continuation_cut_min_ratio (`float`, *optional*, defaults to `0.2`), continuation_cut_max_ratio (`float`,
        *optional*, defaults to `0.6`):
            The range of the uniform cut ratio.
        continuation_min_prefix_tokens (`int`, *optional*, defaults to `8`), continuation_min_suffix_tokens (`int`,
        *optional*, defaults to `8`):
            Answer tokens always kept before the cut, and always penalised after it.
        retain_weight (`float`): Weight of `KL(pi_0 || pi_theta)` on retain answer tokens, `>= 0`.
        epoch_length (`str`, *optional*, defaults to `"forget"`):
            `"forget"`: one pass over the forget set; `"max(forget,retain)"`: the smaller set cycled over the larger.
        stop_probe (`str`, *optional*, defaults to `"train"`):
            `"train"`: the two-stage rule; `"heldout"`: the single-stage held-out rule.
        confirm_rule (`str`, defaults to `"mean"`): Stage-2 statistic: `"mean"` or `"hoeffding"`.
        check_every (`int`, defaults to `2`): Check the rule every `check_every` optimizer steps.
        stop_trigger (`float`): Stage 1 arms the confirmation when the mean violation rate is `<=` this.
        stop_probe_batches (`int`, defaults to `2`): Stage-1 probe size in training batches.
        confirm_examples (`int`): Stage-2 probe size in forget training examples.
        confirm_delta (`float`, *optional*, defaults to `0.05`):
            Failure probability `delta` of the Hoeffding bound, in `(0, 1)`.
        stop_tolerance (`float`): `alpha` in `(0, 1)`: stop when the statistic is `<= alpha`.
        validation_fraction (`float`, *optional*, defaults to `0.1`), min_validation_positions (`int`, *optional*,
        defaults to `20`):
            `stop_probe="heldout"`: the fraction of the forget set held out, and the least answer positions it needs
            (with `ceil(1 / alpha)`).
        calibrate_stop (`bool`, *optional*, defaults to `True`):
            Calibrate the thresholds on never-seen rows when the run has them.
        use_peft (`bool`, *optional*, defaults to `True`):
            Build a LoRA adapter when the trainer gets no `peft_config` (TRL's `ModelConfig` names below).
        lora_r (`int`, defaults to `16`), lora_alpha (`int`, defaults to `32`), lora_dropout (`float`, defaults
        to `0.05`):
            LoRA rank `>= 1`, alpha `> 0` and dropout in `[0, 1)`.
        lora_target_modules (`list[str]`, *optional*, defaults to `["q_proj", "k_proj", "v_proj", "o_proj"]`):
            Modules that get an adapter.

    """

    # Defaults overridden from the base (the authors' TOFU run)
    learning_rate: float = field(default=1e-4, metadata={"help": "Initial learning rate (authors' TOFU run: 1e-4)."})
    lr_scheduler_type: SchedulerType | str = field(
        default="constant", metadata={"help": "Learning-rate schedule (authors' TOFU run: constant)."}
    )
    max_steps: int = field(
        default=MASC_DEFAULT_MAX_STEPS,
        metadata={"help": "Step budget, a ceiling: the stopping rule normally ends the run first (-1: epochs)."},
    )
    num_train_epochs: float = field(default=3.0, metadata={"help": "Epoch budget when max_steps=-1 (authors: 3)."})
    per_device_train_batch_size: int = field(default=2, metadata={"help": "Batch size per device (authors: 2)."})
    weight_decay: float = field(default=0.0, metadata={"help": "Weight decay for AdamW (authors: 0)."})
    max_grad_norm: float = field(
        default=0.0, metadata={"help": "Gradient clipping norm; 0 (the default, as the authors) clips nothing."}
    )

    # The recipe
    recipe: str = field(
        default="auto",
        metadata={"help": "The recipe of the unset fields: 'small', 'llama2-7b' or 'auto' (< 2B parameters: 'small').",
                  "choices": list(MASC_RECIPE_CHOICES)},
    )

    # The margin
    top_k: int = field(default=10, metadata={"help": "Number k of rival tokens in the restricted margin."})
    margin_beta: float = field(default=1.0, metadata={"help": "Inverse temperature beta inside the margin."})
    margin_probability: float | None = field(
        default=None, metadata={"help": "Threshold as restricted probability rho (None: the recipe's)."}
    )
    margin_threshold: float | None = field(
        default=None, metadata={"help": "Threshold tau given directly (replaces margin_probability when set)."}
    )

    # The loss
    forget_weight: float | None = field(
        default=None, metadata={"help": "Weight lambda_fg of the forget hinge term (None: the recipe's)."}
    )
    hinge: str = field(
        default="buffered",
        metadata={"help": "'buffered': relu(m - (tau - eta)) / eta; 'plain': relu(m - tau).", "choices": list(MASC_HINGES)},
    )
    buffer_eta: float | None = field(
        default=None, metadata={"help": "Buffer eta of the buffered hinge, > 0 (None: the recipe's)."}
    )
    penalty: str = field(
        default="continuation",
        metadata={"help": "'continuation': loss on the answer suffix after a random cut; 'full': whole answer.",
                  "choices": list(MASC_PENALTIES)},
    )
    continuation_cut_min_ratio: float = field(default=0.2, metadata={"help": "Lower end of the random cut ratio."})
    continuation_cut_max_ratio: float = field(default=0.6, metadata={"help": "Upper end of the random cut ratio."})
    continuation_min_prefix_tokens: int = field(
        default=8, metadata={"help": "Answer tokens always kept before the cut (authors: 32; 8 fits TOFU's short answers)."}
    )
    continuation_min_suffix_tokens: int = field(
        default=8, metadata={"help": "Answer tokens always penalised after the cut (authors: 32)."}
    )
    retain_weight: float | None = field(
        default=None, metadata={"help": "Weight of KL(pi_0 || pi_theta) on retain tokens (None: the recipe's)."}
    )
    epoch_length: str = field(
        default="forget",
        metadata={"help": "'forget': an epoch is one pass over the forget set; 'max(forget,retain)': the authors'.",
                  "choices": list(MASC_EPOCH_LENGTHS)},
    )

    # The stopping rule
    stop_probe: str = field(
        default="train",
        metadata={"help": "'train': two-stage rule on forget training examples; 'heldout': held-out slice, one stage.",
                  "choices": list(MASC_STOP_PROBES)},
    )
    confirm_rule: str = field(
        default="mean",
        metadata={"help": "Stage-2 statistic: 'mean' (authors' TOFU run) or 'hoeffding' (anytime upper bound).",
                  "choices": list(MASC_CONFIRM_RULES)},
    )
    check_every: int = field(default=2, metadata={"help": "Check the stopping rule every this many steps."})
    stop_trigger: float | None = field(
        default=None, metadata={"help": "Stage-1 trigger on the mean violation rate (None: the recipe's)."}
    )
    stop_probe_batches: int = field(default=2, metadata={"help": "Stage-1 probe size in training batches."})
    confirm_examples: int | None = field(
        default=None, metadata={"help": "Stage-2 probe size in forget training examples (None: the recipe's)."}
    )
    confirm_delta: float = field(default=0.05, metadata={"help": "Failure probability delta of the Hoeffding bound."})
    stop_tolerance: float | None = field(
        default=None, metadata={"help": "alpha: stop when the statistic is <= alpha (None: the recipe's)."}
    )
    calibrate_stop: bool = field(
        default=True, metadata={"help": "Calibrate the stop thresholds on never-seen rows when the run has them."}
    )
    validation_fraction: float = field(
        default=0.1, metadata={"help": "stop_probe='heldout': fraction of the forget set held out."}
    )
    min_validation_positions: int = field(
        default=20, metadata={"help": "stop_probe='heldout': minimum held-out answer positions."}
    )

    # LoRA (TRL ModelConfig names)
    use_peft: bool = field(default=True, metadata={"help": "Train a LoRA adapter (used when no peft_config is given)."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha."})
    lora_dropout: float = field(default=0.05, metadata={"help": "LoRA dropout."})
    lora_target_modules: list[str] | None = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        metadata={"help": "Modules that get a LoRA adapter."},
    )

    #: Ranges of MASC's numeric fields (see :func:`~hf_unlearn.methods.base.config.check_numeric_fields`).
    numeric_ranges = {
        "top_k": ">= 1", "margin_beta": "> 0", "forget_weight": "> 0", "buffer_eta": "> 0", "retain_weight": ">= 0",
        "check_every": ">= 1", "stop_trigger": "(0, 1)",
        "stop_tolerance": ("(0, 1)", "alpha: the run stops when the violation statistic is <= alpha"), "confirm_delta": "(0, 1)",
        "stop_probe_batches": ">= 1", "confirm_examples": ">= 1", "min_validation_positions": ">= 1",
        "validation_fraction": "(0, 1)", "continuation_min_prefix_tokens": ">= 0",
        "continuation_min_suffix_tokens": ">= 0",
        "lora_r": (">= 1", "the LoRA rank"),
        "lora_alpha": ("> 0", "the adapter's update is scaled by lora_alpha / r: 0 leaves the model unchanged and a "
                              "negative alpha reverses the update"),
        "lora_dropout": "[0, 1)",
    }

    def __post_init__(self) -> None:
        self._fill_from_recipe()
        if self.margin_threshold is None:
            if self.margin_probability is None or not 0.0 < self.margin_probability < 1.0:
                raise ValueError(f"margin_probability (rho) must lie in (0, 1), got {self.margin_probability}.")
        if not 0.0 <= self.continuation_cut_min_ratio <= self.continuation_cut_max_ratio <= 1.0:
            raise ValueError(
                "continuation cut ratios need 0 <= continuation_cut_min_ratio <= continuation_cut_max_ratio <= 1, got "
                f"{self.continuation_cut_min_ratio} and {self.continuation_cut_max_ratio}."
            )
        super().__post_init__()

    def _fill_from_recipe(self) -> None:
        """Record which recipe fields were given and fill the others from the recipe (``"auto"``: provisionally
        ``"small"``)."""
        if self.recipe not in MASC_RECIPE_CHOICES:
            raise ValueError(f"recipe must be one of {list(MASC_RECIPE_CHOICES)}, got {self.recipe!r}.")
        if not hasattr(self, "recipe_fields_given"):
            self.recipe_fields_given = tuple(k for k in MASC_RECIPES["small"] if getattr(self, k) is not None)
        values = MASC_RECIPES["small" if self.recipe == "auto" else self.recipe]
        for name, value in values.items():
            if name not in self.recipe_fields_given:
                setattr(self, name, value)

    def with_recipe(self, name: str) -> MASCConfig:
        """A copy of this config with recipe ``name`` in every recipe field not given explicitly."""
        if name not in MASC_RECIPES:
            raise ValueError(f"recipe must be one of {list(MASC_RECIPES)}, got {name!r}.")
        resolved = copy.copy(self)
        resolved.recipe = name
        resolved._fill_from_recipe()
        return resolved

    def resolved_for(self, model: Any) -> tuple[MASCConfig, dict[str, Any]]:
        """``(config, record)``: under ``recipe="auto"`` a copy with the recipe of ``model``'s parameter count,
        else this config; ``record``: ``requested``, ``used``, ``model_parameters``, ``given``."""
        record: dict[str, Any] = {"requested": self.recipe, "used": self.recipe, "model_parameters": None,
                                  "given": list(self.recipe_fields_given)}
        if self.recipe != "auto":
            return self, record
        count = model_parameter_count(model)
        resolved = self.with_recipe(masc_recipe_for(count))
        record.update(used=resolved.recipe, model_parameters=count)
        return resolved, record

    @property
    def tau(self) -> float:
        """`margin_threshold`, else `log(rho / (1 - rho))`."""
        if self.margin_threshold is not None:
            return float(self.margin_threshold)
        return math.log(self.margin_probability / (1.0 - self.margin_probability))

    @property
    def rho(self) -> float:
        """The threshold as a restricted probability, `sigmoid(tau)`."""
        return masc_probability_from_threshold(self.tau)

    @property
    def min_validation_size(self) -> int:
        """Held-out answer positions needed, `max(min_validation_positions, ceil(1 / alpha))`."""
        return max(int(self.min_validation_positions), math.ceil(1.0 / self.stop_tolerance - 1e-9))

    def get_peft_config(self) -> Any:
        """The `peft.LoraConfig` of the `lora_*` fields, or `None` when `use_peft` is false."""
        if not self.use_peft:
            return None
        from peft import LoraConfig

        return LoraConfig(
            r=int(self.lora_r), lora_alpha=int(self.lora_alpha), lora_dropout=float(self.lora_dropout),
            target_modules=list(self.lora_target_modules) if self.lora_target_modules else None,
            bias="none", task_type="CAUSAL_LM",
        )
