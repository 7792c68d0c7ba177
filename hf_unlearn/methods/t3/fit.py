"""Fitting the T3 guidance head on cached pooled hidden states of the frozen base: :func:`fit_t3`.

Steps 1 and 2 are in :mod:`hf_unlearn.methods.t3.cache`, step 3 in :mod:`hf_unlearn.methods.t3.head_training`.

1. **Checks, before any work.** The settings (:class:`T3ClassifierConfig`), the layer against the base
   (:meth:`T3ClassifierConfig.check_for`), the rows, forget/retain overlap and every row's prompt: a row whose
   prompt alone fills the base's maximum positions (or ``max_length``) leaves no answer token to fit on and is
   refused by name, never dropped. :func:`~hf_unlearn.methods.t3.cache.validate_t3_fit` runs exactly these
   checks (tokenization only).
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
   authors' schedule (:func:`~hf_unlearn.methods.t3.head_training.warmup_linear_decay`,
   ``lr_schedule="linear"``): a linear warm-up over ``warmup_epochs`` epochs' worth of steps (the authors' 25 of
   100 epochs, ``warmup_steps = floor(warmup_epochs |forget| / forget_batch_size)`` as their ``load_trainer_args``
   counts it), then a linear decay to 0 at the last step (the transformers ``Trainer``'s default ``"linear"``
   schedule they train with). Deviation from the authors' trainer, which runs the base on every step: the base
   runs once, and the head trains on the cache.
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
    model: Any,
    tokenizer: Any,
    forget: Any,
    retain: Any,
    config: T3ClassifierConfig | None = None,
    *,
    progress: bool = True,
    device: Any = None,
    cache_device: Any = None,
    **overrides: Any,
) -> T3Classifier:
    """Fit a :class:`T3Classifier` telling ``retain`` (label 1) from ``forget`` (label 0) answers of ``model``.

    ``forget`` and ``retain`` are TOFU-shaped rows (``question``, ``answer``; a ``datasets.Dataset`` or a
    list of dicts) or documents (a path, a dataset with a ``text`` column, ``[{"text": ...}, ...]``:
    :func:`hf_unlearn.data.documents.as_documents`), cut into chunks of the base's maximum positions
    (``max_length`` when lower; 2048 when neither is set), each chunk one example whose every position is cached.
    ``config`` (default ``T3ClassifierConfig()``) sets the head and the fit; keyword ``overrides`` replace config
    fields (e.g. ``epochs=20``). The base is frozen and run once. Every refusal
    (see :func:`~hf_unlearn.methods.t3.cache.validate_t3_fit`) comes before the first forward pass.

    Batches hold as many forget as retain examples, so ``f`` estimates ``P(retain)`` under roughly equal class
    priors (equal in positions too with ``class_balance=True``), whatever the sizes of the two sets.

    Returns the head in eval mode on the base's device, with ``fit_report`` = ``{cache_seconds,
    train_seconds, fit_seconds, epochs_run, best_epoch, heldout_bce_per_epoch, heldout_accuracy,
    heldout_balanced_accuracy, train_accuracy, ...}``. Raises ``ValueError`` when the training loss or the
    head turns non-finite.

    ``device``: ``None`` (default) fits where the base is; ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"``
    (:func:`hf_unlearn.devices.resolve_device`) moves the base there first, and a device the machine lacks is
    refused before any work. ``cache_device``: where the pooled hidden states are kept (default: the base's
    device; ``"cpu"`` keeps them on the host and moves each mini-batch to the head, which trains on the base's
    device). Under ``torchrun`` / ``accelerate launch`` (:func:`hf_unlearn.devices.join_launch`) the head is fitted
    on rank 0 alone and broadcast: every process of the launch must call ``fit_t3``, and every one returns the
    same head.
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
    """:func:`fit_t3` in this process (the checks, the cache, the head's training)."""
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
        raise ValueError(
            f"Fitting left the T3 head with non-finite weights ({', '.join(bad)}) at learning_rate="
            f"{config.learning_rate}; nothing is returned. Lower learning_rate."
        )
    report: dict[str, Any] = {**record, **_fit_accuracies(clf, x, tokens, y, held_mask, len(r_hold))}
    train_seconds = time.perf_counter() - train_start

    n_base = sum(p.numel() for p in model.parameters())
    n_head = clf.num_trainable_parameters()
    report.update(
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


def _fit_accuracies(clf: T3Classifier, x: torch.Tensor, tokens: torch.Tensor, y: torch.Tensor,
                    held_mask: torch.Tensor, heldout_examples: int) -> dict[str, Any]:
    """The fitted head's accuracies of the report: on the held-out retain positions (``held_mask``; retain rows
    only, so accuracy and balanced accuracy coincide; ``None`` without a hold-out), then on the others."""
    if heldout_examples:
        held = _accuracies(clf, x[held_mask], tokens[held_mask], y[held_mask])
        out = {"heldout_accuracy": held["accuracy"], "heldout_balanced_accuracy": held["balanced_accuracy"],
               "heldout_examples": heldout_examples}
    else:
        out = {"heldout_accuracy": None, "heldout_balanced_accuracy": None, "heldout_examples": 0}
    train = _accuracies(clf, x[~held_mask], tokens[~held_mask], y[~held_mask])
    out.update(train_accuracy=train["accuracy"], train_balanced_accuracy=train["balanced_accuracy"])
    return out
