"""Training the T3 guidance head on the cached pooled states (the loss: :mod:`hf_unlearn.methods.t3.fit`)."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .config import T3ClassifierConfig
from .modeling import T3Classifier


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
    """One epoch of ``(forget ids, retain ids)`` batches: the shuffled forget examples by ``batch_size``, each with as
    many random retain examples (without replacement within the batch when there are enough)."""
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
    """Learning-rate multiplier of step ``k`` (0-based), transformers' ``get_linear_schedule_with_warmup``:
    ``k / max(1, W)`` for ``k < W``, else ``max(0, (N - k) / max(1, N - W))``."""
    if step < warmup_steps:
        return step / max(1, warmup_steps)
    return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))


def fit_schedule(n_forget: int, config: T3ClassifierConfig) -> tuple[int, int]:
    """``(total, warmup)`` steps: ``epochs * ceil(n_forget / forget_batch_size)`` capped by ``steps``, and
    ``floor(warmup_epochs * n_forget / forget_batch_size)`` (0 with ``lr_schedule="constant"``)."""
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


def _init_head(clf: T3Classifier, device: torch.device, gen: torch.Generator) -> None:
    """Move the head to ``device`` (float32), initialise ``D`` and ``U`` from ``gen``, freeze ``c = 0``."""
    clf.to(device=device, dtype=torch.float32)
    with torch.no_grad():
        _default_init(clf.down.weight, gen)
        _default_init(clf.up.weight, gen)
        clf.down.bias.zero_()
    clf.down.bias.requires_grad_(False)


def _train_epoch(
    clf: T3Classifier, opt: torch.optim.Optimizer, batches: list[tuple[list[int], list[int]]],
    index: ExamplePositions, x: torch.Tensor, tokens: torch.Tensor, y: torch.Tensor, mean: torch.Tensor,
    scale: torch.Tensor, config: T3ClassifierConfig, step: int, schedule: tuple[int, int],
) -> int:
    """One epoch of AdamW steps under ``schedule``; returns the steps run so far."""
    max_steps, warmup_steps = schedule
    base_lr = float(config.learning_rate)
    device = mean.device  # the head's: the cache may be elsewhere (on the host), a batch moves at a time
    for forget_ids, retain_ids in batches:
        idx = index.positions(forget_ids + retain_ids).to(x.device)
        z = (x[idx].to(device).float() - mean) / scale
        loss = _bce(clf.token_logits(z, tokens[idx].to(device)), y[idx].to(device), bool(config.class_balance))
        if not torch.isfinite(loss):
            raise ValueError(f"The T3 head's training loss became {float(loss)} at step {step + 1}; lower "
                             f"learning_rate={config.learning_rate}.")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if config.lr_schedule == "linear":
            for group in opt.param_groups:
                group["lr"] = base_lr * warmup_linear_decay(step, max_steps, warmup_steps)
        opt.step()
        step += 1
        if step >= max_steps:
            break
    return step


def _fold_standardisation(clf: T3Classifier, mean: torch.Tensor, scale: torch.Tensor,
                          best_weights: list[torch.Tensor] | None) -> None:
    """Restore the best epoch's ``D`` and ``U`` (when given), then fold the standardisation into the head:
    ``U D (p - mean) / scale = U ((D / scale) p - (D / scale) mean)``."""
    with torch.no_grad():
        if best_weights is not None:
            clf.down.weight.copy_(best_weights[0])
            clf.up.weight.copy_(best_weights[1])
        clf.down.weight.div_(scale)
        clf.down.bias.copy_(-(clf.down.weight @ mean))
    clf.eval()


def _train_head(
    clf: T3Classifier, x: torch.Tensor, tokens: torch.Tensor, y: torch.Tensor, owners: torch.Tensor,
    forget_train: list[int], retain_train: list[int], heldout: torch.Tensor | None, config: T3ClassifierConfig,
    progress: bool, device: torch.device | None = None,
) -> dict[str, Any]:
    """Balanced mini-batch AdamW on ``device`` (default ``x.device``), the BCE of the ``heldout`` positions measured
    every epoch (stopping early on it with a patience), then the standardisation folded in. Returns the record."""
    device = x.device if device is None else torch.device(device)
    gen = torch.Generator(device="cpu").manual_seed(int(config.seed))
    train_mask = torch.isin(owners, torch.tensor(forget_train + retain_train, device=owners.device))
    mean, scale = (v.to(device) for v in _feature_stats(x[train_mask]))
    index = ExamplePositions(owners, int(owners.max()) + 1)
    _init_head(clf, device, gen)
    opt = torch.optim.AdamW([clf.down.weight, clf.up.weight], lr=float(config.learning_rate),
                            weight_decay=float(config.weight_decay))
    hold = None
    if heldout is not None and bool(heldout.any()):
        hold = ((x[heldout].to(device).float() - mean) / scale, tokens[heldout].to(device), y[heldout].to(device))
    patience = config.early_stopping_patience if hold is not None else None
    schedule = max_steps, warmup_steps = fit_schedule(len(forget_train), config)
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
        for epoch in tqdm(range(int(config.epochs)), desc="fitting T3 head", disable=not progress, leave=False):
            batches = balanced_batches(forget_train, retain_train, int(config.forget_batch_size), gen)
            step = _train_epoch(clf, opt, batches, index, x, tokens, y, mean, scale, config, step, schedule)
            epochs_run = epoch + 1
            if hold is not None:
                clf.eval()
                history.append(_heldout_bce(clf, *hold))
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
    _fold_standardisation(clf, mean, scale, best[2] if patience is not None else None)
    return {
        "epochs_run": epochs_run, "steps_run": step, "best_epoch": (best[1] + 1) if best[2] is not None else None,
        "stopped_early": stopped_early, "heldout_bce_per_epoch": history, "lr_schedule": config.lr_schedule,
        "total_steps": max_steps, "warmup_steps": warmup_steps, "fit_forget_examples": len(forget_train),
        "fit_forget_positions": int((train_mask & (y == 0)).sum()), "fit_retain_examples": len(retain_train),
    }


@torch.no_grad()
def _accuracies(clf: T3Classifier, x: torch.Tensor, tokens: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """Accuracy and balanced accuracy of ``g[y_{t+1}] > 0`` (retain) per cached position."""
    device = next(clf.parameters()).device
    pred = torch.cat([
        (clf.token_logits(x[i : i + 65536].to(device).float(), tokens[i : i + 65536].to(device)) > 0).float()
        for i in range(0, len(x), 65536)
    ])
    y = y.to(device)
    per_class = [float((pred[y == c] == c).float().mean()) for c in (0.0, 1.0) if bool((y == c).any())]
    return {"accuracy": float((pred == y).float().mean()), "balanced_accuracy": sum(per_class) / len(per_class)}
