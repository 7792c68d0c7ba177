"""Configuration of the T3 classifier head (``model_type = "t3_classifier"``).

The config records which base model the head was fitted on (name, hidden size, vocabulary size,
architecture) so that a head is never silently applied to another base, and how the base's
hidden states are read: which layer of ``output_hidden_states`` and how they are pooled.
"""

from __future__ import annotations

from typing import Any

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig

POOLINGS = ("mean", "last")


@strict
class T3ClassifierConfig(PreTrainedConfig):
    r"""Configuration of :class:`~hf_unlearn.t3.T3Classifier`.

    Args:
        rank: width of the low-rank bottleneck (hidden size -> ``rank`` -> 1 logit).
        layer: index into the base model's ``output_hidden_states`` tuple (0 = embeddings,
            ``-1`` = the last, normed, hidden state).
        pooling: ``"mean"``: mean of the layer's hidden states over the *answer tokens so far*
            (the tokens after the prompt, the scored candidate included); ``"last"``: the hidden
            state of the last answer token (the candidate). The same definition is used when
            fitting, in the logits processor and in teacher-forced scoring.
        hidden_size, vocab_size: the base model's sizes (filled in by :func:`fit_t3` or
            :meth:`for_base`).
        base_model_name_or_path, base_model_type, base_num_hidden_layers: identify the base.
        fit_report: statistics of the fit (seconds, held-out accuracy, ...), informational.
    """

    model_type = "t3_classifier"

    rank: int = 20
    layer: int = -1
    pooling: str = "mean"
    hidden_size: int | None = None
    vocab_size: int | None = None
    base_model_name_or_path: str = ""
    base_model_type: str | None = None
    base_num_hidden_layers: int | None = None
    fit_report: dict | None = None

    def __post_init__(self, **kwargs: Any) -> None:
        self._check_fields()
        super().__post_init__(**kwargs)

    def _check_fields(self) -> None:
        """Reject a pooling or rank that the head cannot implement (``ValueError``)."""
        if self.pooling not in POOLINGS:
            raise ValueError(f"T3ClassifierConfig.pooling must be one of {POOLINGS}, got {self.pooling!r}.")
        if int(self.rank) < 1:
            raise ValueError(f"T3ClassifierConfig.rank must be >= 1, got {self.rank}.")
        if self.hidden_size is not None and int(self.hidden_size) < 1:
            raise ValueError(f"T3ClassifierConfig.hidden_size must be >= 1, got {self.hidden_size}.")

    def for_base(self, model: Any) -> T3ClassifierConfig:
        """A copy of this config bound to ``model`` (a causal LM): sizes, name and architecture."""
        base = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
        n_layers = getattr(base, "num_hidden_layers", None)
        if n_layers is not None and not -(n_layers + 1) <= int(self.layer) <= n_layers:
            raise ValueError(
                f"layer={self.layer} is out of range for a base with {n_layers} layers "
                f"(output_hidden_states has {n_layers + 1} entries: use -{n_layers + 1}..{n_layers})."
            )
        data = self.to_dict()
        for key in ("model_type", "transformers_version", "architectures"):
            data.pop(key, None)
        data.update(
            hidden_size=int(base.hidden_size),
            vocab_size=int(base.vocab_size),
            base_model_name_or_path=str(getattr(model, "name_or_path", "") or model.config._name_or_path or ""),
            base_model_type=getattr(base, "model_type", None),
            base_num_hidden_layers=n_layers,
        )
        return T3ClassifierConfig(**data)
