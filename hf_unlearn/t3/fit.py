"""Fitting the T3 guidance head on cached pooled hidden states of the frozen base.

1. **Caching.** One no-grad forward pass of the frozen base over forget + retain (``batch_size``
   examples at a time, progress bar) reads layer ``layer``'s hidden states through a hook (an
   intermediate layer stops the forward there; no LM head is computed) and keeps, for every
   position ``t`` whose next token ``y_{t+1}`` is an answer token, the causal mean-pooled state
   ``pool_t`` (see :mod:`hf_unlearn.t3.hidden`) and the token ``y_{t+1}``. Nothing else of the
   base's activations is kept.
2. **Head training.** Only the head is trained, with binary cross-entropy on the logit of the
   observed next token, label 1 on retain answer tokens and 0 on forget answer tokens (the authors'
   ``T3`` trainer loss)::

       L = sum_i c_i BCE(g(pool_i)[y_i], s_i) / sum_i c_i,     c_i = 1, or N / (2 N_{s_i}) when balanced.

   The pooled states are standardised per feature during training (AdamW converges in a few
   hundred steps on the cache); the standardisation is folded into ``D`` and ``b`` afterwards, so the
   saved head is exactly ``g = U (D pool) + b``. Deviation from the authors' trainer, which runs the
   base on every epoch of every minibatch: the base runs once, and the head trains on the cache.

Held-out accuracy is measured on a split of whole examples (``holdout_fraction`` of each class),
then the head is refitted on all examples. Sequences are truncated to the base's maximum positions
(and ``max_length``); examples left without an answer token are dropped and counted. The
caller's tokenizer is never modified. Timings (caching and head training apart) and accuracies
land in ``classifier.fit_report`` (and in ``config.fit_report``, saved with the head).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import fields
from typing import Any

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..data.pairing import overlapping_examples
from ..data.prompts import IGNORE_INDEX, collate_qa, tokenize_qa
from .config import T3ClassifierConfig
from .hidden import causal_mean_pool, layer_hidden, model_max_positions
from .modeling import T3Classifier


def _rows(data: Any, name: str) -> list[dict[str, Any]]:
    if data is None:
        raise ValueError(f"The {name} set is missing.")
    rows = data if isinstance(data, list) else [dict(r) for r in data]
    if len(rows) == 0:
        raise ValueError(f"The {name} set is empty: T3 needs forget and retain examples to fit its head.")
    if "question" not in rows[0] or "answer" not in rows[0]:
        raise ValueError(f"{name} rows need 'question' and 'answer' fields, got {sorted(rows[0])}.")
    return rows


def tokenize_examples(
    tokenizer: Any, rows: list[dict[str, Any]], limit: int | None, template: str | None = None
) -> tuple[list[dict[str, Any] | None], int]:
    """Tokenized prompt + answer of each row, cut to ``limit`` tokens; ``None`` for a row with no answer
    token left to predict. Returns ``(features, number of truncated rows)``."""
    out: list[dict[str, Any] | None] = []
    truncated = 0
    for r in rows:
        f = tokenize_qa(tokenizer, r["question"], r["answer"], template=template)
        if limit is not None and len(f["input_ids"]) > limit:
            truncated += 1
            f = {k: (v[:limit] if isinstance(v, list) else v) for k, v in f.items()}
        out.append(f if any(lab != IGNORE_INDEX for lab in f["labels"][1:]) else None)
    return out, truncated


@torch.no_grad()
def cache_answer_states(
    model: Any,
    features: list[dict[str, Any] | None],
    layer: int,
    pad_token_id: int,
    *,
    batch_size: int = 16,
    progress: bool = True,
    desc: str = "caching pooled states",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(pooled [N, H], next_tokens [N], example_index [N])`` for every position ``t`` whose next token is an
    answer token: ``pooled = pool_t`` (causal mean over positions ``<= t``), ``next_tokens = y_{t+1}``.

    Kept in the base's dtype on the base's device; one forward per ``batch_size`` examples.
    """
    device = next(model.parameters()).device
    keep = [i for i, f in enumerate(features) if f is not None]
    order = sorted(keep, key=lambda i: len(features[i]["input_ids"]))
    pooled_parts, token_parts, owner_parts = [], [], []
    for start in tqdm(range(0, len(order), batch_size), desc=desc, disable=not progress, leave=False):
        idx = order[start : start + batch_size]
        batch = collate_qa([features[i] for i in idx], pad_token_id, "right")
        batch = {k: v.to(device) for k, v in batch.items()}
        hidden = layer_hidden(model, batch["input_ids"], batch["attention_mask"], batch["position_ids"], layer)
        pooled = causal_mean_pool(hidden, batch["attention_mask"])
        rows, cols = (batch["labels"][:, 1:] != IGNORE_INDEX).nonzero(as_tuple=True)
        pooled_parts.append(pooled[rows, cols].to(hidden.dtype))
        token_parts.append(batch["input_ids"][rows, cols + 1])
        owner_parts.append(torch.tensor(idx, device=device)[rows])
    if not pooled_parts:
        raise ValueError("No example has an answer token to fit on.")
    return torch.cat(pooled_parts), torch.cat(token_parts), torch.cat(owner_parts)


def _feature_stats(x: torch.Tensor, chunk: int = 65536) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-feature mean and standard deviation of ``x`` (float32), accumulated in float64 by chunks."""
    total = torch.zeros(x.shape[1], dtype=torch.float64, device=x.device)
    squares = torch.zeros_like(total)
    for i in range(0, len(x), chunk):
        part = x[i : i + chunk].double()
        total += part.sum(0)
        squares += (part * part).sum(0)
    mean = total / len(x)
    var = (squares / len(x) - mean * mean).clamp_min(0)
    return mean.float(), var.sqrt().float().clamp_min(1e-6)


def _train_head(
    clf: T3Classifier, x: torch.Tensor, tokens: torch.Tensor, y: torch.Tensor, config: T3ClassifierConfig,
    progress: bool,
) -> None:
    """BCE on the observed next token's logit, AdamW on standardised states, then the standardisation is folded
    into ``D`` and ``b`` (see the module docstring)."""
    device = x.device
    gen = torch.Generator(device="cpu").manual_seed(int(config.seed))
    mean, scale = _feature_stats(x)
    n_retain = float(y.sum())
    n_forget = float(len(y)) - n_retain
    clf.to(device=device, dtype=torch.float32)
    with torch.no_grad():
        clf.down.weight.copy_(torch.randn(clf.down.weight.shape, generator=gen).to(device) / math.sqrt(x.shape[1]))
        clf.up.weight.zero_()
        prior = 0.0 if config.class_balance else math.log(max(n_retain, 1.0) / max(n_forget, 1.0))
        clf.up.bias.fill_(prior)
    if config.class_balance:
        weights = torch.where(y > 0.5, len(y) / (2 * max(n_retain, 1.0)), len(y) / (2 * max(n_forget, 1.0)))
    else:
        weights = torch.ones_like(y)
    opt = torch.optim.AdamW(
        [{"params": [clf.down.weight, clf.up.weight], "weight_decay": float(config.weight_decay)},
         {"params": [clf.up.bias], "weight_decay": 0.0}],
        lr=float(config.learning_rate),
    )
    full = len(y) <= int(config.train_batch_size)
    clf.train()
    # The head's matmuls are tiny: on CPU intra-op threads only add synchronisation (and stall on a busy
    # machine), so the loop runs single-threaded and restores the setting after.
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)
    try:
        for _ in tqdm(range(int(config.steps)), desc="fitting T3 head", disable=not progress, leave=False):
            if full:
                xb, vb, yb, wb = x, tokens, y, weights
            else:
                idx = torch.randint(len(y), (int(config.train_batch_size),), generator=gen).to(device)
                xb, vb, yb, wb = x[idx], tokens[idx], y[idx], weights[idx]
            z = (xb.float() - mean) / scale
            logits = clf.token_logits(z, vb)
            loss = (F.binary_cross_entropy_with_logits(logits, yb, reduction="none") * wb).sum() / wb.sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    with torch.no_grad():  # g = U D (p - mean) / scale + b = U (D / scale) p + (b - U (D / scale) mean)
        clf.down.weight.div_(scale)
        clf.up.bias.sub_(clf.up.weight @ (clf.down.weight @ mean))
    clf.eval()


@torch.no_grad()
def _accuracies(clf: T3Classifier, x: torch.Tensor, tokens: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """Accuracy and balanced accuracy of ``g[y_{t+1}] > 0`` (retain) per cached position."""
    pred = torch.cat([
        (clf.token_logits(x[i : i + 65536].float(), tokens[i : i + 65536]) > 0).float()
        for i in range(0, len(x), 65536)
    ])
    per_class = [float((pred[y == c] == c).float().mean()) for c in (0.0, 1.0) if bool((y == c).any())]
    return {"accuracy": float((pred == y).float().mean()), "balanced_accuracy": sum(per_class) / len(per_class)}


def _split(examples: list[int], fraction: float, rng: random.Random) -> tuple[set[int], set[int]]:
    idx = list(examples)
    rng.shuffle(idx)
    n_hold = min(len(idx) - 1, max(1, round(fraction * len(idx)))) if fraction > 0 and len(idx) >= 2 else 0
    return set(idx[n_hold:]), set(idx[:n_hold])


def fit_t3(
    model: Any,
    tokenizer: Any,
    forget: Any,
    retain: Any,
    config: T3ClassifierConfig | None = None,
    *,
    progress: bool = True,
    **overrides: Any,
) -> T3Classifier:
    """Fit a :class:`T3Classifier` telling ``retain`` (label 1) from ``forget`` (label 0) answers of ``model``.

    ``forget`` and ``retain`` are TOFU-shaped rows (``question``, ``answer``; a ``datasets.Dataset`` or a
    list of dicts). ``config`` (default ``T3ClassifierConfig()``) sets the head and the fit; keyword
    ``overrides`` replace config fields (e.g. ``steps=100``). The base is frozen and run once.

    ``class_balance=True`` weighs the two classes equally, so ``f`` estimates ``P(retain)`` under equal
    class priors: in the well-specified limit its logit is the unbalanced one minus
    ``log(N_retain / N_forget)`` (positions counted), i.e. with more retain than forget text ``f`` is
    lower everywhere and the tilt also lowers retain answers more. Unbalanced (the authors' loss),
    ``f`` carries the retain share of the fitting data as its prior.

    Returns the head in eval mode on the base's device, with ``fit_report`` = ``{cache_seconds,
    train_seconds, fit_seconds, heldout_accuracy, heldout_balanced_accuracy, train_accuracy, ...}``.
    """
    start = time.perf_counter()
    config = config or T3ClassifierConfig()
    if overrides:
        known = {f.name for f in fields(T3ClassifierConfig)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"fit_t3 got unknown settings {unknown}; T3ClassifierConfig fields are {sorted(known)}.")
        data = {k: v for k, v in config.to_dict().items() if k in known}
        data.update(overrides)
        config = T3ClassifierConfig(**data)
    forget_rows, retain_rows = _rows(forget, "forget"), _rows(retain, "retain")
    overlap = overlapping_examples(forget_rows, retain_rows)
    if overlap:
        raise ValueError(
            f"{overlap} forget examples also occur in the retain set; the head cannot tell identical examples apart."
        )
    config = config.for_base(model)
    limit = model_max_positions(model)
    if config.max_length is not None:
        limit = int(config.max_length) if limit is None else min(limit, int(config.max_length))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)

    forget_feats, forget_cut = tokenize_examples(tokenizer, forget_rows, limit, config.prompt_template)
    retain_feats, retain_cut = tokenize_examples(tokenizer, retain_rows, limit, config.prompt_template)
    dropped = sum(f is None for f in forget_feats) + sum(f is None for f in retain_feats)
    for name, feats in (("forget", forget_feats), ("retain", retain_feats)):
        if all(f is None for f in feats):
            raise ValueError(
                f"No {name} example has an answer token within the first {limit} positions (the base's maximum "
                "positions / max_length); the prompts alone fill them."
            )

    was_training = model.training
    model.eval()
    cache_start = time.perf_counter()
    try:
        kw = dict(batch_size=int(config.batch_size), progress=progress)
        xf, tf, of = cache_answer_states(model, forget_feats, config.layer, pad_id, desc="caching forget", **kw)
        xr, tr, orr = cache_answer_states(model, retain_feats, config.layer, pad_id, desc="caching retain", **kw)
    finally:
        if was_training:
            model.train()
    cache_seconds = time.perf_counter() - cache_start

    train_start = time.perf_counter()
    x = torch.cat([xf, xr])
    tokens = torch.cat([tf, tr])
    y = torch.cat([torch.zeros(len(xf)), torch.ones(len(xr))]).to(x.device)
    owners = torch.cat([of, orr + len(forget_rows)])
    rng = random.Random(int(config.seed))
    f_train, f_hold = _split(sorted(set(of.tolist())), float(config.holdout_fraction), rng)
    r_train, r_hold = _split(sorted(int(o) + len(forget_rows) for o in set(orr.tolist())), float(config.holdout_fraction), rng)
    report: dict[str, Any] = {}
    clf = T3Classifier(config)
    if f_hold and r_hold:
        hold = torch.tensor(sorted(f_hold | r_hold), device=owners.device)
        held_mask = torch.isin(owners, hold)
        _train_head(clf, x[~held_mask], tokens[~held_mask], y[~held_mask], config, progress)
        held = _accuracies(clf, x[held_mask], tokens[held_mask], y[held_mask])
        report.update(heldout_accuracy=held["accuracy"], heldout_balanced_accuracy=held["balanced_accuracy"],
                      heldout_examples=len(f_hold) + len(r_hold))
    else:
        report.update(heldout_accuracy=None, heldout_balanced_accuracy=None, heldout_examples=0)
    _train_head(clf, x, tokens, y, config, progress)
    train = _accuracies(clf, x, tokens, y)
    train_seconds = time.perf_counter() - train_start

    n_base = sum(p.numel() for p in model.parameters())
    n_head = clf.num_trainable_parameters()
    report.update(
        train_accuracy=train["accuracy"],
        train_balanced_accuracy=train["balanced_accuracy"],
        n_forget_examples=len(forget_rows),
        n_retain_examples=len(retain_rows),
        n_forget_positions=len(xf),
        n_retain_positions=len(xr),
        truncated_examples=forget_cut + retain_cut,
        dropped_examples=dropped,
        max_positions=limit,
        cache_seconds=cache_seconds,
        train_seconds=train_seconds,
        fit_seconds=time.perf_counter() - start,
        trainable_parameters=n_head,
        base_parameters=n_base,
        parameter_share=n_head / max(n_base, 1),
    )
    clf.config.fit_report = report
    clf.fit_report = report
    for p in clf.parameters():
        p.requires_grad_(False)
    return clf.eval()
