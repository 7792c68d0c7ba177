"""Fitting the T3 classifier on cached hidden states of answer prefixes.

One pass of the frozen base over the forget (``S = 0``) and retain (``S = 1``) examples caches the
pooled hidden state of EVERY answer prefix ``(x, y_<=t)`` (for mean pooling a cumulative sum over
the answer positions, so all prefixes of an example come from one forward pass), because during
decoding the classifier scores partial answers. The head is then trained on the cache with
class-balanced binary cross-entropy::

    L = - sum_i w_{s_i} [ s_i log sigmoid(g(z_i)) + (1 - s_i) log (1 - sigmoid(g(z_i))) ] / sum_i w_{s_i},
    w_s = 1 / #{i : s_i = s}

Held-out accuracy is measured on a stratified split of whole examples (never prefixes of a
training example), then the head is refitted on all examples. Timings and accuracies land in
``classifier.fit_report`` (and ``classifier.config.fit_report``, saved with the head).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..data.pairing import overlapping_examples
from ..data.prompts import IGNORE_INDEX, collate_qa, ensure_pad_token, tokenize_qa
from .config import T3ClassifierConfig
from .hidden import layer_hidden
from .modeling import T3Classifier
from .tilt import prefix_pooled_states


def _rows(data: Any, name: str) -> list[dict[str, Any]]:
    if data is None:
        raise ValueError(f"The {name} set is missing.")
    rows = [dict(r) for r in data] if not isinstance(data, list) else data
    if len(rows) == 0:
        raise ValueError(f"The {name} set is empty: T3 needs forget and retain examples to fit its classifier.")
    for r in rows[:1]:
        if "question" not in r or "answer" not in r:
            raise ValueError(f"{name} rows need 'question' and 'answer' fields, got {sorted(r)}.")
    return rows


@torch.no_grad()
def cache_prefix_states(
    model: Any,
    tokenizer: Any,
    rows: Sequence[dict[str, Any]],
    layer: int,
    pooling: str,
    *,
    batch_size: int = 16,
    max_length: int | None = None,
    max_prefixes_per_example: int | None = None,
    progress: bool = True,
    desc: str = "caching hidden states",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pooled hidden states of the answer prefixes of ``rows`` (float32, CPU).

    Returns ``(features [N, H], example_index [N])``: one row per answer prefix ``(x, y_<=t)``,
    ``t`` over the answer tokens (evenly subsampled to at most ``max_prefixes_per_example``).
    """
    device = next(model.parameters()).device
    features = [tokenize_qa(tokenizer, r["question"], r["answer"], max_length=max_length) for r in rows]
    order = sorted(range(len(features)), key=lambda i: len(features[i]["input_ids"]))
    feats, owners = [], []
    for start in tqdm(range(0, len(order), batch_size), desc=desc, disable=not progress, leave=False):
        idx = order[start : start + batch_size]
        batch = collate_qa([features[i] for i in idx], tokenizer.pad_token_id, "right")
        batch = {k: v.to(device) for k, v in batch.items()}
        hidden = layer_hidden(model, batch["input_ids"], batch["attention_mask"], batch["position_ids"], layer)
        answer = (batch["labels"] != IGNORE_INDEX) & batch["attention_mask"].bool()
        pooled = prefix_pooled_states(hidden, answer, pooling)
        for row, ex in enumerate(idx):
            positions = answer[row].nonzero().squeeze(-1)
            if max_prefixes_per_example is not None and len(positions) > max_prefixes_per_example:
                pick = torch.linspace(0, len(positions) - 1, max_prefixes_per_example, device=positions.device)
                positions = positions[pick.round().long().unique()]
            feats.append(pooled[row, positions].cpu())
            owners.append(torch.full((len(positions),), ex, dtype=torch.long))
    return torch.cat(feats), torch.cat(owners)


def _train_head(
    clf: T3Classifier,
    x: torch.Tensor,
    y: torch.Tensor,
    steps: int,
    learning_rate: float,
    weight_decay: float,
    train_batch_size: int,
    seed: int,
    progress: bool,
    device: torch.device,
) -> None:
    """Class-balanced BCE with Adam on the cached features (on ``device``, minibatches of
    ``train_batch_size`` moved there when the cache is larger); sets the standardisation buffers."""
    gen = torch.Generator().manual_seed(seed)
    clf.to("cpu")
    with torch.no_grad():
        clf.feature_mean.copy_(x.mean(0))
        clf.feature_scale.copy_(x.std(0, unbiased=False).clamp_min(1e-6))
        for module in (clf.down, clf.up):
            bound = 1.0 / math.sqrt(module.in_features)
            module.weight.copy_(torch.randn(module.weight.shape, generator=gen) * bound)
        clf.up.bias.zero_()
    n_pos = float(y.sum())
    n_neg = float(len(y) - n_pos)
    weights = torch.where(y > 0.5, 0.5 / max(n_pos, 1.0), 0.5 / max(n_neg, 1.0)) * len(y)
    clf.to(device)
    full_batch = len(y) <= train_batch_size
    if full_batch:
        x, y, weights = x.to(device), y.to(device), weights.to(device)
    opt = torch.optim.AdamW(clf.parameters(), lr=learning_rate, weight_decay=weight_decay)
    clf.train()
    # The head's matrices are tiny: on CPU, intra-op threads only add synchronisation (and stall
    # badly on a busy machine), so the loop runs single-threaded and restores the setting after.
    threads = torch.get_num_threads()
    if torch.device(device).type == "cpu":
        torch.set_num_threads(1)
    try:
        for _ in tqdm(range(steps), desc="fitting T3 head", disable=not progress, leave=False):
            if not full_batch:
                idx = torch.randint(len(y), (train_batch_size,), generator=gen)
                xb, yb, wb = x[idx].to(device), y[idx].to(device), weights[idx].to(device)
            else:
                xb, yb, wb = x, y, weights
            logits = clf(xb).logits
            loss = (F.binary_cross_entropy_with_logits(logits, yb, reduction="none") * wb).sum() / wb.sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    clf.eval()


@torch.no_grad()
def _accuracies(clf: T3Classifier, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    dev = clf.feature_mean.device
    pred = torch.cat([(clf(x[i : i + 65536].to(dev)).logits > 0).float().cpu() for i in range(0, len(x), 65536)])
    acc = float((pred == y).float().mean())
    per_class = [float((pred[y == c] == c).float().mean()) for c in (0.0, 1.0) if bool((y == c).any())]
    return {"accuracy": acc, "balanced_accuracy": sum(per_class) / len(per_class)}


def _split(n: int, fraction: float, rng: random.Random) -> tuple[list[int], list[int]]:
    idx = list(range(n))
    rng.shuffle(idx)
    n_hold = min(n - 1, max(1, round(fraction * n))) if fraction > 0 and n >= 2 else 0
    return idx[n_hold:], idx[:n_hold]


def fit_t3(
    model: Any,
    tokenizer: Any,
    forget: Any,
    retain: Any,
    config: T3ClassifierConfig | None = None,
    *,
    steps: int = 500,
    learning_rate: float = 2e-2,
    weight_decay: float = 0.0,
    holdout_fraction: float = 0.2,
    batch_size: int = 16,
    train_batch_size: int = 8192,
    max_length: int | None = None,
    max_prefixes_per_example: int | None = None,
    seed: int = 0,
    progress: bool = True,
) -> T3Classifier:
    """Fit a :class:`T3Classifier` telling ``retain`` (S=1) from ``forget`` (S=0) answers of ``model``.

    ``forget`` and ``retain`` are TOFU-shaped rows (``question``, ``answer``; a ``datasets.Dataset``
    or a list of dicts). The base is frozen and run once (``batch_size`` examples per forward);
    the head (``config.rank``, ``config.layer``, ``config.pooling``) is trained for ``steps`` Adam
    steps on the cache. Returns the head in eval mode, on the base model's device, with
    ``fit_report`` = ``{fit_seconds, cache_seconds, train_seconds, heldout_accuracy,
    heldout_balanced_accuracy, train_accuracy, ...}``.
    """
    start = time.perf_counter()
    forget_rows, retain_rows = _rows(forget, "forget"), _rows(retain, "retain")
    if overlapping_examples(forget_rows, retain_rows):
        raise ValueError(
            f"{overlapping_examples(forget_rows, retain_rows)} forget examples also occur in the retain set; "
            "the classifier cannot tell identical examples apart."
        )
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}.")
    if not 0 <= holdout_fraction < 1:
        raise ValueError(f"holdout_fraction must be in [0, 1), got {holdout_fraction}.")
    ensure_pad_token(tokenizer)
    config = (config or T3ClassifierConfig()).for_base(model)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device

    cache_start = time.perf_counter()
    kw = dict(
        batch_size=batch_size, max_length=max_length, max_prefixes_per_example=max_prefixes_per_example,
        progress=progress,
    )
    xf, of = cache_prefix_states(model, tokenizer, forget_rows, config.layer, config.pooling, desc="caching forget", **kw)
    xr, orr = cache_prefix_states(model, tokenizer, retain_rows, config.layer, config.pooling, desc="caching retain", **kw)
    cache_seconds = time.perf_counter() - cache_start
    if was_training:
        model.train()

    train_start = time.perf_counter()
    rng = random.Random(seed)
    f_train, f_hold = _split(len(forget_rows), holdout_fraction, rng)
    r_train, r_hold = _split(len(retain_rows), holdout_fraction, rng)

    def select(x, owners, keep):
        keep_t = torch.zeros(int(owners.max()) + 1, dtype=torch.bool)
        keep_t[torch.tensor(keep, dtype=torch.long)] = True
        return x[keep_t[owners]]

    def stack(xf_, xr_):
        x = torch.cat([xf_, xr_])
        y = torch.cat([torch.zeros(len(xf_)), torch.ones(len(xr_))])
        return x, y

    report: dict[str, Any] = {}
    clf = T3Classifier(config)
    if f_hold and r_hold:
        x_tr, y_tr = stack(select(xf, of, f_train), select(xr, orr, r_train))
        x_ho, y_ho = stack(select(xf, of, f_hold), select(xr, orr, r_hold))
        _train_head(clf, x_tr, y_tr, steps, learning_rate, weight_decay, train_batch_size, seed, progress, device)
        held = _accuracies(clf, x_ho, y_ho)
        report["heldout_accuracy"] = held["accuracy"]
        report["heldout_balanced_accuracy"] = held["balanced_accuracy"]
        report["heldout_examples"] = len(f_hold) + len(r_hold)
    else:
        report["heldout_accuracy"] = report["heldout_balanced_accuracy"] = None
        report["heldout_examples"] = 0
    x_all, y_all = stack(xf, xr)
    _train_head(clf, x_all, y_all, steps, learning_rate, weight_decay, train_batch_size, seed, progress, device)
    train = _accuracies(clf, x_all, y_all)
    train_seconds = time.perf_counter() - train_start

    n_base = sum(p.numel() for p in model.parameters())
    n_head = clf.num_trainable_parameters()
    report.update(
        train_accuracy=train["accuracy"],
        train_balanced_accuracy=train["balanced_accuracy"],
        n_forget_examples=len(forget_rows),
        n_retain_examples=len(retain_rows),
        n_forget_prefixes=len(xf),
        n_retain_prefixes=len(xr),
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
    return clf.to(device).eval()
