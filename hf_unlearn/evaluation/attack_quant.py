"""The quantization attack: the forget rows re-measured on 4-bit NF4 and 8-bit LLM.int8() copies of the model
(Zhang et al., "Catastrophic Failure of LLM Unlearning via Quantization", 2024: edits smaller than half a
quantization step are rounded away). The figures are :mod:`.attack_measure`'s.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from tqdm.auto import tqdm

from ..data.prompts import PromptTemplate, ensure_pad_token, resolve_template
from .attack_measure import (
    DEFAULT_ATTACK_MAX_NEW_TOKENS,
    HEAD_KEPT,
    _check_criterion,
    _check_model,
    _check_positive,
    _check_rows,
    _measure,
    _recovery,
)

QUANT_THREAT_MODEL = (
    "The attacker (or an ordinary user) holds the released weights and runs them quantized, as 4-bit NF4 or 8-bit "
    "LLM.int8() (bitsandbytes defaults), with no training and no data."
)


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
    start = time.perf_counter()
    rows, bits = _check_rows(forget, "forget"), _check_bits(bits, method)
    _check_positive(batch_size=batch_size, max_new_tokens=max_new_tokens)
    _check_criterion(criterion)
    _check_model(model)
    ensure_pad_token(tokenizer)
    template = resolve_template(tokenizer, template)
    measure = {"tokenizer": tokenizer, "rows": rows, "criterion": criterion, "template": template,
               "batch_size": batch_size, "max_new_tokens": max_new_tokens, "rouge": rouge, "progress": progress}
    full = _measure(model, **measure, head=head, desc="full precision")
    reference = None if original is None else _measure(original, **measure, head=None, desc="original")
    entries = _quantized_entries(model, bits, method, measure, head=head, full=full, reference=reference,
                                 progress=progress)
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


def _check_bits(bits: Sequence[int], method: str) -> tuple[int, ...]:
    """``bits`` as a tuple; refused unless distinct values from ``(4, 8)``, or unless ``method`` is ``"roundtrip"``
    or ``"bnb"``; NF4 and real bitsandbytes layers need bitsandbytes installed."""
    bits = tuple(bits)
    if not bits or any(b not in (4, 8) for b in bits) or len(set(bits)) != len(bits):
        raise ValueError(f"bits must be distinct values from (4, 8), got {bits!r}.")
    if method not in ("roundtrip", "bnb"):
        raise ValueError(f"method must be 'roundtrip' or 'bnb', got {method!r}.")
    if 4 in bits or method == "bnb":
        from .quantization import _require_bitsandbytes

        _require_bitsandbytes()
    return bits


def _quantized_entries(
    model: Any, bits: Sequence[int], method: str, measure: Mapping[str, Any], *, head: Any,
    full: Mapping[str, Any], reference: Mapping[str, Any] | None, progress: bool,
) -> dict[str, dict[str, Any]]:
    """``{"4": entry, "8": entry}``: each bit width's quantized copy (built, measured, dropped) with its figures,
    their changes from the full-precision ``full`` and the recovered fractions against ``reference``."""
    from .quantization import quantize_int8, quantize_nf4

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
    return entries
