"""Configuration of the T3 guidance head (``model_type = "t3_classifier"``).

The config holds three groups of fields, all saved with the head:

* the head itself: ``rank``, ``layer``, ``pooling``;
* the base model it was fitted on (name, revision, architecture, hidden and vocabulary sizes), so
  that a head is never silently applied to another base;
* the decoding defaults ``temperature`` and ``tilt_weight`` that
  :meth:`~hf_unlearn.t3.T3LogitsProcessor.from_pretrained` rebuilds the processor with, and the fit
  settings of :func:`~hf_unlearn.t3.fit_t3` (steps, learning rate, class balancing, ...) together
  with the ``fit_report`` of the fit that produced the weights.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig

POOLINGS = ("mean",)


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


@strict
class T3ClassifierConfig(PreTrainedConfig):
    r"""Configuration of :class:`~hf_unlearn.t3.T3Classifier` and of :func:`~hf_unlearn.t3.fit_t3`.

    The head maps the causal mean-pooled hidden state ``pool_t`` of the frozen base to one logit per
    vocabulary entry, ``g_t = U (D pool_t) + b`` (``D``: hidden -> ``rank``, ``U``: ``rank`` -> vocab),
    and ``f(x, y_<t, v) = sigmoid(g_t[v])`` estimates ``P(retain | x, y_<t, v)``. T3 decodes from
    ``softmax(log p(v | x, y_<t) / temperature + tilt_weight * log f(x, y_<t, v))``.
    """

    model_type = "t3_classifier"

    rank: int = field(default=20, metadata={"help": "Width h of the low-rank bottleneck (hidden -> h -> vocabulary)."})
    layer: int = field(
        default=-1,
        metadata={"help": "Index into the base's `output_hidden_states` (0 = embeddings, -1 = last layer after the "
                          "final norm)."},
    )
    pooling: str = field(
        default="mean",
        metadata={"help": "'mean': causal mean of the layer's hidden states over every non-padding position <= t "
                          "(prompt and answer prefix alike), as the authors' implementation pools."},
    )
    temperature: float = field(
        default=2.0, metadata={"help": "Decoding default T: the base log-probabilities are divided by T (T >= 1)."}
    )
    tilt_weight: float = field(
        default=1.0, metadata={"help": "Decoding default w: weight of log f in the tilted scores."}
    )
    prompt_template: str | None = field(
        default=None,
        metadata={"help": "Name of a prompt template preset (hf_unlearn.data.prompts.PROMPT_TEMPLATES) the forget and "
                          "retain examples are formatted with when fitting, passed as `template=` to tokenize_qa "
                          "(None: the tokenizer's chat template, else the plain 'Question: ...' prompt). Generate and "
                          "evaluate with the same template."},
    )
    # --- fit settings (fit_t3) ---
    steps: int = field(default=300, metadata={"help": "AdamW steps on the cached pooled states."})
    learning_rate: float = field(default=1e-2, metadata={"help": "AdamW learning rate of the head."})
    weight_decay: float = field(default=1e-3, metadata={"help": "AdamW weight decay of the head."})
    train_batch_size: int = field(
        default=4096, metadata={"help": "Cached answer positions per AdamW step (all of them when fewer)."}
    )
    class_balance: bool = field(
        default=False,
        metadata={"help": "Weigh forget and retain positions equally in the BCE (see fit_t3 for how this shifts f)."},
    )
    holdout_fraction: float = field(
        default=0.1,
        metadata={"help": "Share of forget and of retain examples held out to report accuracy (0: none); the head "
                          "is then refitted on all examples."},
    )
    batch_size: int = field(default=16, metadata={"help": "Examples per forward pass of the frozen base when caching."})
    max_length: int | None = field(
        default=None,
        metadata={"help": "Truncate prompt + answer to this many tokens (always also to the base's maximum "
                          "positions)."},
    )
    seed: int = field(default=0, metadata={"help": "Seed of the hold-out split, the initialisation and the minibatches."})
    # --- the base the head was fitted on (filled in by for_base / fit_t3) ---
    hidden_size: int | None = field(default=None, metadata={"help": "Hidden size of the base."})
    vocab_size: int | None = field(default=None, metadata={"help": "Vocabulary size of the base (the head's output)."})
    base_model_name_or_path: str = field(default="", metadata={"help": "Name or path the base was loaded from."})
    base_model_revision: str | None = field(default=None, metadata={"help": "Hub commit of the base, when known."})
    base_model_type: str | None = field(default=None, metadata={"help": "`model_type` of the base."})
    base_num_hidden_layers: int | None = field(default=None, metadata={"help": "Number of decoder layers of the base."})
    fit_report: dict | None = field(default=None, metadata={"help": "Statistics of the fit (informational)."})

    def __post_init__(self, **kwargs: Any) -> None:
        self._check_fields()
        super().__post_init__(**kwargs)

    def _check_fields(self) -> None:
        """Reject values the head or its fit cannot implement (``ValueError``)."""
        if self.pooling not in POOLINGS:
            raise ValueError(f"T3ClassifierConfig.pooling must be one of {POOLINGS}, got {self.pooling!r}.")
        for name in ("rank", "steps", "train_batch_size", "batch_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"T3ClassifierConfig.{name} must be >= 1, got {getattr(self, name)}.")
        if self.hidden_size is not None and int(self.hidden_size) < 1:
            raise ValueError(f"T3ClassifierConfig.hidden_size must be >= 1, got {self.hidden_size}.")
        if not float(self.temperature) > 0 or float(self.temperature) == float("inf"):
            raise ValueError(f"T3ClassifierConfig.temperature must be a finite positive number, got {self.temperature}.")
        if not -float("inf") < float(self.tilt_weight) < float("inf"):
            raise ValueError(f"T3ClassifierConfig.tilt_weight must be finite, got {self.tilt_weight}.")
        if not float(self.learning_rate) > 0:
            raise ValueError(f"T3ClassifierConfig.learning_rate must be > 0, got {self.learning_rate}.")
        if not 0 <= float(self.holdout_fraction) < 1:
            raise ValueError(f"T3ClassifierConfig.holdout_fraction must be in [0, 1), got {self.holdout_fraction}.")
        if self.max_length is not None and int(self.max_length) < 2:
            raise ValueError(f"T3ClassifierConfig.max_length must be >= 2, got {self.max_length}.")

    def for_base(self, model: Any) -> T3ClassifierConfig:
        """A copy of this config bound to ``model`` (a causal LM): sizes, name, revision, architecture."""
        base = base_text_config(model)
        n_layers = base_num_layers(model)
        if n_layers is not None and not -(n_layers + 1) <= int(self.layer) <= n_layers:
            raise ValueError(
                f"layer={self.layer} is out of range for a base with {n_layers} layers "
                f"(output_hidden_states has {n_layers + 1} entries: use -{n_layers + 1}..{n_layers})."
            )
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
            base_num_hidden_layers=n_layers,
        )
        return T3ClassifierConfig(**data)
