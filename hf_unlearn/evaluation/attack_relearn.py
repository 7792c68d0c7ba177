"""The relearning attack: a copy of the model fine-tuned for a few steps on a small share of the forget rows
(measured on the others) and, separately, on retain rows only (benign fine-tuning), as Hu et al. ("Jogging the
Memory of Unlearned LLMs Through Targeted Relearning Attacks", 2024) do. The figures are :mod:`.attack_measure`'s.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from ..data.documents import is_document_rows
from ..data.prepare import PromptTooLongError, prepare_qa
from ..data.prompts import PromptTemplate, collate_qa, ensure_pad_token, resolve_template
from ..logprobs import answer_mask, causal_lm_scorer, effective_max_length, model_device
from .attack_measure import (
    DECODING_KEPT,
    DEFAULT_ATTACK_MAX_NEW_TOKENS,
    DecodingFactory,
    _check_criterion,
    _check_model,
    _check_positive,
    _check_rows,
    _document_features,
    _measure,
    _recovery,
)

DEFAULT_RELEARN_LR = 1e-4

RELEARN_THREAT_MODEL = (
    "The attacker holds the released weights and fine-tunes them for a few steps, either on a small share of the "
    "forgotten rows (they know some of the forgotten facts: targeted relearning) or on retain rows only (benign "
    "fine-tuning, no forgotten data); the forget rows the attack did not train on are then re-measured."
)


def split_forget_rows(
    rows: Sequence[Mapping[str, Any]], share: float, seed: int = 0
) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """``(attack rows, held-out rows)``: ``k = max(1, round(share * n))`` rows drawn with ``random.Random(seed)``
    for the attacker, the other ``n - k`` (at least one) held out; each part keeps the rows' order."""
    rows = list(rows)
    if not 0.0 < share < 1.0:
        raise ValueError(f"share must be in (0, 1), got {share!r}.")
    k = max(1, int(round(share * len(rows))))
    if len(rows) - k < 1:
        raise ValueError(f"share={share} of {len(rows)} forget rows leaves no row to measure on.")
    chosen = set(random.Random(seed).sample(range(len(rows)), k))
    return [r for i, r in enumerate(rows) if i in chosen], [r for i, r in enumerate(rows) if i not in chosen]


def _fine_tune(
    model: Any, tokenizer: Any, rows: Sequence[Mapping[str, Any]], *, steps: int, learning_rate: float,
    batch_size: int, max_grad_norm: float | None, seed: int, template: PromptTemplate, progress: bool,
    desc: str,
) -> list[float]:
    """``steps`` AdamW steps (in place on ``model``) of ``-sum_t log p(y_t | x, y_<t) / #answer tokens`` on
    ``min(batch_size, n)`` consecutive rows of a seeded permutation, wrapping around; the per-step losses."""
    limit = effective_max_length(model)
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    per_step = min(batch_size, len(order))
    used = sorted({order[i % len(order)] for i in range(min(len(order), steps * per_step))})
    try:  # only the rows the steps reach
        if is_document_rows(rows):  # documents: each one's first chunk, loss on every token
            prepared = _document_features(model, tokenizer, [rows[i] for i in used])
        else:
            prepared = prepare_qa([rows[i] for i in used], tokenizer, template=template, max_length=limit,
                                  validate=False)
    except PromptTooLongError as err:  # tokenize_qa's own message
        raise ValueError(err.reason) from err.__cause__
    features = dict(zip(used, prepared))
    device = model_device(model)
    model.requires_grad_(True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
    scorer = causal_lm_scorer(model)
    losses: list[float] = []
    model.train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for step in tqdm(range(steps), desc=desc, disable=not progress, leave=False):
            idx = [order[(step * per_step + j) % len(order)] for j in range(per_step)]
            batch = collate_qa([features[i] for i in idx], tokenizer.pad_token_id, "right")
            batch = {k: v.to(device) for k, v in batch.items()}
            mask = answer_mask(batch["labels"])
            log_probs = scorer(batch["input_ids"], batch["attention_mask"], batch["position_ids"], batch["labels"])
            loss = -log_probs.sum() / mask.sum().clamp(min=1)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            optimizer.step()
            losses.append(float(loss.detach()))
    optimizer.zero_grad(set_to_none=True)
    model.eval()
    model.requires_grad_(False)
    for value in losses:
        if not np.isfinite(value):
            raise FloatingPointError(f"The relearning fine-tune diverged (loss {value}); lower learning_rate.")
    return losses


def relearning_attack(
    model: Any, tokenizer: Any, forget: Sequence[Mapping[str, Any]],
    retain: Sequence[Mapping[str, Any]] | None = None, *, original: Any = None, share: float = 0.1,
    steps: int = 10, learning_rate: float = DEFAULT_RELEARN_LR, batch_size: int = 4,
    max_grad_norm: float | None = 1.0, seed: int = 0, decoding: DecodingFactory | None = None,
    criterion: Any = None, template: str | PromptTemplate | None = None, eval_batch_size: int = 16,
    max_new_tokens: int = DEFAULT_ATTACK_MAX_NEW_TOKENS, rouge: bool = True, progress: bool = True,
) -> dict[str, Any]:
    """Fine-tune copies of ``model`` for ``steps`` steps and measure how much of the forgotten rows comes back.

    Threat model: :data:`RELEARN_THREAT_MODEL`. :func:`split_forget_rows` gives the attacker ``k`` forget rows;
    the other ``n - k`` are measured before and after. Each fine-tune (:func:`_fine_tune`) runs on a merged copy:
    *targeted relearning* on the attack rows (the top-level figures) and, with ``retain``, *benign fine-tuning*
    on retain rows only (``"benign"``). With ``decoding`` the base is trained and every model measured through
    its own ``Decoding``. ``steps=0`` or ``learning_rate=0`` is a null control.

    Returns the settings, row counts, ``forget_nll`` / ``forget_rouge_l`` ``_before`` / ``_after`` /
    ``_original``, the recovered fractions, ``train_loss``, ``benign``, ``seconds`` and with ``criterion``
    ``criterion_before`` / ``_after``. Bad arguments are refused (``ValueError``) before any model call.
    """
    start = time.perf_counter()
    rows = _check_rows(forget, "forget", minimum=2)
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        raise ValueError(f"steps must be a non-negative integer, got {steps!r}.")
    if not isinstance(learning_rate, (int, float)) or not np.isfinite(learning_rate) or learning_rate < 0:
        raise ValueError(f"learning_rate must be a finite number >= 0, got {learning_rate!r}.")
    if max_grad_norm is not None and not max_grad_norm > 0:
        raise ValueError(f"max_grad_norm must be None or > 0, got {max_grad_norm!r}.")
    _check_positive(batch_size=batch_size, eval_batch_size=eval_batch_size, max_new_tokens=max_new_tokens)
    _check_criterion(criterion)
    retain_rows = None if retain is None else _check_rows(retain, "retain")
    attack_rows, eval_rows = split_forget_rows(rows, share, seed)
    _check_model(model)
    ensure_pad_token(tokenizer)
    template = resolve_template(tokenizer, template)
    from .quantization import merged_copy

    measure = {"tokenizer": tokenizer, "rows": eval_rows, "criterion": criterion, "template": template,
               "batch_size": eval_batch_size, "max_new_tokens": max_new_tokens, "rouge": rouge, "progress": False}
    train = {"steps": steps, "learning_rate": float(learning_rate), "batch_size": batch_size,
             "max_grad_norm": max_grad_norm, "seed": seed, "template": template, "progress": progress}
    before = _measure(model, **measure, decoding=decoding, desc="before")
    reference = None if original is None else _measure(original, **measure, decoding=None, desc="original")

    runs = {}  # targeted relearning on the attack rows, then benign fine-tuning on retain rows; each on a copy
    for name, train_rows, desc in (("after", attack_rows, "relearning on forget rows"),
                                   ("benign", retain_rows, "benign fine-tune on retain rows")):
        if train_rows is not None:
            tuned = merged_copy(model)
            losses = _fine_tune(tuned, tokenizer, train_rows, **train, desc=desc)
            runs[name] = losses, _measure(tuned, **measure, decoding=decoding, desc=name, attacked=True)
            del tuned
    losses, after = runs["after"]
    benign = None
    if retain_rows is not None:
        benign_losses, benign_after = runs["benign"]
        benign = {
            "num_train_rows": len(retain_rows), "forget_nll_after": benign_after["forget_nll"],
            "forget_rouge_l_after": benign_after["forget_rouge_l"], **_recovery(before, benign_after, reference),
            "train_loss": benign_losses,
        }
        if criterion is not None:
            benign["criterion_after"] = benign_after["criterion"]
    out: dict[str, Any] = {
        "attack": "relearning", "threat_model": RELEARN_THREAT_MODEL,
        "decoding": DECODING_KEPT if decoding is not None else None, "share": share, "steps": steps,
        "learning_rate": float(learning_rate), "batch_size": batch_size, "max_grad_norm": max_grad_norm,
        "seed": seed, "num_attack_rows": len(attack_rows), "num_eval_rows": len(eval_rows),
        "max_new_tokens": max_new_tokens if rouge else None, "forget_nll_before": before["forget_nll"],
        "forget_nll_after": after["forget_nll"], "forget_rouge_l_before": before["forget_rouge_l"],
        "forget_rouge_l_after": after["forget_rouge_l"],
        "forget_nll_original": None if reference is None else reference["forget_nll"],
        "forget_rouge_l_original": None if reference is None else reference["forget_rouge_l"],
        **_recovery(before, after, reference), "train_loss": losses, "benign": benign,
    }
    if criterion is not None:
        out["criterion_before"], out["criterion_after"] = before["criterion"], after["criterion"]
    out["seconds"] = time.perf_counter() - start
    return out

