"""Fitting the T3 guidance head on cached pooled hidden states of the frozen base.

1. **Checks, before any work.** The settings (:class:`T3ClassifierConfig`), the layer against the base
   (:meth:`T3ClassifierConfig.check_for`), the rows, forget/retain overlap and every row's prompt: a row whose
   prompt alone fills the base's maximum positions (or ``max_length``) leaves no answer token to fit on and is
   refused by name, never dropped. :func:`validate_t3_fit` runs exactly these checks (tokenization only).
2. **Caching.** One no-grad forward pass of the frozen base over forget + retain (``batch_size``
   examples at a time, progress bar) reads layer ``layer``'s hidden states through a hook (an
   intermediate layer stops the forward there; no LM head is computed) and keeps, for every
   position ``t`` whose next token ``y_{t+1}`` is an answer token, the causal mean-pooled state
   ``pool_t`` (see :mod:`hf_unlearn.methods.t3.hidden`) and the token ``y_{t+1}``. Nothing else of the
   base's activations is kept.
3. **Head training, as the authors train it.** Only the head is trained, with binary cross-entropy on the logit
   of the observed next token, label 1 on retain answer tokens and 0 on forget answer tokens (the authors'
   ``T3`` trainer loss), on class-balanced mini-batches: each AdamW step takes the next ``forget_batch_size``
   forget examples (an epoch is one shuffled pass over *every* forget example: none is held out) and as many
   retain examples drawn at random, and averages over the answer positions ``B`` of those examples::

       L = sum_{i in B} c_i BCE(g(pool_i)[y_i], s_i) / sum_{i in B} c_i,
       c_i = 1, or |B| / (2 |B_{s_i}|) with ``class_balance``.

   Both layers start from PyTorch's default ``nn.Linear`` initialisation (``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``);
   there is no per-token bias. The pooled states are standardised per feature during training (statistics of
   the training positions); the standardisation is folded into the head afterwards, so the saved head is
   exactly ``g = U (D' pool + c)`` with ``D' = D / scale`` and ``c = -D' mean``. The learning rate follows the
   authors' schedule (:func:`warmup_linear_decay`, ``lr_schedule="linear"``): a linear warm-up over
   ``warmup_epochs`` epochs' worth of steps (the authors' 25 of 100 epochs, ``warmup_steps = floor(warmup_epochs
   |forget| / forget_batch_size)`` as their ``load_trainer_args`` counts it), then a linear decay to 0 at the
   last step (the transformers ``Trainer``'s default ``"linear"`` schedule they train with). Deviation from the
   authors' trainer, which runs the base on every step: the base runs once, and the head trains on the cache.
4. **Retain hold-out and early stopping.** ``holdout_fraction`` of the *retain* examples (whole examples) are held
   out; the forget examples are all in the fit. After every epoch the held-out retain BCE (label 1, mean over
   their positions) is measured and reported; with ``early_stopping_patience`` set, the fit stops after that many
   epochs without a lower value and the head of the best epoch is returned (the authors do not stop early, the
   default). The held-out accuracy reported is the returned head's on those retain rows (how often it calls a
   never-fitted retain token "forget").

A loss or a head that is not finite (e.g. a learning rate far too high) is refused with a ``ValueError``:
nothing is returned, so nothing can be saved. Sequences are truncated to the base's maximum positions (and
``max_length``) at the answer end. The caller's tokenizer is never modified. Timings (caching and head
training apart), the epochs run, the held-out BCE per epoch and the accuracies land in
``classifier.fit_report`` (and in ``config.fit_report``, saved with the head).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ...data.documents import as_documents, chunk_documents, chunk_length, shared_documents
from ...data.pairing import overlapping_examples
from ...data.prepare import prepare_qa
from ...data.prompts import IGNORE_INDEX, collate_qa
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
        raise ValueError(f"{name} rows need 'question' and 'answer' fields, got {sorted(rows[0])}; pass documents "
                         "as hf_unlearn.data.documents_dataset(texts), a path or [{'text': ...}, ...].")
    return rows


def _tokenize(
    tokenizer: Any, rows: list[dict[str, Any]], limit: int | None, template: str | None
) -> tuple[list[dict[str, Any] | None], int, list[tuple[int, int]]]:
    """``(features, number truncated, [(row, prompt tokens)] of rows left without an answer token)``."""
    out: list[dict[str, Any] | None] = []
    full: list[tuple[int, int]] = []
    feats, truncated = prepare_qa(
        rows, tokenizer, template=template, max_length=limit, truncation="end", validate=False, return_truncated=True
    )
    for i, f in enumerate(feats):
        if any(lab != IGNORE_INDEX for lab in f["labels"][1:]):
            out.append(f)
        else:
            out.append(None)
            full.append((i, int(f["prompt_length"])))
    return out, truncated, full


def tokenize_examples(
    tokenizer: Any, rows: list[dict[str, Any]], limit: int | None, template: str | None = None
) -> tuple[list[dict[str, Any] | None], int]:
    """Tokenized prompt + answer of each row, cut to ``limit`` tokens; ``None`` for a row with no answer
    token left to predict. Returns ``(features, number of truncated rows)``."""
    feats, truncated, _ = _tokenize(tokenizer, rows, limit, template)
    return feats, truncated


def _refuse_full_prompts(name: str, rows: list[dict[str, Any]], full: list[tuple[int, int]], limit: int | None) -> None:
    if not full:
        return
    shown = "; ".join(
        f"row {i} ({length} prompt tokens, question {str(rows[i]['question'])[:40]!r})" for i, length in full[:5]
    ) + (f"; and {len(full) - 5} more" if len(full) > 5 else "")
    raise ValueError(
        f"{len(full)} {name} row(s) leave no answer token within the first {limit} positions (the base's maximum "
        f"positions / max_length): the prompt alone fills them: {shown}. T3 refuses such rows rather than fit "
        "without them; shorten the questions, raise max_length within the model's positions, or remove the rows."
    )


@dataclass
class _Prepared:
    config: T3ClassifierConfig
    forget_rows: list[dict[str, Any]]
    retain_rows: list[dict[str, Any]]
    forget_feats: list[dict[str, Any]]
    retain_feats: list[dict[str, Any]]
    truncated: int
    limit: int | None


def _prepare(model: Any, tokenizer: Any, forget: Any, retain: Any, config: T3ClassifierConfig | None,
             overrides: dict[str, Any], fingerprint: bool) -> _Prepared:
    config = config or T3ClassifierConfig()
    if overrides:
        known = {f.name for f in fields(T3ClassifierConfig)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(f"fit_t3 got unknown settings {unknown}; T3ClassifierConfig fields are {sorted(known)}.")
        data = {k: v for k, v in config.to_dict().items() if k in known}
        data.update(overrides)
        config = T3ClassifierConfig(**data)
    config.check_for(model)
    forget_docs, retain_docs = as_documents(forget, plain_lists=False), as_documents(retain, plain_lists=False)
    forget_rows = _rows(forget, "forget") if forget_docs is None else []
    retain_rows = _rows(retain, "retain") if retain_docs is None else []
    if forget_docs is not None and retain_docs is not None:
        overlap = shared_documents(forget_docs, retain_docs)
    else:
        overlap = overlapping_examples(forget_rows, retain_rows)
    if overlap:
        raise ValueError(
            f"{overlap} forget examples also occur in the retain set; the head cannot tell identical examples apart."
        )
    limit = model_max_positions(model)
    if config.max_length is not None:
        limit = int(config.max_length) if limit is None else min(limit, int(config.max_length))

    def features(name: str, rows: list[dict[str, Any]], docs: list[str] | None) -> tuple[list[Any], list[Any], int]:
        """``(features, rows, truncated)``; a document chunk predicts every token and is one example."""
        if docs is not None:
            feats = chunk_documents(docs, tokenizer, chunk_length(None, limit))
            if not feats:
                raise ValueError(f"The {name} documents make no chunk of two tokens or more: nothing to fit on.")
            return feats, [{"text": name} for _ in feats], 0
        feats, cut, full = _tokenize(tokenizer, rows, limit, config.prompt_template)
        _refuse_full_prompts(name, rows, full, limit)
        return feats, rows, cut

    forget_feats, forget_rows, forget_cut = features("forget", forget_rows, forget_docs)
    retain_feats, retain_rows, retain_cut = features("retain", retain_rows, retain_docs)
    if fingerprint:
        config = config.for_base(model)
    return _Prepared(config, forget_rows, retain_rows, forget_feats, retain_feats, forget_cut + retain_cut, limit)


def validate_t3_fit(
    model: Any, tokenizer: Any, forget: Any, retain: Any, config: T3ClassifierConfig | None = None, **overrides: Any
) -> T3ClassifierConfig:
    """Every check :func:`fit_t3` makes before its first forward pass (settings, ``layer`` against ``model``,
    rows, overlap, prompts that fill the positions), without running the base: tokenization only. Raises
    ``ValueError``; returns the config with ``overrides`` applied."""
    return _prepare(model, tokenizer, forget, retain, config, overrides, fingerprint=False).config


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


class ExamplePositions:
    """The cached positions of each example: ``positions(ids)`` -> indices into the cache (CSR layout)."""

    def __init__(self, owners: torch.Tensor, n_examples: int) -> None:
        self.order = torch.argsort(owners, stable=True)
        counts = torch.bincount(owners.long().cpu(), minlength=n_examples)
        self.offsets = [0, *torch.cumsum(counts, 0).tolist()]

    def positions(self, examples: list[int]) -> torch.Tensor:
        return torch.cat([self.order[self.offsets[e] : self.offsets[e + 1]] for e in examples])


def balanced_batches(
    forget_examples: list[int], retain_examples: list[int], batch_size: int, gen: torch.Generator
) -> list[tuple[list[int], list[int]]]:
    """One epoch of ``(forget ids, retain ids)`` batches: the forget examples shuffled and cut into batches of
    ``batch_size`` (the last one smaller), each with as many retain examples drawn at random (without
    replacement within the batch while the retain set is large enough)."""
    order = torch.randperm(len(forget_examples), generator=gen).tolist()
    out = []
    for start in range(0, len(order), batch_size):
        chunk = [forget_examples[i] for i in order[start : start + batch_size]]
        n = len(chunk)
        if n <= len(retain_examples):
            picks = torch.randperm(len(retain_examples), generator=gen)[:n].tolist()
        else:
            picks = torch.randint(len(retain_examples), (n,), generator=gen).tolist()
        out.append((chunk, [retain_examples[i] for i in picks]))
    return out


def warmup_linear_decay(step: int, total_steps: int, warmup_steps: int) -> float:
    """Learning-rate multiplier of optimizer step ``step`` (0-based) under a linear warm-up and linear decay,
    the transformers ``get_linear_schedule_with_warmup``::

        m(k) = k / max(1, W)                      for k < W
        m(k) = max(0, (N - k) / max(1, N - W))    for k >= W

    with ``N = total_steps`` and ``W = warmup_steps`` (the first step of a warm-up has multiplier 0, as there)."""
    if step < warmup_steps:
        return step / max(1, warmup_steps)
    return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))


def fit_schedule(n_forget: int, config: T3ClassifierConfig) -> tuple[int, int]:
    """``(total_steps, warmup_steps)`` of a fit on ``n_forget`` forget examples: ``total_steps = epochs *
    ceil(n_forget / forget_batch_size)``, capped by ``steps``; ``warmup_steps = floor(warmup_epochs * n_forget /
    forget_batch_size)`` (the authors' count; 0 with ``lr_schedule="constant"``)."""
    batch = int(config.forget_batch_size)
    total = int(config.epochs) * math.ceil(n_forget / batch)
    if config.steps is not None:
        total = min(total, int(config.steps))
    warmup = int(float(config.warmup_epochs) * n_forget // batch) if config.lr_schedule == "linear" else 0
    return total, warmup


def _bce(logits: torch.Tensor, y: torch.Tensor, balanced: bool) -> torch.Tensor:
    """Mean BCE over positions, or the mean of the two classes' mean BCEs (``balanced``)."""
    losses = F.binary_cross_entropy_with_logits(logits, y, reduction="none")
    if not balanced:
        return losses.mean()
    parts = [losses[y == c].mean() for c in (0.0, 1.0) if bool((y == c).any())]
    return sum(parts) / len(parts)


@torch.no_grad()
def _heldout_bce(clf: T3Classifier, z: torch.Tensor, tokens: torch.Tensor, y: torch.Tensor) -> float:
    logits = torch.cat([clf.token_logits(z[i : i + 65536], tokens[i : i + 65536]) for i in range(0, len(z), 65536)])
    return float(_bce(logits, y, balanced=True))


def _default_init(weight: torch.Tensor, gen: torch.Generator) -> None:
    """``nn.Linear``'s default (Kaiming uniform, a = sqrt(5)): ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``."""
    bound = 1.0 / math.sqrt(weight.shape[1])
    weight.copy_((torch.rand(weight.shape, generator=gen) * 2 - 1).mul_(bound).to(weight.device))


def _train_head(
    clf: T3Classifier,
    x: torch.Tensor,
    tokens: torch.Tensor,
    y: torch.Tensor,
    owners: torch.Tensor,
    forget_train: list[int],
    retain_train: list[int],
    heldout: torch.Tensor | None,
    config: T3ClassifierConfig,
    progress: bool,
) -> dict[str, Any]:
    """Balanced mini-batch AdamW under :func:`fit_schedule`'s learning rates, the held-out BCE (positions
    ``heldout``, a boolean mask) measured every epoch and, with a patience, stopping early on it; then the
    standardisation is folded into ``D`` and ``c`` (see the module docstring). Returns the training record."""
    device = x.device
    gen = torch.Generator(device="cpu").manual_seed(int(config.seed))
    train_mask = torch.isin(owners, torch.tensor(forget_train + retain_train, device=owners.device))
    mean, scale = _feature_stats(x[train_mask])
    index = ExamplePositions(owners, int(owners.max()) + 1)
    clf.to(device=device, dtype=torch.float32)
    with torch.no_grad():
        _default_init(clf.down.weight, gen)
        _default_init(clf.up.weight, gen)
        clf.down.bias.zero_()
    clf.down.bias.requires_grad_(False)
    opt = torch.optim.AdamW([clf.down.weight, clf.up.weight], lr=float(config.learning_rate),
                            weight_decay=float(config.weight_decay))
    if heldout is not None and bool(heldout.any()):
        z_hold = (x[heldout].float() - mean) / scale
        t_hold, y_hold = tokens[heldout], y[heldout]
    else:
        z_hold = None
    patience = config.early_stopping_patience if z_hold is not None else None
    max_steps, warmup_steps = fit_schedule(len(forget_train), config)
    base_lr = float(config.learning_rate)
    history: list[float] = []
    best = (math.inf, -1, None)  # (held-out BCE, epoch, weights)
    step = epochs_run = 0
    stopped_early = False
    clf.train()
    # The head's matmuls are tiny: on CPU intra-op threads only add synchronisation (and stall on a busy
    # machine), so the loop runs single-threaded and restores the setting after.
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)
    try:
        bar = tqdm(range(int(config.epochs)), desc="fitting T3 head", disable=not progress, leave=False)
        for epoch in bar:
            for forget_ids, retain_ids in balanced_batches(forget_train, retain_train,
                                                           int(config.forget_batch_size), gen):
                idx = index.positions(forget_ids + retain_ids).to(device)
                z = (x[idx].float() - mean) / scale
                loss = _bce(clf.token_logits(z, tokens[idx]), y[idx], bool(config.class_balance))
                if not torch.isfinite(loss):
                    raise ValueError(
                        f"The T3 head's training loss became {float(loss)} at step {step + 1} "
                        f"(learning_rate={config.learning_rate}); nothing is returned. Lower learning_rate."
                    )
                opt.zero_grad(set_to_none=True)
                loss.backward()
                if config.lr_schedule == "linear":
                    for group in opt.param_groups:
                        group["lr"] = base_lr * warmup_linear_decay(step, max_steps, warmup_steps)
                opt.step()
                step += 1
                if step >= max_steps:
                    break
            epochs_run = epoch + 1
            if z_hold is not None:
                clf.eval()
                history.append(_heldout_bce(clf, z_hold, t_hold, y_hold))
                clf.train()
                if history[-1] < best[0]:
                    best = (history[-1], epoch, [clf.down.weight.detach().clone(), clf.up.weight.detach().clone()])
                elif patience is not None and epoch - best[1] >= int(patience):
                    stopped_early = True
                    break
            if step >= max_steps:
                break
    finally:
        torch.set_num_threads(threads)
    with torch.no_grad():
        if patience is not None and best[2] is not None:
            clf.down.weight.copy_(best[2][0])
            clf.up.weight.copy_(best[2][1])
        # g = U D (p - mean) / scale = U ((D / scale) p - (D / scale) mean)
        clf.down.weight.div_(scale)
        clf.down.bias.copy_(-(clf.down.weight @ mean))
    clf.eval()
    return {
        "epochs_run": epochs_run,
        "steps_run": step,
        "best_epoch": (best[1] + 1) if best[2] is not None else None,
        "stopped_early": stopped_early,
        "heldout_bce_per_epoch": history,
        "lr_schedule": config.lr_schedule,
        "total_steps": max_steps,
        "warmup_steps": warmup_steps,
        "fit_forget_examples": len(forget_train),
        "fit_forget_positions": int((train_mask & (y == 0)).sum()),
        "fit_retain_examples": len(retain_train),
    }


@torch.no_grad()
def _accuracies(clf: T3Classifier, x: torch.Tensor, tokens: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """Accuracy and balanced accuracy of ``g[y_{t+1}] > 0`` (retain) per cached position."""
    pred = torch.cat([
        (clf.token_logits(x[i : i + 65536].float(), tokens[i : i + 65536]) > 0).float()
        for i in range(0, len(x), 65536)
    ])
    per_class = [float((pred[y == c] == c).float().mean()) for c in (0.0, 1.0) if bool((y == c).any())]
    return {"accuracy": float((pred == y).float().mean()), "balanced_accuracy": sum(per_class) / len(per_class)}


def _split(examples: list[int], fraction: float, rng: random.Random) -> tuple[list[int], list[int]]:
    idx = list(examples)
    rng.shuffle(idx)
    n_hold = min(len(idx) - 1, max(1, round(fraction * len(idx)))) if fraction > 0 and len(idx) >= 2 else 0
    return sorted(idx[n_hold:]), sorted(idx[:n_hold])


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
    list of dicts) or documents (a path, a dataset with a ``text`` column, ``[{"text": ...}, ...]``:
    :func:`hf_unlearn.data.documents.as_documents`), cut into chunks of the base's maximum positions (``max_length``
    when lower; 2048 when neither is set), each chunk one example whose every position is cached. ``config`` (default ``T3ClassifierConfig()``) sets the head and the fit; keyword
    ``overrides`` replace config fields (e.g. ``epochs=20``). The base is frozen and run once. Every refusal
    (see :func:`validate_t3_fit`) comes before the first forward pass.

    Batches hold as many forget as retain examples, so ``f`` estimates ``P(retain)`` under roughly equal class
    priors (equal in positions too with ``class_balance=True``), whatever the sizes of the two sets.

    Returns the head in eval mode on the base's device, with ``fit_report`` = ``{cache_seconds,
    train_seconds, fit_seconds, epochs_run, best_epoch, heldout_bce_per_epoch, heldout_accuracy,
    heldout_balanced_accuracy, train_accuracy, ...}``. Raises ``ValueError`` when the training loss or the
    head turns non-finite.
    """
    start = time.perf_counter()
    prep = _prepare(model, tokenizer, forget, retain, config, overrides, fingerprint=True)
    config = prep.config
    forget_rows, retain_rows = prep.forget_rows, prep.retain_rows
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)

    was_training = model.training
    model.eval()
    cache_start = time.perf_counter()
    try:
        kw = dict(batch_size=int(config.batch_size), progress=progress)
        xf, tf, of = cache_answer_states(model, prep.forget_feats, config.layer, pad_id, desc="caching forget", **kw)
        xr, tr, orr = cache_answer_states(model, prep.retain_feats, config.layer, pad_id, desc="caching retain", **kw)
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
    f_train = list(range(len(forget_rows)))  # every forget row is fitted, as the authors fit
    r_train, r_hold = _split([i + len(forget_rows) for i in range(len(retain_rows))],
                             float(config.holdout_fraction), rng)
    held_mask = torch.isin(owners, torch.tensor(r_hold, device=owners.device, dtype=owners.dtype))
    clf = T3Classifier(config)
    record = _train_head(clf, x, tokens, y, owners, f_train, r_train, held_mask if r_hold else None, config,
                         progress)
    bad = clf.non_finite_parameters()
    if bad:
        raise ValueError(
            f"Fitting left the T3 head with non-finite weights ({', '.join(bad)}) at learning_rate="
            f"{config.learning_rate}; nothing is returned. Lower learning_rate."
        )
    report: dict[str, Any] = dict(record)
    if r_hold:  # retain rows only: accuracy and balanced accuracy coincide
        held = _accuracies(clf, x[held_mask], tokens[held_mask], y[held_mask])
        report.update(heldout_accuracy=held["accuracy"], heldout_balanced_accuracy=held["balanced_accuracy"],
                      heldout_examples=len(r_hold))
    else:
        report.update(heldout_accuracy=None, heldout_balanced_accuracy=None, heldout_examples=0)
    train = _accuracies(clf, x[~held_mask], tokens[~held_mask], y[~held_mask])
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
        truncated_examples=prep.truncated,
        max_positions=prep.limit,
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
