"""The T3 classifier head: a low-rank linear probe on pooled hidden states of a frozen base.

``f(x, y) = P(S = 1 | x, y) = sigmoid(u^T W z + b)`` with ``z = (h - mu) / sigma`` the pooled
hidden state of the base (see :class:`T3ClassifierConfig` for the pooling), standardised by
per-feature statistics of the fitting cache (buffers, saved with the weights), ``W`` of shape
``rank x hidden`` and ``u`` of size ``rank``. ``S = 1`` is retain-like text, ``S = 0`` forget-like.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.utils import ModelOutput

from .config import T3ClassifierConfig


@dataclass
class T3ClassifierOutput(ModelOutput):
    """Output of :class:`T3Classifier`: ``logits`` of ``P(S=1)`` and the BCE ``loss`` when labels are given."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None


class T3Classifier(PreTrainedModel):
    """Low-rank retain/forget classifier over pooled hidden states (``hidden -> rank -> 1`` logit).

    ``forward(pooled_hidden_states)`` returns the logit of ``P(S = 1 | x, y)`` (retain) for each
    pooled state ``[..., hidden]``; :meth:`log_f` returns ``log f = log sigmoid(logit)``.
    """

    config_class = T3ClassifierConfig
    base_model_prefix = "t3"
    main_input_name = "pooled_hidden_states"

    def __init__(self, config: T3ClassifierConfig) -> None:
        super().__init__(config)
        if config.hidden_size is None:
            raise ValueError(
                "T3ClassifierConfig.hidden_size is unset: build the config with `config.for_base(model)` "
                "or fit the classifier with `fit_t3`."
            )
        hidden, rank = int(config.hidden_size), int(config.rank)
        self.down = nn.Linear(hidden, rank, bias=False)
        self.up = nn.Linear(rank, 1, bias=True)
        self.register_buffer("feature_mean", torch.zeros(hidden), persistent=True)
        self.register_buffer("feature_scale", torch.ones(hidden), persistent=True)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            init.normal_(module.weight, mean=0.0, std=1.0 / max(module.in_features, 1) ** 0.5)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, T3Classifier):
            init.zeros_(module.feature_mean)
            init.ones_(module.feature_scale)

    def forward(
        self, pooled_hidden_states: torch.Tensor, labels: torch.Tensor | None = None, **kwargs: Any
    ) -> T3ClassifierOutput:
        """Logit of ``P(S=1)`` per pooled state; BCE loss against ``labels`` (1 = retain) if given."""
        z = (pooled_hidden_states.to(self.feature_mean.dtype) - self.feature_mean) / self.feature_scale
        logits = self.up(self.down(z.to(self.down.weight.dtype))).squeeze(-1)
        loss = None
        if labels is not None:
            loss = F.binary_cross_entropy_with_logits(logits.float(), labels.float())
        return T3ClassifierOutput(loss=loss, logits=logits)

    def log_f(self, pooled_hidden_states: torch.Tensor) -> torch.Tensor:
        """``log f(x, y) = log sigmoid(logit)``, float32, shape ``pooled_hidden_states.shape[:-1]``."""
        return F.logsigmoid(self(pooled_hidden_states).logits.float())

    def num_trainable_parameters(self) -> int:
        """Parameters of the head (``hidden * rank + rank + 1``); the standardisation buffers are not counted."""
        return sum(p.numel() for p in self.parameters())

    def check_base(self, model: Any, check_name: bool = True) -> None:
        """Refuse a base model other than the one the head was fitted on.

        Compares hidden size, vocabulary size, architecture and (when ``check_name`` and both are
        known) the name or path the base was loaded from. Raises ``ValueError`` naming the mismatch.
        """
        cfg = self.config
        base = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
        problems = []
        if cfg.hidden_size is not None and int(base.hidden_size) != int(cfg.hidden_size):
            problems.append(f"hidden size {base.hidden_size} != {cfg.hidden_size}")
        if cfg.vocab_size is not None and int(base.vocab_size) != int(cfg.vocab_size):
            problems.append(f"vocabulary size {base.vocab_size} != {cfg.vocab_size}")
        base_type = getattr(base, "model_type", None)
        if cfg.base_model_type and base_type and base_type != cfg.base_model_type:
            problems.append(f"model type {base_type!r} != {cfg.base_model_type!r}")
        n_layers = getattr(base, "num_hidden_layers", None)
        if cfg.base_num_hidden_layers is not None and n_layers is not None and n_layers != cfg.base_num_hidden_layers:
            problems.append(f"{n_layers} layers != {cfg.base_num_hidden_layers}")
        name = str(getattr(model, "name_or_path", "") or getattr(model.config, "_name_or_path", "") or "")
        if check_name and cfg.base_model_name_or_path and name and name != cfg.base_model_name_or_path:
            problems.append(
                f"name {name!r} != {cfg.base_model_name_or_path!r} (pass check_base_name=False if this is "
                "the same model loaded from another location)"
            )
        if problems:
            raise ValueError(
                "This T3 classifier was fitted on another base model: " + "; ".join(problems) + ". Refit it with "
                "`fit_t3` on this model."
            )
