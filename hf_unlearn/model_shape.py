"""The shape of a decoder-only transformer read from its config, and the parameter counts that follow (no weights
read). Biases are not counted; the MLP is gated (three ``hidden x intermediate`` matrices), so a two-matrix MLP
(GPT-2) is over-counted by ``hidden * intermediate`` per layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ModelShape", "lora_parameter_count", "parameter_count"]

#: PEFT's default LoRA targets for Llama-family models, and the modules of ``"all-linear"``.
DEFAULT_LORA_TARGETS = ("q_proj", "v_proj")
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only model that its parameter count and the memory plan read."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    head_dim: int | None = None
    tie_word_embeddings: bool = False

    @property
    def head_width(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    @classmethod
    def from_config(cls, config: Any) -> ModelShape:
        """The shape of a transformers config (the text model of a composite one). Absent fields:
        ``intermediate_size = 4 h``, ``num_key_value_heads`` = the heads, ``head_dim = h / heads``."""
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        hidden, heads = int(text.hidden_size), int(text.num_attention_heads)
        tied = getattr(text, "tie_word_embeddings", getattr(config, "tie_word_embeddings", False))
        return cls(
            hidden_size=hidden, intermediate_size=int(getattr(text, "intermediate_size", None) or 4 * hidden),
            num_layers=int(text.num_hidden_layers), num_heads=heads,
            num_kv_heads=int(getattr(text, "num_key_value_heads", None) or heads), vocab_size=int(text.vocab_size),
            head_dim=getattr(text, "head_dim", None), tie_word_embeddings=bool(tied),
        )

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """``{module: (in_features, out_features)}`` of one decoder layer's linear modules."""
        h, m, q, kv = self.hidden_size, self.intermediate_size, self.num_heads * self.head_width, \
            self.num_kv_heads * self.head_width
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, m), "up_proj": (h, m), "down_proj": (m, h)}


def parameter_count(shape: ModelShape) -> int:
    """``P = V h (2 - tied) + L (sum_j in_j out_j + 2 h) + h``: the embeddings and the output head (one matrix
    when tied), each layer's seven linear maps (:meth:`ModelShape.linear_shapes`) and two norms, the final norm."""
    layer = sum(i * o for i, o in shape.linear_shapes().values()) + 2 * shape.hidden_size
    embeddings = shape.vocab_size * shape.hidden_size * (1 if shape.tie_word_embeddings else 2)
    return embeddings + shape.num_layers * layer + shape.hidden_size


def lora_parameter_count(shape: ModelShape, r: int, targets: Any = None) -> int:
    """``L * sum_{j in targets} r (in_j + out_j)``: LoRA's ``A`` (``r x in``) and ``B`` (``out x r``) on each target
    module of every layer. ``targets``: module names, ``"all-linear"``, or ``None`` (PEFT's Llama default, q and
    v)."""
    if targets is None:
        targets = DEFAULT_LORA_TARGETS
    elif isinstance(targets, str):
        targets = ALL_LINEAR if targets == "all-linear" else (targets,)
    shapes = shape.linear_shapes()
    per_layer = sum(r * (shapes[t][0] + shapes[t][1]) for t in targets if t in shapes)
    return shape.num_layers * per_layer
