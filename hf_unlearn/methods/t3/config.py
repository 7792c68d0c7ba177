"""Configuration of the T3 guidance head (``model_type = "t3_classifier"``): the head, the base it was fitted on,
the decoding defaults and the fit settings of :func:`~hf_unlearn.methods.t3.fit_t3`."""

from __future__ import annotations

import math
from dataclasses import field
from typing import Any

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig

POOLINGS = ("mean",)
LR_SCHEDULES = ("linear", "constant")


def base_text_config(model: Any) -> Any:
    """The decoder config of a causal LM (``get_text_config(decoder=True)`` when it has one)."""
    config = model.config
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def base_num_layers(model: Any) -> int | None:
    """Number of decoder layers of ``model`` (``num_hidden_layers`` / ``n_layer``), or None."""
    base = base_text_config(model)
    for name in ("num_hidden_layers", "n_layer", "num_layers"):
        value = getattr(base, name, None)
        if isinstance(value, int):
            return value
    return None


def _finite(value: Any) -> bool:
    try:
        return not isinstance(value, bool) and math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


@strict
class T3ClassifierConfig(PreTrainedConfig):
    r"""Configuration of :class:`~hf_unlearn.methods.t3.T3Classifier` and of :func:`~hf_unlearn.methods.t3.fit_t3`.

    The head maps the causal mean-pooled hidden state ``pool_t`` of the frozen base to ``g_t = U (D pool_t + c)``
    (``D``: hidden -> ``rank``, ``U``: ``rank`` -> vocab); ``f(x, y_<t, v) = sigmoid(g_t[v])`` estimates
    ``P(retain | x, y_<t, v)``. T3 decodes from

        softmax(log p(v | x, y_<t) / T + w * max(log f(x, y_<t, v), floor))

    with ``T = temperature``, ``w = tilt_weight``, ``floor = log_f_floor`` (none when None). Where each default
    comes from: ``docs/methods/t3.md``.
    """

    model_type = "t3_classifier"

    rank: int = field(default=20, metadata={"help": "Width h of the bottleneck (hidden -> h -> vocabulary)."})
    layer: int = field(default=-1, metadata={"help": "Index into the base's output_hidden_states (-1: the last)."})
    pooling: str = field(default="mean", metadata={"help": "'mean': causal mean over the non-padding positions <= t."})
    temperature: float = field(default=1.0, metadata={"help": "Decoding default T > 0 (log p is divided by T)."})
    tilt_weight: float = field(default=1.0, metadata={"help": "Decoding default w > 0: weight of log f."})
    log_f_floor: float | None = field(default=None, metadata={"help": "Optional floor (< 0) on log f (None: none)."})
    prompt_template: str | None = field(
        default=None, metadata={"help": "Prompt preset of hf_unlearn.data.prompts (None: chat template, else plain)."}
    )
    # --- fit settings (fit_t3) ---
    epochs: int = field(default=100, metadata={"help": "Passes over the forget examples (at most)."})
    steps: int | None = field(default=None, metadata={"help": "Optional cap on the AdamW steps."})
    forget_batch_size: int = field(default=32, metadata={"help": "Forget examples (and retain ones) per step."})
    learning_rate: float = field(default=1e-2, metadata={"help": "Peak AdamW learning rate of the head."})
    weight_decay: float = field(default=1e-3, metadata={"help": "AdamW weight decay of the head."})
    lr_schedule: str = field(default="linear", metadata={"help": "'linear' (warm-up, then decay to 0) or 'constant'."})
    warmup_epochs: float = field(default=25.0, metadata={"help": "Warm-up length in epochs of the forget examples."})
    class_balance: bool = field(default=False, metadata={"help": "Weigh the two classes equally in the BCE."})
    holdout_fraction: float = field(default=0.1, metadata={"help": "Share of the retain examples held out."})
    early_stopping_patience: int | None = field(
        default=None, metadata={"help": "Stop after this many epochs without a lower held-out BCE (best head kept)."}
    )
    batch_size: int = field(default=16, metadata={"help": "Examples per forward pass of the frozen base when caching."})
    max_length: int | None = field(default=None, metadata={"help": "Truncate prompt + answer to this many tokens."})
    seed: int = field(default=0, metadata={"help": "Seed of the hold-out split, the initialisation and the batches."})
    # --- the base the head was fitted on (filled in by for_base / fit_t3) ---
    hidden_size: int | None = field(default=None, metadata={"help": "Hidden size of the base."})
    vocab_size: int | None = field(default=None, metadata={"help": "Vocabulary size of the base (the head's output)."})
    base_model_name_or_path: str = field(default="", metadata={"help": "Name or path the base was loaded from."})
    base_model_revision: str | None = field(default=None, metadata={"help": "Hub commit of the base, when known."})
    base_model_type: str | None = field(default=None, metadata={"help": "`model_type` of the base."})
    base_num_hidden_layers: int | None = field(default=None, metadata={"help": "Number of decoder layers of the base."})
    base_weights_fingerprint: dict | None = field(
        default=None, metadata={"help": "SHA-256 digests of the base's weights, checked whenever the head is attached."}
    )
    fit_report: dict | None = field(default=None, metadata={"help": "Statistics of the fit (informational)."})

    def __post_init__(self, **kwargs: Any) -> None:
        self._check_fields()
        super().__post_init__(**kwargs)

    def _check_fields(self) -> None:
        """Refuse (``ValueError``) values the head or its fit cannot implement."""
        if self.pooling not in POOLINGS:
            raise ValueError(f"T3ClassifierConfig.pooling must be one of {POOLINGS}, got {self.pooling!r}.")
        for name in ("rank", "epochs", "forget_batch_size", "batch_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"T3ClassifierConfig.{name} must be >= 1, got {getattr(self, name)}.")
        for name in ("steps", "early_stopping_patience"):
            if getattr(self, name) is not None and int(getattr(self, name)) < 1:
                raise ValueError(f"T3ClassifierConfig.{name} must be >= 1 or None, got {getattr(self, name)}.")
        if self.hidden_size is not None and int(self.hidden_size) < 1:
            raise ValueError(f"T3ClassifierConfig.hidden_size must be >= 1, got {self.hidden_size}.")
        for name in ("temperature", "learning_rate"):
            value = getattr(self, name)
            if not _finite(value) or float(value) <= 0:
                raise ValueError(f"T3ClassifierConfig.{name} must be a finite positive number, got {value!r}.")
        for name in ("tilt_weight", "weight_decay", "holdout_fraction"):
            if not _finite(getattr(self, name)):
                raise ValueError(f"T3ClassifierConfig.{name} must be a finite number, got {getattr(self, name)!r}.")
        if float(self.tilt_weight) <= 0:
            raise ValueError(f"T3ClassifierConfig.tilt_weight must be > 0, got {self.tilt_weight} (w < 0 tilts decoding "
                             "towards the forget set).")
        if float(self.weight_decay) < 0:
            raise ValueError(f"T3ClassifierConfig.weight_decay must be >= 0, got {self.weight_decay}.")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"T3ClassifierConfig.lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}.")
        if not _finite(self.warmup_epochs) or float(self.warmup_epochs) < 0:
            raise ValueError(f"T3ClassifierConfig.warmup_epochs must be a finite number >= 0, got {self.warmup_epochs!r}.")
        if not 0 <= float(self.holdout_fraction) < 1:
            raise ValueError(f"T3ClassifierConfig.holdout_fraction must be in [0, 1), got {self.holdout_fraction}.")
        if self.log_f_floor is not None and (not _finite(self.log_f_floor) or float(self.log_f_floor) >= 0):
            raise ValueError(f"T3ClassifierConfig.log_f_floor must be a finite negative number or None, got "
                             f"{self.log_f_floor!r}.")
        if self.max_length is not None and int(self.max_length) < 2:
            raise ValueError(f"T3ClassifierConfig.max_length must be >= 2, got {self.max_length}.")
        if self.prompt_template is not None:
            from ...data.prompts import get_template

            try:
                get_template(self.prompt_template)
            except ValueError as err:
                raise ValueError(f"T3ClassifierConfig.prompt_template: {err}") from None

    def extra_memory_bytes(self, shape: Any, weight_bytes: int, num_positions: int | None = None
                           ) -> dict[str, int]:
        """What :func:`~hf_unlearn.methods.t3.fit_t3` holds besides the base (:mod:`hf_unlearn.memory_plan`):
        ``t3_head`` ``4 h (H + V + 1) + 12 h (H + V)`` (``+ 4 h (H + V)`` with early stopping); with ``N`` positions,
        ``t3_pooled_states`` ``2 N H weight_bytes`` and ``t3_position_labels`` ``36 N``."""
        h, width = int(self.rank), shape.hidden_size + shape.vocab_size
        head = 4 * h * (width + 1) + 12 * h * width + (4 * h * width if self.early_stopping_patience else 0)
        out = {"t3_head": head}
        if num_positions is not None:
            out["t3_pooled_states"] = 2 * num_positions * shape.hidden_size * weight_bytes
            out["t3_position_labels"] = 36 * num_positions
        return out

    def check_for(self, model: Any) -> None:
        """Refuse (``ValueError``) a ``layer`` outside ``model``'s ``output_hidden_states`` (``-(n + 1) .. n``)."""
        n_layers = base_num_layers(model)
        if n_layers is not None and not -(n_layers + 1) <= int(self.layer) <= n_layers:
            raise ValueError(
                f"layer={self.layer} is out of range for a base with {n_layers} layers "
                f"(output_hidden_states has {n_layers + 1} entries: use -{n_layers + 1}..{n_layers})."
            )

    def for_base(self, model: Any, fingerprint: dict[str, Any] | None = None) -> T3ClassifierConfig:
        """A copy of this config bound to ``model``: sizes, name, revision, architecture and weight fingerprint."""
        from ...integrity import model_fingerprint

        self.check_for(model)
        base = base_text_config(model)
        data = self.to_dict()
        for key in ("model_type", "transformers_version", "architectures"):
            data.pop(key, None)
        hidden = getattr(base, "hidden_size", None) or getattr(base, "n_embd", None)
        data.update(
            hidden_size=int(hidden),
            vocab_size=int(base.vocab_size),
            base_model_name_or_path=str(getattr(model, "name_or_path", "") or model.config._name_or_path or ""),
            base_model_revision=getattr(model.config, "_commit_hash", None) or self.base_model_revision,
            base_model_type=getattr(base, "model_type", None),
            base_num_hidden_layers=base_num_layers(model),
            base_weights_fingerprint=fingerprint if fingerprint is not None else model_fingerprint(model),
        )
        return T3ClassifierConfig(**data)
