"""The T3 guidance head: ``g_t = U (D pool_t + c)`` with ``D`` (``rank x hidden``), the offset ``c`` (``rank``),
``U`` (``vocab x rank``) and no per-token bias; ``f(x, y_<t, v) = sigmoid(g_t[v])`` estimates
``P(retain | x, y_<t, v)``. ``rank (hidden + vocab + 1)`` parameters.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
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
    """Low-rank guidance head: ``forward(pool) -> g = U (D pool + c)`` over the whole vocabulary."""

    config_class = T3ClassifierConfig
    base_model_prefix = "t3"
    _method = "t3"
    _title = "T3 (Temper-Then-Tilt)"
    _paper = {"title": "Temper-Then-Tilt: Principled Unlearning for Generative Models through Tempering and "
                       "Classifier Guidance", "id": "2602.10217"}
    _cli_help = "temper-then-tilt decoding with a low-rank classifier head"
    main_input_name = "pooled_hidden_states"

    def __init__(self, config: T3ClassifierConfig) -> None:
        super().__init__(config)
        if config.hidden_size is None or config.vocab_size is None:
            raise ValueError("T3ClassifierConfig.hidden_size / vocab_size are unset: use `config.for_base(model)`.")
        hidden, rank, vocab = int(config.hidden_size), int(config.rank), int(config.vocab_size)
        self.down = nn.Linear(hidden, rank, bias=True)
        self.up = nn.Linear(rank, vocab, bias=False)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        """PyTorch's default ``nn.Linear`` initialisation of the weights (the authors' head), a zero offset."""
        if isinstance(module, nn.Linear):
            init.kaiming_uniform_(module.weight, a=5 ** 0.5)
            if module.bias is not None:
                init.zeros_(module.bias)

    def forward(self, pooled_hidden_states: torch.Tensor, **kwargs: Any) -> T3ClassifierOutput:
        """``g = U (D pool + c)`` for pooled states ``[..., hidden]`` -> ``[..., vocab]`` (the head's dtype)."""
        return T3ClassifierOutput(logits=self.up(self.down(pooled_hidden_states.to(self.down.weight.dtype))))

    def token_logits(self, pooled_hidden_states: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """``g[v]`` for one token ``v = token_ids[i]`` per pooled state ``i``: ``U[v] . (D pool + c)``."""
        z = self.down(pooled_hidden_states.to(self.down.weight.dtype))
        return (z * self.up.weight[token_ids.long()]).sum(-1)

    def non_finite_parameters(self) -> list[str]:
        """Names of the parameters holding a NaN or an infinity."""
        return [name for name, p in self.named_parameters() if not bool(torch.isfinite(p).all())]

    def check_finite(self) -> None:
        """Refuse (``ValueError``) a head with a non-finite weight."""
        bad = self.non_finite_parameters()
        if bad:
            raise ValueError(f"The T3 head has non-finite weights ({', '.join(bad)}); refit it (a lower learning_rate).")

    def save_pretrained(self, save_directory: str | os.PathLike, *args: Any, **kwargs: Any) -> Any:
        """``PreTrainedModel.save_pretrained`` of a finite head, then ``t3_integrity.json``."""
        from ...safe_output import output_lock
        from .provenance import write_head_integrity

        self.check_finite()
        with output_lock(save_directory):  # no other process writes the same folder meanwhile
            result = super().save_pretrained(save_directory, *args, **kwargs)
            write_head_integrity(save_directory)
        return result

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: Any, *model_args: Any, verify_integrity: bool = True,
                        expected_sha256: str | None = None, **kwargs: Any) -> Any:
        """``PreTrainedModel.from_pretrained`` after checking the head's files against ``t3_integrity.json`` (a head
        without it is refused unless ``verify_integrity=False``); ``expected_sha256`` pins the record itself."""
        if pretrained_model_name_or_path is None or not (verify_integrity or expected_sha256 is not None):
            return super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        from .provenance import head_folder, verify_head_files

        folder = head_folder(pretrained_model_name_or_path, kwargs)
        verify_head_files(folder, f"The T3 head {pretrained_model_name_or_path}", expected_sha256)
        kwargs.pop("subfolder", None)
        head = super().from_pretrained(str(folder), *model_args, **kwargs)
        head.name_or_path = head.config._name_or_path = str(pretrained_model_name_or_path)
        return head

    def check_base(self, model: Any, check_weights: bool = True) -> None:
        """Refuse (``BaseModelMismatchError``) a base other than the one the head was fitted on: sizes,
        architecture, layers and (unless ``check_weights=False``, e.g. for a quantized copy) the weights."""
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
        if problems:
            from ...integrity import BaseModelMismatchError

            raise BaseModelMismatchError(f"This T3 head was fitted on another base model: {'; '.join(problems)}.")
        if check_weights:
            from ...integrity import check_model_fingerprint

            check_model_fingerprint(cfg.base_weights_fingerprint, model, "This T3 head",
                                    "A T3 head only fits the model whose hidden states it was trained on; attach it "
                                    "to that model, or refit it with fit_t3 on this one.")
