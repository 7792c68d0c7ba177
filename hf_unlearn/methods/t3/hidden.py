"""Reading the base's ``output_hidden_states[layer]`` for T3 through forward hooks, and the causal mean pool
``pool_t = sum_{s <= t} m_s h_s / max(1, sum_{s <= t} m_s)`` (``m`` the attention mask)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...data.prompts import model_max_positions


def resolve_layer(model: Any, layer: int) -> tuple[Any, torch.nn.Module | None, int]:
    """``(decoder, block whose input is output_hidden_states[layer] or None, index)``."""
    decoder = None
    if hasattr(model, "get_decoder"):
        try:
            decoder = model.get_decoder()
        except (AttributeError, NotImplementedError):
            pass
    decoder = decoder if decoder is not None else getattr(model, "base_model", model)
    layers = next((m for m in (getattr(decoder, a, None) for a in ("layers", "h", "blocks"))
                   if isinstance(m, torch.nn.ModuleList)), None)
    if layers is None:
        raise ValueError(f"Cannot find the decoder blocks of {type(decoder).__name__} (looked for .layers, .h, .blocks).")
    n = len(layers)
    if not -(n + 1) <= int(layer) <= n:
        raise ValueError(f"layer={layer} is out of range for a base with {n} layers (use -{n + 1}..{n}).")
    index = int(layer) % (n + 1)
    return decoder, (None if index == n else layers[index]), index


def check_length(model: Any, length: int, what: str) -> None:
    """Refuse a sequence longer than the base's maximum positions, before the base indexes past them."""
    limit = model_max_positions(model)
    if limit is not None and length > limit:
        raise ValueError(f"{what} has {length} positions but the base model accepts at most {limit}; truncate it.")


def causal_mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """``pool_t = sum_{s<=t} m_s h_s / max(1, sum_{s<=t} m_s)`` for every position (float32, ``[B, L, H]``)."""
    h = hidden.float()
    if attention_mask is None:
        m = torch.ones(h.shape[:2], device=h.device, dtype=torch.float32)
    else:
        m = attention_mask.to(device=h.device, dtype=torch.float32)
    sums = (h * m.unsqueeze(-1)).cumsum(dim=1)
    return sums / m.cumsum(dim=1).clamp_min(1.0).unsqueeze(-1)


class _Stop(Exception):
    pass


class HiddenStateHook:
    """Calls ``callback(hidden [B, Q, H], attention_mask or None)`` with layer ``layer``'s hidden state on every
    forward of the base (a context manager); sequences longer than ``max_positions`` are refused before it runs."""

    def __init__(
        self, model: Any, layer: int, callback: Callable[[torch.Tensor, torch.Tensor | None], None],
        stop_early: bool = False, max_positions: int | None = None,
    ) -> None:
        self.decoder, block, _ = resolve_layer(model, layer)
        self.max_positions = max_positions
        self.callback = callback
        self.stop_early = stop_early and block is not None
        self._mask: torch.Tensor | None = None
        self._handles = [self.decoder.register_forward_pre_hook(self._decoder_pre, with_kwargs=True)]
        if block is None:
            self._handles.append(self.decoder.register_forward_hook(self._decoder_post))
        else:
            self._handles.append(block.register_forward_pre_hook(self._block_pre, with_kwargs=True))

    def _decoder_pre(self, module: Any, args: tuple, kwargs: dict) -> None:
        mask = kwargs.get("attention_mask")
        if mask is None and len(args) > 1 and isinstance(args[1], torch.Tensor):
            mask = args[1]
        if mask is not None and mask.dim() != 2:
            raise ValueError(f"T3 reads padding from a 2D attention mask, but the decoder received a {mask.dim()}D "
                             "mask; pass the tokenizer's attention_mask.")
        if self.max_positions is not None:
            if mask is not None:
                length = mask.shape[1]
            else:  # no mask: the furthest position the forward encodes
                positions = kwargs.get("position_ids")
                length = int(positions.max()) + 1 if isinstance(positions, torch.Tensor) else 0
            if length > self.max_positions:
                raise ValueError(f"The sequence has {length} positions but the base model accepts at most "
                                 f"{self.max_positions}; truncate the prompt or lower max_new_tokens.")
        self._mask = mask

    def _decoder_post(self, module: Any, args: tuple, output: Any) -> None:
        hidden = output if isinstance(output, torch.Tensor) else getattr(output, "last_hidden_state", None)
        self.callback(output[0] if hidden is None else hidden, self._mask)

    def _block_pre(self, module: Any, args: tuple, kwargs: dict) -> None:
        hidden = args[0] if args else kwargs["hidden_states"]
        self.callback(hidden, self._mask)
        if self.stop_early:
            raise _Stop

    def run(self, **inputs: Any) -> None:
        """Run the decoder on ``inputs`` (stopping early after the hook when ``stop_early``)."""
        try:
            self.decoder(**inputs)
        except _Stop:
            pass

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def __enter__(self) -> HiddenStateHook:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


@torch.no_grad()
def layer_hidden(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None,
    layer: int,
) -> torch.Tensor:
    """``output_hidden_states[layer]`` of a batch (``[B, L, H]``); the layers above it are not run."""
    captured: list[torch.Tensor] = []
    with HiddenStateHook(model, layer, lambda h, m: captured.append(h), stop_early=True) as hook:
        hook.run(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    if not captured:
        raise RuntimeError(f"The base's forward never reached layer {layer}; cannot read its hidden states.")
    return captured[-1]
