"""The T3 guidance head: a rank-h map from the pooled hidden state to one logit per vocabulary entry.

``g_t = U (D pool_t) + b`` with ``D`` (``rank x hidden``, no bias), ``U`` (``vocab x rank``) and
``b`` (``vocab``); ``f(x, y_<t, v) = sigmoid(g_t[v])`` estimates ``P(retain | x, y_<t, v)``. This is
the authors' ``DataSplitClassifier`` with one hidden layer and the identity activation (their
default, ``activation_str="id"``), plus a per-token bias ``b``. With ``rank`` 20 it holds
``20 * (hidden + vocab) + vocab`` parameters (0.03% of an 8B model).
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

from .config import T3ClassifierConfig, base_num_layers, base_text_config


@dataclass
class T3ClassifierOutput(ModelOutput):
    """Output of :class:`T3Classifier`: the guidance ``logits`` ``g_t`` (``[..., vocab]``)."""

    logits: torch.Tensor | None = None


class T3Classifier(PreTrainedModel):
    """Low-rank guidance head: ``forward(pool) -> g = U (D pool) + b`` over the whole vocabulary.

    :meth:`token_logits` returns ``g[v]`` for one token per pooled state (the fit uses it, so a
    training step never materialises ``[N, vocab]``); :meth:`log_f` returns ``log sigmoid(g)``.
    """

    config_class = T3ClassifierConfig
    base_model_prefix = "t3"
    main_input_name = "pooled_hidden_states"

    def __init__(self, config: T3ClassifierConfig) -> None:
        super().__init__(config)
        if config.hidden_size is None or config.vocab_size is None:
            raise ValueError(
                "T3ClassifierConfig.hidden_size / vocab_size are unset: build the config with "
                "`config.for_base(model)` or fit the head with `fit_t3`."
            )
        hidden, rank, vocab = int(config.hidden_size), int(config.rank), int(config.vocab_size)
        self.down = nn.Linear(hidden, rank, bias=False)
        self.up = nn.Linear(rank, vocab, bias=True)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            init.normal_(module.weight, mean=0.0, std=1.0 / max(module.in_features, 1) ** 0.5)
            if module.bias is not None:
                init.zeros_(module.bias)

    def forward(self, pooled_hidden_states: torch.Tensor, **kwargs: Any) -> T3ClassifierOutput:
        """``g = U (D pool) + b`` for pooled states ``[..., hidden]`` -> ``[..., vocab]`` (the head's dtype)."""
        return T3ClassifierOutput(logits=self.up(self.down(pooled_hidden_states.to(self.down.weight.dtype))))

    def token_logits(self, pooled_hidden_states: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """``g[v]`` for one token ``v = token_ids[i]`` per pooled state ``i``: ``U[v] . (D pool) + b[v]``."""
        z = self.down(pooled_hidden_states.to(self.down.weight.dtype))
        ids = token_ids.long()
        return (z * self.up.weight[ids]).sum(-1) + self.up.bias[ids]

    def log_f(self, pooled_hidden_states: torch.Tensor) -> torch.Tensor:
        """``log f = log sigmoid(g)`` over the vocabulary, float32."""
        return F.logsigmoid(self(pooled_hidden_states).logits.float())

    def num_trainable_parameters(self) -> int:
        """Parameters of the head: ``rank * (hidden + vocab) + vocab``."""
        return sum(p.numel() for p in self.parameters())

    def check_base(self, model: Any, check_name: bool = True) -> None:
        """Refuse a base model other than the one the head was fitted on.

        Compares hidden size, vocabulary size, architecture, number of layers and (when
        ``check_name`` and both are known) the name or path and the Hub revision the base was
        loaded from. Raises ``ValueError`` naming every mismatch.
        """
        cfg = self.config
        base = base_text_config(model)
        problems = []
        hidden = getattr(base, "hidden_size", None) or getattr(base, "n_embd", None)
        if cfg.hidden_size is not None and hidden is not None and int(hidden) != int(cfg.hidden_size):
            problems.append(f"hidden size {hidden} != {cfg.hidden_size}")
        if cfg.vocab_size is not None and int(base.vocab_size) != int(cfg.vocab_size):
            problems.append(f"vocabulary size {base.vocab_size} != {cfg.vocab_size}")
        base_type = getattr(base, "model_type", None)
        if cfg.base_model_type and base_type and base_type != cfg.base_model_type:
            problems.append(f"model type {base_type!r} != {cfg.base_model_type!r}")
        n_layers = base_num_layers(model)
        if cfg.base_num_hidden_layers is not None and n_layers is not None and n_layers != cfg.base_num_hidden_layers:
            problems.append(f"{n_layers} layers != {cfg.base_num_hidden_layers}")
        if check_name:
            name = str(getattr(model, "name_or_path", "") or getattr(model.config, "_name_or_path", "") or "")
            if cfg.base_model_name_or_path and name and name != cfg.base_model_name_or_path:
                problems.append(f"name {name!r} != {cfg.base_model_name_or_path!r}")
            revision = getattr(model.config, "_commit_hash", None)
            if cfg.base_model_revision and revision and revision != cfg.base_model_revision:
                problems.append(f"revision {revision!r} != {cfg.base_model_revision!r}")
        if problems:
            hint = " (pass check_base_name=False if it is the same model loaded from elsewhere)" if check_name else ""
            raise ValueError(
                "This T3 head was fitted on another base model: " + "; ".join(problems) + hint
                + ". Refit it with `fit_t3` on this model."
            )
