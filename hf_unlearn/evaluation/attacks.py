"""Is it really gone? Two attacks that try to bring unlearned knowledge back, each a report section.

* :func:`quantization_attack` re-measures the forget rows on 4-bit NF4 and 8-bit LLM.int8() copies of the model
  (Zhang et al., "Catastrophic Failure of LLM Unlearning via Quantization", 2024: edits smaller than half a
  quantization step are rounded away);
* :func:`relearning_attack` fine-tunes a copy for a few steps on a small share of the forget rows (measured on the
  others) and, separately, on retain rows only (benign fine-tuning), as Hu et al. ("Jogging the Memory of
  Unlearned LLMs Through Targeted Relearning Attacks", 2024) do.

Both work on copies: the caller's model (its parameters, buffers, adapters, training mode) is never changed.
A PEFT adapter (GROM's exported adapter, a MASC LoRA) is merged into the copy first. A T3 result is attacked as
an attacker holding its weights would: the attack applies to the *base model* and the guidance head is kept as
fitted (``head=``; every score and generation of an attacked copy goes through that head; it is not refitted),
and the result says so under ``"head"``.

The figures, over the forget rows ``F`` an attack measures (``F`` minus the attack's own rows for relearning):

* ``forget_nll`` = ``mean_{i in F} NLL_i`` with ``NLL_i`` the average per-token answer NLL
  (:func:`hf_unlearn.logprobs.answer_nll`, under the T3 scorer when a head is given);
* ``forget_rouge_l`` = mean ROUGE-L recall of greedy answers (:func:`.generation.generate_answers`,
  ``max_new_tokens`` new tokens) against the gold answers;
* with ``original`` (the model before unlearning), the recovered share of the gap the unlearning opened::

      recovered_fraction         = (NLL_unlearned - NLL_attacked) / (NLL_unlearned - NLL_original)
      recovered_fraction_rouge_l = (R_attacked - R_unlearned) / (R_original - R_unlearned)

  0 when the attack changes nothing, 1 when it restores the original, ``None`` when the gap is below
  :data:`MIN_GAP` (nothing was unlearned to recover);
* with ``criterion`` (any object with ``measure(model, tokenizer, scorer=None) -> dict``, such as a
  reference-free forget criterion), its dict for each measured model.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from ..data.documents import as_documents, chunk_length, document_heads
from ..data.prepare import PromptTooLongError, prepare_qa
from ..data.prompts import (
    IGNORE_INDEX,
    PromptTemplate,
    collate_qa,
    ensure_pad_token,
    resolve_template,
)
from ..logprobs import answer_nll as _answer_nll
from ..logprobs import causal_lm_scorer, effective_max_length, feature_token_statistics, model_device
from .generation import generate_answers
from .rouge import rouge_l_recall

ATTACK_NAMES = ("quant", "relearn")
"""The attacks by their short names (``hf-unlearn eval --attacks quant,relearn``)."""

MIN_GAP = 1e-6
"""Below this unlearning gap (NLL nats or ROUGE-L) a recovered fraction is undefined (``None``)."""

DEFAULT_RELEARN_LR = 1e-4
"""Default relearning learning rate (see :func:`relearning_attack`)."""

DEFAULT_ATTACK_MAX_NEW_TOKENS = 64
"""Greedy answer length of the attacks' ROUGE-L (TOFU answers are one or two sentences)."""

HEAD_KEPT = "base model attacked; T3 head kept, not refitted"
QUANT_THREAT_MODEL = (
    "The attacker (or an ordinary user) holds the released weights and runs them quantized, as 4-bit NF4 or 8-bit "
    "LLM.int8() (bitsandbytes defaults), with no training and no data."
)
RELEARN_THREAT_MODEL = (
    "The attacker holds the released weights and fine-tunes them for a few steps, either on a small share of the "
    "forgotten rows (they know some of the forgotten facts: targeted relearning) or on retain rows only (benign "
    "fine-tuning, no forgotten data); the forget rows the attack did not train on are then re-measured."
)


def _check_rows(rows: Sequence[Mapping[str, Any]], name: str, minimum: int = 1) -> list[Mapping[str, Any]]:
    """Question/answer rows as given, or documents (:func:`hf_unlearn.data.documents.as_documents`) as ``{"text"}`` rows."""
    docs = as_documents(rows)
    rows = [{"text": d} for d in docs] if docs is not None else list(rows)
    if len(rows) < minimum:
        raise ValueError(f"{name} needs at least {minimum} row(s), got {len(rows)}.")
    for i, row in enumerate(rows):
        if docs is None and (not isinstance(row, Mapping) or "question" not in row or "answer" not in row):
            raise ValueError(f"{name} row {i} needs 'question' and 'answer' fields.")
    return rows


def _is_peft(model: Any) -> bool:
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a dependency
        return False
    return isinstance(model, PeftModel)


def _check_model(model: Any) -> None:
    if getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False):
        raise ValueError("The attacks need the full-precision (merged) model, not an already quantized one.")
    if not _is_peft(model) and not hasattr(model, "save_pretrained"):
        raise ValueError(f"The attacks need a transformers PreTrainedModel or a PeftModel, got {type(model).__name__}.")


@contextlib.contextmanager
def _scoring(model: Any, head: Any, attacked: bool) -> Iterator[tuple[Any, dict[str, Any] | None]]:
    """``(scorer, generation_kwargs)`` of ``model``: plain, or T3's (``head`` kept) for this very model. The head's
    base check runs on the caller's model; an ``attacked`` copy is the base changed on purpose."""
    if head is None:
        yield None, None
        return
    from transformers import LogitsProcessorList

    from ..methods.t3 import T3LogitsProcessor, t3_scorer

    # an attacked (quantized or fine-tuned) copy differs from the weights the head was fitted on by construction
    check = not attacked
    with T3LogitsProcessor(model, head, check_base_weights=check) as processor:
        scorer = t3_scorer(model, head, check_base_weights=check)
        yield scorer, {"logits_processor": LogitsProcessorList([processor])}


def _measure(
    model: Any,
    tokenizer: Any,
    rows: Sequence[Mapping[str, Any]],
    *,
    head: Any,
    criterion: Any,
    template: PromptTemplate,
    batch_size: int,
    max_new_tokens: int,
    rouge: bool,
    progress: bool,
    desc: str,
    attacked: bool = False,
) -> dict[str, Any]:
    """Forget NLL, forget ROUGE-L (when ``rouge``) and the criterion's dict of one model on ``rows``.

    For documents (``{"text"}`` rows) the forget NLL is the mean over documents of the average NLL of every token
    of each document's first chunk (:func:`_document_features`); ROUGE-L is ``None`` (there is no question to
    answer)."""
    if _are_documents(rows):
        features = _document_features(model, tokenizer, rows)
        with _scoring(model, head, attacked) as (scorer, _):
            stats = feature_token_statistics(model, tokenizer, features, scorer=scorer, batch_size=batch_size,
                                             progress=progress, desc=f"{desc}: documents")
            out = {"forget_nll": float(np.mean(stats.avg_nll)), "forget_rouge_l": None}
            if criterion is not None:
                out["criterion"] = dict(criterion.measure(model, tokenizer, scorer=scorer))
        return out
    questions = [r["question"] for r in rows]
    answers = [r["answer"] for r in rows]
    with _scoring(model, head, attacked) as (scorer, generation_kwargs):
        nll = _answer_nll(model, tokenizer, questions, answers, scorer=scorer, batch_size=batch_size,
                          template=template, progress=progress, desc=f"{desc}: answers")
        out: dict[str, Any] = {"forget_nll": float(np.mean(nll)), "forget_rouge_l": None}
        if rouge:
            generations = generate_answers(model, tokenizer, questions, batch_size=batch_size,
                                           max_new_tokens=max_new_tokens, generation_kwargs=generation_kwargs,
                                           template=template, progress=progress, desc=f"{desc}: generating")
            out["forget_rouge_l"] = float(np.mean(rouge_l_recall(generations, answers)))
        if criterion is not None:
            out["criterion"] = dict(criterion.measure(model, tokenizer, scorer=scorer))
    return out


def _are_documents(rows: Sequence[Mapping[str, Any]]) -> bool:
    return bool(rows) and "text" in rows[0]


def _document_features(model: Any, tokenizer: Any, rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each document's first chunk, loss on every token: its first ``min(max positions, 2048)`` tokens
    (:func:`hf_unlearn.data.documents.document_heads`)."""
    return document_heads([r["text"] for r in rows], tokenizer, chunk_length(None, effective_max_length(model)))[0]


def recovered_fraction(unlearned: float | None, attacked: float | None, original: float | None) -> float | None:
    """Share of the unlearning gap an attack recovered: ``(unlearned - attacked) / (unlearned - original)``.

    Written for losses (lower = better known); for scores such as ROUGE-L the same formula holds, the signs
    of numerator and denominator flipping together. ``None`` when a figure is missing or
    ``|unlearned - original| < MIN_GAP``.
    """
    if unlearned is None or attacked is None or original is None:
        return None
    gap = unlearned - original
    if abs(gap) < MIN_GAP:
        return None
    return float((unlearned - attacked) / gap)


def _recovery(before: Mapping[str, Any], after: Mapping[str, Any], original: Mapping[str, Any] | None) -> dict:
    if original is None:
        return {"recovered_fraction": None, "recovered_fraction_rouge_l": None}
    return {
        "recovered_fraction": recovered_fraction(before["forget_nll"], after["forget_nll"], original["forget_nll"]),
        "recovered_fraction_rouge_l": recovered_fraction(
            before["forget_rouge_l"], after["forget_rouge_l"], original["forget_rouge_l"]
        ),
    }


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")


def _check_criterion(criterion: Any) -> None:
    if criterion is not None and not callable(getattr(criterion, "measure", None)):
        raise ValueError("criterion must have a measure(model, tokenizer, scorer=None) method.")


def quantization_attack(
    model: Any,
    tokenizer: Any,
    forget: Sequence[Mapping[str, Any]],
    bits: Sequence[int] = (4, 8),
    *,
    original: Any = None,
    head: Any = None,
    criterion: Any = None,
    method: str = "roundtrip",
    template: str | PromptTemplate | None = None,
    batch_size: int = 16,
    max_new_tokens: int = DEFAULT_ATTACK_MAX_NEW_TOKENS,
    rouge: bool = True,
    progress: bool = False,
) -> dict[str, Any]:
    """Re-measure the forget rows on quantized copies of ``model``: 4-bit NF4 and 8-bit LLM.int8().

    Threat model (:data:`QUANT_THREAT_MODEL`): whoever holds the released weights runs them quantized, with no
    training and no data; an edit that moves weights by less than half a quantization step (for NF4 half the gap
    between neighbouring code values times the block's absmax ``s_b``; for int8 ``s_r / 254`` with ``s_r`` the row's
    absmax) can round back to the original codes. For each bit width ``b`` in ``bits`` a quantized copy is built,
    ``b = 4`` by :func:`.quantization.quantize_nf4` (blockwise NF4, 64 weights per absmax scale) and ``b = 8`` by
    :func:`.quantization.quantize_int8` (row-wise absmax int8), both with ``method`` (``"roundtrip"``: the
    quantized weights evaluated in float32, the same on every machine; ``"bnb"``: real bitsandbytes layers).
    The output head stays in full precision, as bitsandbytes leaves it.

    Cost: per bit width one model copy (memory = one model in float32) plus one scoring pass and one greedy
    generation over the forget rows (``max_new_tokens`` tokens each; ``rouge=False`` skips it); the full-precision
    model and ``original`` are measured once each.

    Args:
        model: the unlearned causal LM, a ``PeftModel`` (merged on the copy) or, with ``head``, a T3 base.
        forget: rows with ``question`` and ``answer``, or documents (a list of strings, a path, a ``text``
            dataset): then ``forget_nll`` is the mean over documents of each one's average NLL over every token of
            its first chunk, and ROUGE-L is ``None``.
        bits: bit widths to try, from ``(4, 8)``.
        original: the model before unlearning; adds the recovered fractions (module docstring).
        head: a :class:`~hf_unlearn.methods.t3.T3Classifier` fitted on ``model``: the quantized base is scored and decoded
            through it (kept, not refitted).
        criterion: optional object with ``measure(model, tokenizer, scorer=None) -> dict``; its dict is added to
            every measured model's figures.

    Returns:
        ``{"attack": "quantization", "threat_model", "head", "method", "num_rows", "full_precision": {figures},
        "original": {figures} or None, "bits": {"4": entry, "8": entry}, "seconds"}`` where each entry holds
        ``bits``, ``scheme`` (``"nf4"``/``"int8"``), ``forget_nll``, ``forget_rouge_l``, their changes from full
        precision (``delta_forget_nll``, ``delta_forget_rouge_l``), ``recovered_fraction``,
        ``recovered_fraction_rouge_l`` and, with a criterion, ``criterion``.
    """
    from .quantization import quantize_int8, quantize_nf4

    start = time.perf_counter()
    rows = _check_rows(forget, "forget")
    bits = tuple(bits)
    if not bits or any(b not in (4, 8) for b in bits) or len(set(bits)) != len(bits):
        raise ValueError(f"bits must be distinct values from (4, 8), got {bits!r}.")
    if method not in ("roundtrip", "bnb"):
        raise ValueError(f"method must be 'roundtrip' or 'bnb', got {method!r}.")
    if 4 in bits or method == "bnb":
        from .quantization import _require_bitsandbytes

        _require_bitsandbytes()
    _check_positive(batch_size=batch_size, max_new_tokens=max_new_tokens)
    _check_criterion(criterion)
    _check_model(model)
    ensure_pad_token(tokenizer)
    template = resolve_template(tokenizer, template)
    measure = {"tokenizer": tokenizer, "rows": rows, "criterion": criterion, "template": template,
               "batch_size": batch_size, "max_new_tokens": max_new_tokens, "rouge": rouge, "progress": progress}
    full = _measure(model, **measure, head=head, desc="full precision")
    reference = None if original is None else _measure(original, **measure, head=None, desc="original")
    entries: dict[str, dict[str, Any]] = {}
    for b in tqdm(bits, desc="quantization attack", disable=not progress):
        quantized = (quantize_nf4 if b == 4 else quantize_int8)(model, method=method)
        figures = _measure(quantized, **measure, head=head, desc=f"{b}-bit", attacked=True)
        del quantized
        entry = {"bits": b, "scheme": "nf4" if b == 4 else "int8", **figures}
        entry["delta_forget_nll"] = figures["forget_nll"] - full["forget_nll"]
        entry["delta_forget_rouge_l"] = (
            None if figures["forget_rouge_l"] is None else figures["forget_rouge_l"] - full["forget_rouge_l"]
        )
        entry.update(_recovery(full, figures, reference))
        entries[str(b)] = entry
    return {
        "attack": "quantization",
        "threat_model": QUANT_THREAT_MODEL,
        "head": HEAD_KEPT if head is not None else None,
        "method": method,
        "num_rows": len(rows),
        "max_new_tokens": max_new_tokens if rouge else None,
        "full_precision": full,
        "original": reference,
        "bits": entries,
        "seconds": time.perf_counter() - start,
    }


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
    model: Any,
    tokenizer: Any,
    rows: Sequence[Mapping[str, Any]],
    *,
    steps: int,
    learning_rate: float,
    batch_size: int,
    max_grad_norm: float | None,
    seed: int,
    template: PromptTemplate,
    progress: bool,
    desc: str,
) -> list[float]:
    """``steps`` AdamW steps of answer-token NLL on ``rows`` (in place on ``model``); the per-step losses.

    Step ``s`` trains on ``min(batch_size, n)`` consecutive rows of a seeded permutation, wrapping around; the
    loss is the token mean ``-sum_t log p(y_t | x, y_<t) / #answer tokens`` over the batch
    (:func:`hf_unlearn.logprobs.causal_lm_scorer`).
    """
    limit = effective_max_length(model)
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    per_step = min(batch_size, len(order))
    used = sorted({order[i % len(order)] for i in range(min(len(order), steps * per_step))})
    try:  # only the rows the steps reach
        if _are_documents(rows):  # documents: each one's first chunk, loss on every token
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
            mask = batch["labels"] != IGNORE_INDEX
            mask[:, 0] = False
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
    model: Any,
    tokenizer: Any,
    forget: Sequence[Mapping[str, Any]],
    retain: Sequence[Mapping[str, Any]] | None = None,
    *,
    original: Any = None,
    share: float = 0.1,
    steps: int = 10,
    learning_rate: float = DEFAULT_RELEARN_LR,
    batch_size: int = 4,
    max_grad_norm: float | None = 1.0,
    seed: int = 0,
    head: Any = None,
    criterion: Any = None,
    template: str | PromptTemplate | None = None,
    eval_batch_size: int = 16,
    max_new_tokens: int = DEFAULT_ATTACK_MAX_NEW_TOKENS,
    rouge: bool = True,
    progress: bool = True,
) -> dict[str, Any]:
    """Fine-tune copies of ``model`` for ``steps`` steps and measure how much of the forgotten rows comes back.

    Threat model (:data:`RELEARN_THREAT_MODEL`): the attacker holds the released weights and a small fine-tuning
    budget, and knows a few of the forgotten facts (targeted) or none (benign); knowledge that was hidden rather than
    removed comes back on the rows the attacker never showed the model. The forget rows are split by :func:`split_forget_rows`: the attacker
    trains on ``k = max(1, round(share * n))`` of them (default 10%) and the other ``n - k`` are measured before
    and after. Two fine-tunes, each on its own copy (PEFT adapters merged in):

    (a) *targeted relearning* on the attack rows (the top-level figures);
    (b) *benign fine-tuning* on ``retain`` rows only, when ``retain`` is given (``"benign"``).

    ``forget`` and ``retain`` may be documents (a list of strings, a path, a ``text`` dataset): the split is then
    over documents, the fine-tune minimises the NLL of every token of each document's first chunk, and the
    re-measured figure is the forget documents' NLL (ROUGE-L ``None``).

    Each fine-tune is ``steps`` AdamW steps (no weight decay, constant ``learning_rate``, gradients clipped to norm
    ``max_grad_norm`` as the transformers ``Trainer`` does by default) on batches of ``min(batch_size, rows)`` rows,
    minimising the answer-token NLL of prompts built by :mod:`hf_unlearn.data.prompts` (``template``). With a T3
    ``head`` the fine-tune trains the base, as an attacker would; the head is kept as fitted, not refitted, and the
    attacked base is measured through it.

    Default budget: 10 steps at ``learning_rate = 1e-4``, the range targets are fine-tuned in (TOFU's 7B models at
    1e-5 to 2e-5, the SmolLM2-135M TOFU-small target at 3e-4); an Adam step moves each weight by about the learning
    rate, so the attack moves each weight by at most about ``steps * learning_rate`` = 1e-3. Passing the target's own
    fine-tuning learning rate gives the attacker the budget the target itself was trained with.

    Cost: per fine-tune one model copy plus AdamW's two moments (memory about 4x the model's parameters in their
    dtype, plus activations of ``batch_size`` rows), ``steps`` forward + backward passes (about 3 forwards each) of
    ``batch_size`` rows; measuring is one scoring pass and one greedy generation of ``max_new_tokens`` tokens over
    the ``n - k`` held-out rows per model (``model`` once, each attacked copy, ``original`` once).

    Returns:
        ``{"attack": "relearning", "threat_model", "head", "share", "steps", "learning_rate", "batch_size", "seed",
        "num_attack_rows", "num_eval_rows", "forget_nll_before", "forget_nll_after", "forget_rouge_l_before",
        "forget_rouge_l_after", "forget_nll_original", "forget_rouge_l_original", "recovered_fraction",
        "recovered_fraction_rouge_l", "train_loss": [per step], "benign": {"forget_nll_after",
        "forget_rouge_l_after", "recovered_fraction", "recovered_fraction_rouge_l", "train_loss", "num_train_rows"}
        or None, "seconds"}``; ROUGE-L figures are ``None`` with ``rouge=False``, recovered fractions without
        ``original`` (formulas in the module docstring). With ``criterion``, ``criterion_before`` /
        ``criterion_after`` (and ``benign["criterion_after"]``).

    Raises:
        ValueError: bad arguments (``share`` outside (0, 1), negative ``steps`` or ``learning_rate``, fewer than
            two forget rows, an empty ``retain``, a quantized model), before any model call.
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
               "batch_size": eval_batch_size, "max_new_tokens": max_new_tokens, "rouge": rouge,
               "progress": False}
    train = {"steps": steps, "learning_rate": float(learning_rate), "batch_size": batch_size,
             "max_grad_norm": max_grad_norm, "seed": seed, "template": template, "progress": progress}
    before = _measure(model, **measure, head=head, desc="before")
    reference = None if original is None else _measure(original, **measure, head=None, desc="original")

    attacked = merged_copy(model)
    losses = _fine_tune(attacked, tokenizer, attack_rows, **train, desc="relearning on forget rows")
    after = _measure(attacked, **measure, head=head, desc="after", attacked=True)
    del attacked
    benign = None
    if retain_rows is not None:
        tuned = merged_copy(model)
        benign_losses = _fine_tune(tuned, tokenizer, retain_rows, **train, desc="benign fine-tune on retain rows")
        benign_after = _measure(tuned, **measure, head=head, desc="benign", attacked=True)
        del tuned
        benign = {
            "num_train_rows": len(retain_rows),
            "forget_nll_after": benign_after["forget_nll"],
            "forget_rouge_l_after": benign_after["forget_rouge_l"],
            **_recovery(before, benign_after, reference),
            "train_loss": benign_losses,
        }
        if criterion is not None:
            benign["criterion_after"] = benign_after["criterion"]
    out: dict[str, Any] = {
        "attack": "relearning",
        "threat_model": RELEARN_THREAT_MODEL,
        "head": HEAD_KEPT if head is not None else None,
        "share": share,
        "steps": steps,
        "learning_rate": float(learning_rate),
        "batch_size": batch_size,
        "max_grad_norm": max_grad_norm,
        "seed": seed,
        "num_attack_rows": len(attack_rows),
        "num_eval_rows": len(eval_rows),
        "max_new_tokens": max_new_tokens if rouge else None,
        "forget_nll_before": before["forget_nll"],
        "forget_nll_after": after["forget_nll"],
        "forget_rouge_l_before": before["forget_rouge_l"],
        "forget_rouge_l_after": after["forget_rouge_l"],
        "forget_nll_original": None if reference is None else reference["forget_nll"],
        "forget_rouge_l_original": None if reference is None else reference["forget_rouge_l"],
        **_recovery(before, after, reference),
        "train_loss": losses,
        "benign": benign,
    }
    if criterion is not None:
        out["criterion_before"], out["criterion_after"] = before["criterion"], after["criterion"]
    out["seconds"] = time.perf_counter() - start
    return out


_ALIASES = {"quant": "quant", "quantization": "quant", "relearn": "relearn", "relearning": "relearn"}


def parse_attacks(attacks: str | Sequence[str] | Mapping[str, Mapping[str, Any] | None] | None
                  ) -> dict[str, dict[str, Any]]:
    """``{name: kwargs}`` from ``"quant,relearn"``, a list of names or a mapping of names to keyword arguments
    (``quant``/``quantization``, ``relearn``/``relearning``); ``None`` or empty gives ``{}``."""
    if attacks is None:
        return {}
    if isinstance(attacks, str):
        attacks = [a.strip() for a in attacks.split(",") if a.strip()]
    items = attacks.items() if isinstance(attacks, Mapping) else ((a, None) for a in attacks)
    out: dict[str, dict[str, Any]] = {}
    for name, kwargs in items:
        key = _ALIASES.get(str(name).lower())
        if key is None:
            raise ValueError(f"Unknown attack {name!r}; choose from {', '.join(ATTACK_NAMES)}.")
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise ValueError(f"The options of attack {name!r} must be a dict, got {type(kwargs).__name__}.")
        out[key] = dict(kwargs or {})
    return out


def check_attack_options(chosen: Mapping[str, Mapping[str, Any]], **common: Any) -> None:
    """Refuse, before any model call, options an attack does not take, what it would refuse later and what would
    make it a no-op: bit widths other than 4 and 8, NF4 without bitsandbytes, a ``share`` outside (0, 1),
    ``steps`` below 1, a ``learning_rate`` that is not a finite number > 0. (:func:`relearning_attack` called
    directly still takes ``steps=0`` or ``learning_rate=0``, a null control.)"""
    import importlib.util
    import inspect

    functions = {"quant": quantization_attack, "relearn": relearning_attack}
    for name, kwargs in chosen.items():
        merged = {**common, **kwargs}
        if name == "relearn" and "batch_size" in common and "batch_size" not in kwargs:
            merged["eval_batch_size"] = merged.pop("batch_size")
        try:
            inspect.signature(functions[name]).bind(None, None, [], **merged)
        except TypeError as err:
            raise ValueError(f"Bad options for the {name} attack: {err}.") from None
        if name == "quant":
            bits = tuple(merged.get("bits", (4, 8)))
            if not bits or any(b not in (4, 8) for b in bits) or len(set(bits)) != len(bits):
                raise ValueError(f"bits must be distinct values from (4, 8), got {bits!r}.")
            if (4 in bits or merged.get("method") == "bnb") and importlib.util.find_spec("bitsandbytes") is None:
                raise ValueError("The 4-bit NF4 attack needs bitsandbytes: pip install 'hf-unlearn[quantization]'.")
        else:
            share = merged.get("share", 0.1)
            if not isinstance(share, (int, float)) or not 0.0 < share < 1.0:
                raise ValueError(f"share must be in (0, 1), got {share!r}.")
            steps = merged.get("steps", 10)
            if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
                raise ValueError(f"steps must be a non-negative integer, got {steps!r}.")
            if steps == 0:
                raise ValueError("steps=0: a relearning attack of no steps changes nothing and reports nothing; "
                                 "use steps >= 1 (10 by default).")
            lr = merged.get("learning_rate", DEFAULT_RELEARN_LR)
            if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or not lr > 0:
                raise ValueError(f"learning_rate must be a finite number > 0 for the relearning attack, got {lr!r}.")


def run_attacks(
    model: Any,
    tokenizer: Any,
    forget: Sequence[Mapping[str, Any]],
    retain: Sequence[Mapping[str, Any]] | None,
    attacks: str | Sequence[str] | Mapping[str, Mapping[str, Any] | None],
    **common: Any,
) -> dict[str, Any]:
    """Run the named ``attacks`` (:func:`parse_attacks`) on ``model``: ``{"quantization": section, "relearning":
    section}`` for those asked. ``common`` (e.g. ``template``, ``original``, ``head``, ``progress``) goes to
    every attack; an attack's own options override it."""
    chosen = parse_attacks(attacks)
    check_attack_options(chosen, **common)
    out: dict[str, Any] = {}
    if "quant" in chosen:
        kwargs = {**common, **chosen["quant"]}
        out["quantization"] = quantization_attack(model, tokenizer, forget, **kwargs)
    if "relearn" in chosen:
        kwargs = {**common, **chosen["relearn"]}
        kwargs.setdefault("retain", retain)
        if "batch_size" in common and "batch_size" not in chosen["relearn"]:
            kwargs["eval_batch_size"] = kwargs.pop("batch_size")
        out["relearning"] = relearning_attack(model, tokenizer, forget, **kwargs)
    return out


ATTACK_COLUMNS = (
    ("attack_nf4_forget_rouge_l", "forget ROUGE-L (NF4 attack)"),
    ("attack_int8_forget_rouge_l", "forget ROUGE-L (int8 attack)"),
    ("attack_nf4_recovered", "NF4 recovered"),
    ("attack_int8_recovered", "int8 recovered"),
    ("attack_relearn_forget_nll", "forget NLL after relearning"),
    ("attack_relearn_recovered", "relearning recovered"),
    ("attack_benign_recovered", "benign fine-tune recovered"),
)
"""The flat attack figures (:func:`attack_summary`) and their titles, for tables and model cards."""


def attack_summary(section: Mapping[str, Any] | None) -> dict[str, float | None]:
    """The headline figure of each attack, flat (keys of :data:`ATTACK_COLUMNS`; ``None`` where not run).

    ``attack_nf4_*`` / ``attack_int8_*``: forget ROUGE-L of the quantized copy and its recovered NLL fraction;
    ``attack_relearn_forget_nll``: held-out forget NLL after targeted relearning; ``attack_relearn_recovered`` /
    ``attack_benign_recovered``: the NLL recovered fractions of targeted relearning and benign fine-tuning.
    """
    out: dict[str, float | None] = dict.fromkeys(key for key, _ in ATTACK_COLUMNS)
    section = section or {}
    quant = (section.get("quantization") or {}).get("bits", {})
    for bits, scheme in (("4", "nf4"), ("8", "int8")):
        entry = quant.get(bits)
        if entry:
            out[f"attack_{scheme}_forget_rouge_l"] = entry.get("forget_rouge_l")
            out[f"attack_{scheme}_recovered"] = entry.get("recovered_fraction")
    relearn = section.get("relearning")
    if relearn:
        out["attack_relearn_forget_nll"] = relearn.get("forget_nll_after")
        out["attack_relearn_recovered"] = relearn.get("recovered_fraction")
        out["attack_benign_recovered"] = (relearn.get("benign") or {}).get("recovered_fraction")
    return out


def format_attacks(section: Mapping[str, Any] | None) -> str:
    """The attack section as printable lines (empty when no attack ran)."""
    if not section:
        return ""
    lines = ["Attacks (is it really gone?)"]

    def f(value: Any) -> str:
        return "n/a" if value is None else f"{value:.3f}"

    quant = section.get("quantization")
    if quant:
        full = quant["full_precision"]
        lines.append(f"  quantization ({quant['method']}, {quant['num_rows']} forget rows): full precision "
                     f"NLL {f(full['forget_nll'])}, ROUGE-L {f(full['forget_rouge_l'])}")
        for entry in quant["bits"].values():
            lines.append(f"    {entry['bits']}-bit {entry['scheme']}: NLL {f(entry['forget_nll'])}, ROUGE-L "
                         f"{f(entry['forget_rouge_l'])}, recovered {f(entry['recovered_fraction'])}")
    relearn = section.get("relearning")
    if relearn:
        lines.append(f"  relearning ({relearn['steps']} steps at lr {relearn['learning_rate']:g} on "
                     f"{relearn['num_attack_rows']} forget rows, measured on {relearn['num_eval_rows']}): NLL "
                     f"{f(relearn['forget_nll_before'])} -> {f(relearn['forget_nll_after'])}, ROUGE-L "
                     f"{f(relearn['forget_rouge_l_before'])} -> {f(relearn['forget_rouge_l_after'])}, recovered "
                     f"{f(relearn['recovered_fraction'])}")
        benign = relearn.get("benign")
        if benign:
            lines.append(f"    benign fine-tune on {benign['num_train_rows']} retain rows: NLL "
                         f"{f(benign['forget_nll_after'])}, recovered {f(benign['recovered_fraction'])}")
    head = (quant or relearn or {}).get("head")
    if head:
        lines.append(f"  ({head})")
    return "\n".join(lines)
