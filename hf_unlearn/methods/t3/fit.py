"""Fitting the T3 guidance head on cached pooled hidden states of the frozen base: binary cross-entropy on the
logit of the observed next token (retain 1, forget 0) over the answer positions ``B`` of mini-batches::

    L = sum_{i in B} c_i BCE(g(pool_i)[y_i], s_i) / sum_{i in B} c_i,   c_i = 1, or |B| / (2 |B_{s_i}|) (class_balance)

with the states standardised, the standardisation folded into the head afterwards (``D' = D / scale``,
``c = -D' mean``).
"""

from __future__ import annotations

import random
import time
from typing import Any

import torch

from .cache import _prepare, cache_fit_states
from .config import T3ClassifierConfig
from .head_training import _accuracies, _train_head
from .modeling import T3Classifier


def _split(examples: list[int], fraction: float, rng: random.Random) -> tuple[list[int], list[int]]:
    idx = list(examples)
    rng.shuffle(idx)
    n_hold = min(len(idx) - 1, max(1, round(fraction * len(idx)))) if fraction > 0 and len(idx) >= 2 else 0
    return sorted(idx[n_hold:]), sorted(idx[:n_hold])


def fit_t3(
    model: Any, tokenizer: Any, forget: Any, retain: Any, config: T3ClassifierConfig | None = None, *,
    progress: bool = True, device: Any = None, cache_device: Any = None, **overrides: Any,
) -> T3Classifier:
    """Fit a :class:`T3Classifier` telling ``retain`` (1) from ``forget`` (0) answers of ``model`` (TOFU-shaped rows or
    documents); ``overrides`` replace fields of ``config``. Every refusal comes before the first forward pass; a
    non-finite loss or head raises ``ValueError``. Under ``torchrun`` the head is fitted on rank 0 and broadcast.
    """
    from ...devices import device_of, join_launch, move_to_device, on_main_process, resolve_device

    cache_device = None if cache_device is None else resolve_device(cache_device)
    move_to_device(model, device)
    if not join_launch():
        return _fit_t3_here(model, tokenizer, forget, retain, config, progress, cache_device, overrides)
    head = on_main_process(
        lambda: _fit_t3_here(model, tokenizer, forget, retain, config, progress, cache_device, overrides).cpu())
    return head.to(device_of(model))


def _fit_t3_here(model: Any, tokenizer: Any, forget: Any, retain: Any, config: T3ClassifierConfig | None,
                 progress: bool, cache_device: str | None, overrides: dict[str, Any]) -> T3Classifier:
    """:func:`fit_t3` in this process."""
    start = time.perf_counter()
    prep = _prepare(model, tokenizer, forget, retain, config, overrides, fingerprint=True)
    config = prep.config
    forget_rows, retain_rows = prep.forget_rows, prep.retain_rows
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    cache_start = time.perf_counter()
    (xf, tf, of), (xr, tr, orr) = cache_fit_states(model, prep, pad_id, progress, cache_device)
    cache_seconds = time.perf_counter() - cache_start

    train_start = time.perf_counter()
    x = torch.cat([xf, xr])
    tokens = torch.cat([tf, tr])
    y = torch.cat([torch.zeros(len(xf)), torch.ones(len(xr))]).to(x.device)
    owners = torch.cat([of, orr + len(forget_rows)])
    rng = random.Random(int(config.seed))
    f_train = list(range(len(forget_rows)))  # every forget row is fitted, as the authors fit
    r_train, r_hold = _split([i + len(forget_rows) for i in range(len(retain_rows))],
                             float(config.holdout_fraction), rng)
    held_mask = torch.isin(owners, torch.tensor(r_hold, device=owners.device, dtype=owners.dtype))
    clf = T3Classifier(config)
    record = _train_head(clf, x, tokens, y, owners, f_train, r_train, held_mask if r_hold else None, config,
                         progress, device=next(model.parameters()).device)
    bad = clf.non_finite_parameters()
    if bad:
        raise ValueError(f"Fitting left the T3 head with non-finite weights ({', '.join(bad)}); lower learning_rate="
                         f"{config.learning_rate}.")
    report: dict[str, Any] = {**record, **_fit_accuracies(clf, x, tokens, y, held_mask, len(r_hold))}
    train_seconds = time.perf_counter() - train_start

    n_base = sum(p.numel() for p in model.parameters())
    n_head = sum(p.numel() for p in clf.parameters())  # rank (hidden + vocab + 1)
    report.update(
        n_forget_examples=len(forget_rows), n_retain_examples=len(retain_rows), n_forget_positions=len(xf),
        n_retain_positions=len(xr), truncated_examples=prep.truncated, max_positions=prep.limit,
        cache_seconds=cache_seconds, train_seconds=train_seconds, fit_seconds=time.perf_counter() - start,
        trainable_parameters=n_head, base_parameters=n_base, parameter_share=n_head / max(n_base, 1),
    )
    clf.config.fit_report = report
    clf.fit_report = report
    for p in clf.parameters():
        p.requires_grad_(False)
    return clf.eval()


def _fit_accuracies(clf: T3Classifier, x: torch.Tensor, tokens: torch.Tensor, y: torch.Tensor,
                    held_mask: torch.Tensor, heldout_examples: int) -> dict[str, Any]:
    """The fitted head's accuracies on the held-out retain positions (``None`` without a hold-out) and the others."""
    if heldout_examples:
        held = _accuracies(clf, x[held_mask], tokens[held_mask], y[held_mask])
        out = {"heldout_accuracy": held["accuracy"], "heldout_balanced_accuracy": held["balanced_accuracy"],
               "heldout_examples": heldout_examples}
    else:
        out = {"heldout_accuracy": None, "heldout_balanced_accuracy": None, "heldout_examples": 0}
    train = _accuracies(clf, x[~held_mask], tokens[~held_mask], y[~held_mask])
    out.update(train_accuracy=train["accuracy"], train_balanced_accuracy=train["balanced_accuracy"])
    return out
