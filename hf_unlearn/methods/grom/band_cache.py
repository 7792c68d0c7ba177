"""Measuring many GROM edits from one pass: the hidden states entering the edited band, cached once per row.

An edit of blocks ``l0 <= l`` (or of the LM head) leaves everything before block ``l0`` unchanged, so a candidate
runs from block ``l0``'s cached input. When block ``l0``'s only edited module is its last residual writer the
block's output is linear in the edit, ``out_b(P) = out_b(0) + x_b P^T``, and only the later blocks run (checked
under a random perturbation of ``W``). Logits are computed only at the scored pairs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ...logprobs import answer_mask, label_log_probs
from ...scoring_pass import RowBatches
from .keys import _final_norm


@dataclass
class BandEntry:
    """Where a replay starts: ``owner.<attr>`` is the list of blocks, ``start`` the first block that runs and
    ``module`` the one whose input is cached (that block, or the final norm). With a ``tail`` (the edited last
    writer of block ``start - 1``) the cached input is corrected by ``x P^T``; ``plain`` is the entry at that block."""

    owner: nn.Module
    attr: str
    start: int
    module: nn.Module
    tail: nn.Linear | None = None
    plain: BandEntry | None = None


def _block_list(model: nn.Module, name: str) -> tuple[str, int] | None:
    """``(path of the ModuleList, block index)`` when module ``name`` sits in a list of blocks, else None."""
    modules = dict(model.named_modules())
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:i])
        if isinstance(modules.get(prefix), nn.ModuleList) and parts[i].isdigit():
            return prefix, int(parts[i])
    return None


def _decoder_blocks(model: nn.Module) -> str:
    """The path of the decoder's list of blocks: the ModuleList with ``num_hidden_layers`` entries."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    n = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None)
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) == n:
            return name
    raise ValueError(f"Cannot find the decoder blocks of {type(model).__name__} (a ModuleList of {n} layers).")


def band_entry(model: nn.Module, module_names: Sequence[str], tail: bool = False) -> BandEntry:
    """The :class:`BandEntry` of an edit of ``module_names``: the first edited block, or the final norm for the LM
    head; with ``tail``, the shortcut entry after that block when its one edited module is an ``nn.Linear``."""
    located = [_block_list(model, n) for n in module_names]
    blocks = [loc for loc in located if loc is not None]
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    modules = dict(model.named_modules())
    outside = [n for n, loc in zip(module_names, located) if loc is None and modules[n] is not head]
    if outside:
        raise ValueError(f"Cannot place {outside} (neither in the decoder's blocks nor the LM head) in a band.")
    if blocks:
        paths = {p for p, _ in blocks}
        if len(paths) != 1:
            raise ValueError(f"The edited modules sit in several block lists ({sorted(paths)}).")
        path, start = paths.pop(), min(i for _, i in blocks)
    else:
        path, start = _decoder_blocks(model), None
    owner_path, _, attr = path.rpartition(".")
    owner, layers = modules[owner_path], modules[path]
    if start is None:
        return BandEntry(owner, attr, len(layers), _final_norm(model))
    entry = BandEntry(owner, attr, start, layers[start])
    in_first = [n for n, loc in zip(module_names, located) if loc == (path, start)]
    if not tail or len(in_first) != 1 or not isinstance(modules[in_first[0]], nn.Linear):
        return entry
    after = layers[start + 1] if start + 1 < len(layers) else _final_norm(model)
    return BandEntry(owner, attr, start + 1, after, tail=modules[in_first[0]], plain=entry)


@contextlib.contextmanager
def _skip_before(entry: BandEntry) -> Iterator[None]:
    """Run the decoder on blocks ``start ..`` only (the full list is put back on exit)."""
    full = getattr(entry.owner, entry.attr)
    setattr(entry.owner, entry.attr, nn.ModuleList(list(full)[entry.start:]))
    try:
        yield
    finally:
        setattr(entry.owner, entry.attr, full)


def predicting_positions(labels: torch.Tensor) -> torch.Tensor:
    """The positions ``t`` whose next label is scored in some row (``"positions"`` mode)."""
    return answer_mask(labels)[:, 1:].any(dim=0).nonzero().squeeze(-1)


def scored_pairs(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, positions)`` (1-D, row-major) of the pairs ``(b, t)`` with ``answer_mask(labels)[b, t + 1]``."""
    rows, positions = answer_mask(labels)[:, 1:].nonzero(as_tuple=True)
    return rows, positions


def kept_label_log_probs(logits: torch.Tensor, labels: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """:func:`~hf_unlearn.logprobs.label_log_probs` from the logits of positions ``keep`` only."""
    kept = logits.float()
    targets = labels[:, keep + 1]
    valid = answer_mask(labels)[:, keep + 1]
    picked = kept.gather(-1, targets.masked_fill(~valid, 0).unsqueeze(-1)).squeeze(-1) - torch.logsumexp(kept, dim=-1)
    out = torch.zeros(labels.shape, dtype=picked.dtype, device=picked.device)
    out[:, keep + 1] = picked * valid
    return out


def pair_label_log_probs(logits: torch.Tensor, labels: torch.Tensor, rows: torch.Tensor,
                         positions: torch.Tensor) -> torch.Tensor:
    """:func:`~hf_unlearn.logprobs.label_log_probs` from the logits of the :func:`scored_pairs` only."""
    z = logits.reshape(-1, logits.shape[-1]).float()
    targets = labels[rows, positions + 1]
    picked = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, dim=-1)
    out = torch.zeros(labels.shape, dtype=picked.dtype, device=picked.device)
    out[rows, positions + 1] = picked
    return out


def _hidden_arg(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


def _with_hidden(args: tuple, kwargs: dict, hidden: torch.Tensor) -> tuple[tuple, dict]:
    """A forward pre-hook's ``(args, kwargs)`` with the module's hidden-states input replaced."""
    if args:
        return (hidden, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": hidden}


class _StopAtBand(Exception):
    """Raised by the caching hook to end a forward once the band's input is kept."""


LOGITS_MODES = ("direct", "pairs", "positions", "all")


class BandCache:
    """The band inputs of one row set, cached by one pass of the scoring loop ``score_rows(scorer)``; ``keep_plain``:
    run that pass whole (``True``), its first batch only (``"first"``) or none of it beyond the band (``False``)."""

    def __init__(
        self, model: nn.Module, entry: BandEntry, score_rows: Any, cache_device: str | torch.device | None = None,
        keep_plain: bool | str = True,
    ) -> None:
        if keep_plain not in (True, False, "first"):
            raise ValueError(f"keep_plain must be True, False or 'first', got {keep_plain!r}.")
        self.model, self.entry, self.keep_plain = model, entry, keep_plain
        self.cache_device = None if cache_device is None else torch.device(cache_device)
        self.logits_mode = "pairs"
        self._recorded = 0
        self._tail_inputs: list[torch.Tensor] = []
        self._plain_input: torch.Tensor | None = None  # the plain entry's input of the first batch (the check)
        self._tail_weight = None if entry.tail is None else entry.tail.weight.detach().clone()
        self._pairs: tuple | None = None  # the scored pairs of every batch, for "direct"
        self.batches = RowBatches(score_rows, self._record)

    @property
    def nbytes(self) -> int:
        """Bytes held by the cached hidden states (and the tail module's inputs)."""
        held = [h for h, _ in self.batches.kept] + self._tail_inputs
        return sum(h.numel() * h.element_size() for h in held)

    def _keep(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.detach().to(self.cache_device, copy=True) if self.cache_device else tensor.detach().clone()

    def _record(self, input_ids, attention_mask, position_ids, labels) -> tuple[torch.Tensor, torch.Tensor | None]:
        captured: list[torch.Tensor] = []
        stop = self.keep_plain is False or (self.keep_plain == "first" and self._recorded > 0)
        first = self._recorded == 0
        self._recorded += 1

        def keep(module, args, kwargs):
            captured.append(self._keep(_hidden_arg(args, kwargs)))
            if stop:
                raise _StopAtBand

        handles = [self.entry.module.register_forward_pre_hook(keep, with_kwargs=True)]
        if self.entry.tail is not None:
            handles.append(self.entry.tail.register_forward_hook(
                lambda module, args, output: self._tail_inputs.append(self._keep(args[0]))))
            if first and self.keep_plain is not False:  # the check's batch
                def keep_plain_input(module, args, kwargs):
                    self._plain_input = self._keep(_hidden_arg(args, kwargs))

                handles.append(self.entry.plain.module.register_forward_pre_hook(keep_plain_input, with_kwargs=True))
        try:
            logits = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
        except _StopAtBand:
            logits = None
        finally:
            for handle in handles:
                handle.remove()
        if len(captured) != 1 or (self.entry.tail is not None and len(self._tail_inputs) != self._recorded):
            raise RuntimeError("The band's first module ran more than once in one forward (expected once).")
        return captured[0], None if logits is None else label_log_probs(logits, labels)

    def _tail_delta(self) -> torch.Tensor | None:
        """``P = W - W_0`` of the tail module (None without a tail or when it is unedited)."""
        if self.entry.tail is None:
            return None
        delta = self.entry.tail.weight.detach() - self._tail_weight
        return delta if bool(delta.any()) else None

    @torch.no_grad()
    def _direct(self, delta: torch.Tensor | None) -> list[torch.Tensor]:
        """Every batch's log-probabilities from ``head(norm(h + x delta^T))`` at its scored pairs, in one product."""
        head = self.model.get_output_embeddings()
        if head is None or self.entry.start < len(getattr(self.entry.owner, self.entry.attr)):
            raise RuntimeError("Blocks run after the entry, or the model has no LM head to call.")
        if not self.batches.kept:
            return []
        if self._pairs is None:
            where = [scored_pairs(labels) for *_, labels in self.batches.inputs]
            hidden = torch.cat([h[r, t] for (h, _), (r, t) in zip(self.batches.kept, where)])
            x = None if self.entry.tail is None else torch.cat([x[r, t] for x, (r, t) in zip(self._tail_inputs, where)])
            gold = torch.cat([labels[r, t + 1] for (*_, labels), (r, t) in zip(self.batches.inputs, where)])
            self._pairs = (where, hidden, x, gold)
        where, hidden, x, gold = self._pairs
        h = hidden.to(head.weight.device)
        if delta is not None:
            h = h + (x.to(device=delta.device, dtype=delta.dtype) @ delta.T).to(h.dtype)
        z = head(self.entry.module(h)).float()
        picked = -F.cross_entropy(z, gold.to(z.device), reduction="none")  # z[y] - logsumexp(z), fused
        out, start = [], 0
        for (rows, positions), (*_, labels) in zip(where, self.batches.inputs):
            lp = torch.zeros(labels.shape, dtype=picked.dtype, device=picked.device)
            lp[rows.to(lp.device), positions.to(lp.device) + 1] = picked[start:start + len(rows)]
            out.append(lp)
            start += len(rows)
        return out

    @torch.no_grad()
    def _replay(self, b: int, entry: BandEntry | None = None, hidden: torch.Tensor | None = None,
                delta: torch.Tensor | None = None, mode: str | None = None) -> torch.Tensor:
        """Log-probabilities ``[B, L]`` of batch ``b`` from ``entry`` on; ``hidden`` is the entry module's input
        (default: the cached one, plus ``x_b delta^T`` with a tail ``delta``)."""
        entry, mode = entry or self.entry, mode or self.logits_mode
        if mode == "direct":
            return self._direct(delta)[b]
        input_ids, attention_mask, position_ids, labels = self.batches.inputs[b]
        if hidden is None:
            hidden = self.batches.kept[b][0].to(input_ids.device)
            if delta is not None:
                x = self._tail_inputs[b].to(device=delta.device, dtype=delta.dtype)
                hidden = hidden + (x @ delta.T).to(hidden.dtype)
        if mode == "pairs":
            rows, positions = scored_pairs(labels)
        elif mode == "positions":
            keep = predicting_positions(labels)
        extra = {"logits_to_keep": keep} if mode == "positions" else {}
        hooks = []
        try:
            hooks.append(entry.module.register_forward_pre_hook(
                lambda module, args, kwargs: _with_hidden(args, kwargs, hidden), with_kwargs=True))
            if mode == "pairs":
                hooks.append(self.model.get_output_embeddings().register_forward_pre_hook(
                    lambda module, args: (args[0][rows, positions].unsqueeze(0), *args[1:])))
            with _skip_before(entry):
                logits = self.model(input_ids=input_ids, attention_mask=attention_mask,
                                    position_ids=position_ids, **extra).logits
        finally:
            for handle in hooks:
                handle.remove()
        if mode == "pairs":
            return pair_label_log_probs(logits, labels, rows, positions)
        if mode == "positions":
            return kept_label_log_probs(logits, labels, keep)
        return label_log_probs(logits, labels)

    def plain(self) -> list[np.ndarray]:
        """Per-row answer-token log-probabilities of the caching pass (the unedited model)."""
        if self.keep_plain is not True:
            raise RuntimeError(f"This band cache stopped its caching pass at the band (keep_plain={self.keep_plain!r}).")
        return self.batches.rows_of([lp for _, lp in self.batches.kept])

    def current(self) -> list[np.ndarray]:
        """Per-row answer-token log-probabilities of the model as it is now, from the entry on."""
        delta = self._tail_delta()
        if self.logits_mode == "direct":
            return self.batches.rows_of(self._direct(delta))
        return self.batches.rows_of([self._replay(b, delta=delta) for b in range(len(self.batches.kept))])

    def replays_exactly(self, atol: float = 1e-4) -> bool:
        """Whether a replay of the first batch gives the caching pass's scores (setting :attr:`logits_mode`) and,
        with a tail, the shortcut equals a replay of its block under a perturbed weight. Call it before any edit."""
        if not self.batches.kept:
            return True
        plain = self.batches.kept[0][1]
        if plain is None:
            raise RuntimeError("This band cache kept no plain scores to check the replay against (keep_plain=False).")
        for mode in LOGITS_MODES:
            self.logits_mode = mode
            try:
                if torch.allclose(self._replay(0), plain, rtol=0.0, atol=atol):
                    break
            except (TypeError, AttributeError, IndexError, RuntimeError):
                continue
        else:
            return False
        return self.entry.tail is None or self._tail_is_linear(plain, atol)

    @torch.no_grad()
    def _tail_is_linear(self, plain: torch.Tensor, atol: float) -> bool:
        """The shortcut against a replay of the tail's block under ``W + E``, ``E`` a seeded Gaussian."""
        weight = self.entry.tail.weight
        scale = 0.1 * float(weight.float().std().clamp_min(1e-3))
        noise = (scale * torch.randn(weight.shape, generator=torch.Generator().manual_seed(0))).to(weight)
        try:
            weight.add_(noise)
            via_block = self._replay(0, self.entry.plain, self._plain_input.to(weight.device), mode="all")
            shortcut = self._replay(0, delta=self._tail_delta())
        finally:
            weight.copy_(self._tail_weight)
        return bool(torch.allclose(shortcut, via_block, rtol=0.0, atol=atol)) and not torch.equal(via_block, plain)
