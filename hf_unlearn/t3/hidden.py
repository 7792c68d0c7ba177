"""Reading the base model's hidden states for T3: one definition shared by fitting, the logits
processor and teacher-forced scoring.

The classifier reads ``output_hidden_states[layer]`` of the base model's decoder
(``model.base_model``, so no vocabulary projection is computed for it) and pools it over the
*answer tokens so far* (see :class:`~hf_unlearn.t3.T3ClassifierConfig`).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

SUPPORTED_ATTENTION = ("eager", "sdpa")


def check_attention(model: Any) -> None:
    """Candidate scoring uses a custom 4D attention mask, which eager and SDPA attention accept."""
    impl = getattr(model.config, "_attn_implementation", None) or "eager"
    if impl not in SUPPORTED_ATTENTION:
        raise ValueError(
            f"T3 scores candidates with a custom 4D attention mask, which attn_implementation={impl!r} does not "
            f"support; load the base model with attn_implementation='sdpa' or 'eager'."
        )


def decoder_of(model: Any) -> Any:
    """The base model's decoder (``LlamaModel`` inside ``LlamaForCausalLM``), or the model itself."""
    return getattr(model, "base_model", model)


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids of a left- or right-padded batch: ``cumsum(mask) - 1`` (0 on padding)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)


class _EarlyExit(Exception):
    def __init__(self, hidden: torch.Tensor) -> None:
        super().__init__()
        self.hidden = hidden


def _resolved_layer(decoder: Any, layer: int) -> tuple[int, Any]:
    """``(index into output_hidden_states, decoder.layers or None)``."""
    layers = getattr(decoder, "layers", None)
    n = len(layers) if isinstance(layers, torch.nn.ModuleList) else None
    if n is None:
        return layer, None
    return layer % (n + 1), layers


def layer_hidden(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    layer: int,
    past_key_values: Any = None,
) -> torch.Tensor:
    """``output_hidden_states[layer]`` of the decoder for ``input_ids`` (``[B, Q, H]``).

    ``attention_mask`` is 2D (padding) or an additive 4D mask; ``past_key_values`` (a
    ``DynamicCache``) is extended in place when given. For an intermediate layer
    ``1 <= layer < num_layers`` the forward stops at the input of decoder layer ``layer`` (which
    is ``output_hidden_states[layer]``): the layers above are never run, and only the cache
    entries of the layers below are extended (see :func:`crop_cache_to`).
    """
    decoder = decoder_of(model)
    index, layers = _resolved_layer(decoder, layer)
    kwargs = dict(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=past_key_values is not None,
        **cache_kwargs(decoder, past_key_values),
    )
    if layers is not None and 1 <= index < len(layers):

        def stop(module, args, kw):
            raise _EarlyExit(args[0] if args else kw["hidden_states"])

        handle = layers[index].register_forward_pre_hook(stop, with_kwargs=True)
        try:
            decoder(**kwargs)
        except _EarlyExit as exit_:
            return exit_.hidden
        finally:
            handle.remove()
        raise RuntimeError(f"Decoder layer {index} was never called; cannot read hidden states at layer {layer}.")
    return decoder(output_hidden_states=True, **kwargs).hidden_states[layer]


def crop_cache_to(cache: Any, length: int) -> None:
    """Cut every layer of a ``DynamicCache`` back to its first ``length`` positions (layers that
    are shorter, e.g. not reached by an early-exit forward, are left alone)."""
    for lyr in getattr(cache, "layers", []):
        current = lyr.get_seq_length()
        if current > length:
            lyr.crop(length - current)


def cache_kwargs(module: Any, cache: Any) -> dict[str, Any]:
    """``{"cache": cache}`` for models whose forward takes ``cache`` (transformers >= 5.2x),
    else ``{"past_key_values": cache}``; empty when ``cache`` is None."""
    if cache is None:
        return {}
    try:
        params = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        params = {}
    return {"cache": cache} if "cache" in params else {"past_key_values": cache}
