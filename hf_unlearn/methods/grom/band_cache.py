"""Measuring many GROM edits from one pass: the hidden states entering the edited band, cached once per row.

An edit ``W <- W + P`` of modules in decoder blocks ``l0 <= l <= l1`` (or of the LM head) leaves everything
computed before block ``l0`` unchanged. So for a row set scored by the criterion,

    h_b = input of block l0 for batch b, with the unedited model (one forward per batch, kept),

and a candidate edit's log-probabilities are those of the model's own forward with blocks ``0 .. l0-1`` skipped and
``h_b`` put in as block ``l0``'s input: the blocks from the band on, the final norm and the LM head run as in a plain
forward (same code), so the scores equal the uncached ones up to float rounding.

What a candidate costs beyond the band's blocks is the LM head, which over a large vocabulary costs as much as
several blocks (SmolLM2-135M's 576 x 49,152 head, about 8 of its 30). A replay computes logits only where a label
is scored: the pairs ``(b, t)`` with ``answer_mask(labels)[b, t + 1]`` (:func:`scored_pairs`), gathered into one
``[1, N, H]`` input of the head by a forward pre-hook (``logits_mode = "pairs"``), so

    log p(y_{b,t+1}) = z_{b,t}[y_{b,t+1}] - logsumexp_v z_{b,t}[v],    z_{b,t} = head(norm(h_{b,t}))

is computed for those ``N`` pairs and no others. Where that hook does not reproduce the plain forward, the replay
asks for the positions scored in some row (``logits_to_keep``, ``"positions"``), else for every logit (``"all"``).
Attention in the later blocks reads every position of the row, so ``h_b`` holds all positions (``[B, L, H]`` in the
model's dtype; on the CPU with ``cache_device="cpu"``). An edit of the LM head alone caches the final norm's input and
runs no block.

The caching pass stops at the band (``keep_plain=False``) when the unedited model's own scores of that row set are
not needed (every set but the retain rows that give the original model's figures): the blocks from the band on and
the head then do not run. One batch of one set runs whole (``True``, or ``"first"`` when no set needs its scores), for
:meth:`BandCache.replays_exactly` to compare the replay against. The batches are those
of the criterion's own scoring loop, run once (:class:`~hf_unlearn.scoring_pass.RowBatches` maps them back to rows),
so every candidate sees exactly the batches a full pass would.

Skipping works by handing the decoder a shorter list of blocks during the replay and replacing the first kept
block's input through a forward pre-hook. :meth:`BandCache.replays_exactly` checks, on the first batch, that this
reproduces the plain forward of the unedited model; callers fall back to full passes when it does not (a decoder
whose forward depends on the position of a block in its list).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from ...logprobs import answer_mask, label_log_probs
from ...scoring_pass import RowBatches
from .keys import _final_norm


@dataclass
class BandEntry:
    """Where a replay starts: ``owner.<attr>`` is the decoder's list of blocks, ``start`` the first block that runs
    (``len(blocks)`` when only the LM head is edited) and ``module`` the one whose input is cached (that block, or
    the final norm)."""

    owner: nn.Module
    attr: str
    start: int
    module: nn.Module


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


def band_entry(model: nn.Module, module_names: Sequence[str]) -> BandEntry:
    """The :class:`BandEntry` of an edit of ``module_names``: the first edited block (by its index in the decoder's
    list of blocks), or the final norm when every edited module is outside the blocks (the LM head)."""
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
        path = _decoder_blocks(model)
        start = None
    owner_path, _, attr = path.rpartition(".")
    owner, layers = modules[owner_path], modules[path]
    if start is None:
        return BandEntry(owner, attr, len(layers), _final_norm(model))
    return BandEntry(owner, attr, start, layers[start])


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
    """The positions ``t`` (1-D, ascending) whose next label is scored in some row of the batch
    (``answer_mask(labels)[:, t + 1]``): the logits a replay in ``"positions"`` mode computes."""
    return answer_mask(labels)[:, 1:].any(dim=0).nonzero().squeeze(-1)


def scored_pairs(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, positions)`` (1-D, row-major) of the pairs ``(b, t)`` whose next label is scored
    (``answer_mask(labels)[b, t + 1]``): the only logits a replay in ``"pairs"`` mode computes."""
    rows, positions = answer_mask(labels)[:, 1:].nonzero(as_tuple=True)
    return rows, positions


def kept_label_log_probs(logits: torch.Tensor, labels: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """:func:`~hf_unlearn.logprobs.label_log_probs` from the logits of positions ``keep`` only (``[B, len(keep),
    V]``): ``out[:, keep + 1] = log_softmax(logits)[labels[:, keep + 1]]`` on scored labels, 0 elsewhere."""
    kept = logits.float()
    targets = labels[:, keep + 1]
    valid = answer_mask(labels)[:, keep + 1]
    picked = kept.gather(-1, targets.masked_fill(~valid, 0).unsqueeze(-1)).squeeze(-1) - torch.logsumexp(kept, dim=-1)
    out = torch.zeros(labels.shape, dtype=picked.dtype, device=picked.device)
    out[:, keep + 1] = picked * valid
    return out


def pair_label_log_probs(logits: torch.Tensor, labels: torch.Tensor, rows: torch.Tensor,
                         positions: torch.Tensor) -> torch.Tensor:
    """:func:`~hf_unlearn.logprobs.label_log_probs` from the logits of the pairs of :func:`scored_pairs` only
    (``[N, V]`` or ``[1, N, V]``, in that order): ``out[b, t + 1] = z[y] - logsumexp(z)`` with ``z`` the pair's logits
    and ``y = labels[b, t + 1]``; 0 at every position that is not scored."""
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


LOGITS_MODES = ("pairs", "positions", "all")


class BandCache:
    """The band inputs of one row set, cached by one pass of the criterion's scoring loop.

    ``score_rows(scorer)`` runs that loop (e.g. ``lambda s: criterion._score(model, tokenizer, rows, s)``); it is
    run once, with the unedited model, through :class:`~hf_unlearn.scoring_pass.RowBatches`. :meth:`current` gives
    the per-row log-probabilities of the model as it is now (edited in place), computed from the band on. With
    ``keep_plain=True`` (the default) the caching pass runs whole and :meth:`plain` gives its scores; with
    ``"first"`` it runs whole on the first batch only (what :meth:`replays_exactly` needs), with ``False`` it stops
    at the band on every batch. ``logits_mode`` (one of :data:`LOGITS_MODES`) is which logits a replay computes; it
    is settled by :meth:`replays_exactly` and copied to the other caches of a pass by the caller.
    """

    def __init__(
        self, model: nn.Module, entry: BandEntry, score_rows: Any, cache_device: str | torch.device | None = None,
        keep_plain: bool | str = True,
    ) -> None:
        if keep_plain not in (True, False, "first"):
            raise ValueError(f"keep_plain must be True, False or 'first', got {keep_plain!r}.")
        self.model, self.entry, self.keep_plain = model, entry, keep_plain
        self.cache_device = None if cache_device is None else torch.device(cache_device)
        self.logits_mode = LOGITS_MODES[0]
        self._recorded = 0
        self.batches = RowBatches(score_rows, self._record)

    @property
    def nbytes(self) -> int:
        """Bytes held by the cached hidden states."""
        return sum(h.numel() * h.element_size() for h, _ in self.batches.kept)

    def _record(self, input_ids, attention_mask, position_ids, labels) -> tuple[torch.Tensor, torch.Tensor | None]:
        captured: list[torch.Tensor] = []
        stop = self.keep_plain is False or (self.keep_plain == "first" and self._recorded > 0)
        self._recorded += 1

        def keep(module, args, kwargs):
            hidden = _hidden_arg(args, kwargs).detach()
            captured.append(hidden.to(self.cache_device, copy=True) if self.cache_device else hidden.clone())
            if stop:
                raise _StopAtBand

        handle = self.entry.module.register_forward_pre_hook(keep, with_kwargs=True)
        try:
            logits = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
        except _StopAtBand:
            logits = None
        finally:
            handle.remove()
        if len(captured) != 1:
            raise RuntimeError(f"The band's first module ran {len(captured)} times in one forward (expected once).")
        return captured[0], None if logits is None else label_log_probs(logits, labels)

    @torch.no_grad()
    def _replay(self, b: int) -> torch.Tensor:
        input_ids, attention_mask, position_ids, labels = self.batches.inputs[b]
        hidden = self.batches.kept[b][0].to(input_ids.device)
        if self.logits_mode == "pairs":
            rows, positions = scored_pairs(labels)
        elif self.logits_mode == "positions":
            keep = predicting_positions(labels)
        extra = {"logits_to_keep": keep} if self.logits_mode == "positions" else {}
        hooks = []
        try:
            hooks.append(self.entry.module.register_forward_pre_hook(
                lambda module, args, kwargs: _with_hidden(args, kwargs, hidden), with_kwargs=True))
            if self.logits_mode == "pairs":
                hooks.append(self.model.get_output_embeddings().register_forward_pre_hook(
                    lambda module, args: (args[0][rows, positions].unsqueeze(0), *args[1:])))
            with _skip_before(self.entry):
                logits = self.model(input_ids=input_ids, attention_mask=attention_mask,
                                    position_ids=position_ids, **extra).logits
        finally:
            for handle in hooks:
                handle.remove()
        if self.logits_mode == "pairs":
            return pair_label_log_probs(logits, labels, rows, positions)
        if self.logits_mode == "positions":
            return kept_label_log_probs(logits, labels, keep)
        return label_log_probs(logits, labels)

    def plain(self) -> list[np.ndarray]:
        """Per-row answer-token log-probabilities of the caching pass (the unedited model); needs ``keep_plain``."""
        if self.keep_plain is not True:
            raise RuntimeError(f"This band cache stopped its caching pass at the band (keep_plain={self.keep_plain!r}).")
        return self.batches.rows_of([lp for _, lp in self.batches.kept])

    def current(self) -> list[np.ndarray]:
        """Per-row answer-token log-probabilities of the model as it is now, from the band on."""
        return self.batches.rows_of([self._replay(b) for b in range(len(self.batches.kept))])

    def replays_exactly(self, atol: float = 1e-4) -> bool:
        """Whether the first batch, replayed through the unedited model, gives the caching pass's log-probabilities
        (within ``atol``); call it before any edit is applied. Tries the :data:`LOGITS_MODES` in order and keeps the
        first that reproduces them (a model without ``get_output_embeddings`` or ``logits_to_keep``, or whose logits
        there differ, moves on to the next); False when none does."""
        if not self.batches.kept:
            return True
        plain = self.batches.kept[0][1]
        if plain is None:
            raise RuntimeError("This band cache kept no plain scores to check the replay against (keep_plain=False).")
        for mode in LOGITS_MODES:
            self.logits_mode = mode
            try:
                if torch.allclose(self._replay(0), plain, rtol=0.0, atol=atol):
                    return True
            except (TypeError, AttributeError, IndexError, RuntimeError):
                continue
        return False
