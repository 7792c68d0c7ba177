"""The quantization attack: the forget rows re-measured on 4-bit NF4 and 8-bit LLM.int8() copies of the model
(Zhang et al., "Catastrophic Failure of LLM Unlearning via Quantization", 2024: edits smaller than half a
quantization step are rounded away). The figures are :mod:`.attack_measure`'s.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Mapping, Sequence
from typing import Any

from tqdm.auto import tqdm

from ..data.prompts import PromptTemplate, ensure_pad_token, resolve_template
from .attack_measure import (
    DECODING_KEPT,
    DEFAULT_ATTACK_MAX_NEW_TOKENS,
    DecodingFactory,
    _check_criterion,
    _check_model,
    _check_positive,
    _check_rows,
    _measure,
    _recovery,
)

QUANT_THREAT_MODEL = ("The attacker (or an ordinary user) holds the released weights and runs them quantized, as 4-bit NF4 or 8-bit LLM.int8() (bitsandbytes defaults), with no training and no data.")


def quantization_attack(
    model: Any, tokenizer: Any, forget: Sequence[Mapping[str, Any]], bits: Sequence[int] = (4, 8), *,
    original: Any = None, decoding: DecodingFactory | None = None, criterion: Any = None,
    method: str = "roundtrip", template: str | PromptTemplate | None = None, batch_size: int = 16,
    max_new_tokens: int = DEFAULT_ATTACK_MAX_NEW_TOKENS, rouge: bool = True, progress: bool = False,
) -> dict[str, Any]:
    """Re-measure the forget rows (question/answer rows or documents) on 4-bit NF4 and 8-bit LLM.int8() copies of
    ``model`` by ``method`` (:data:`QUANT_THREAT_MODEL`); the caller's model is never changed. ``original`` adds
    the recovered fractions; ``decoding`` (:func:`.attack_measure.artifact_decoding`) scores and decodes every
    model through its own ``Decoding``; ``criterion.measure(model, tokenizer, scorer=None)`` joins the figures.

    Returns the settings, ``full_precision`` and ``original`` figures, ``seconds`` and ``bits``: per width its
    figures, ``delta_forget_nll``, ``delta_forget_rouge_l`` and the recovered fractions.
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
    full = _measure(model, **measure, decoding=decoding, desc="full precision")
    reference = None if original is None else _measure(original, **measure, decoding=None, desc="original")
    from .quantization import quantize_int8, quantize_nf4

    entries: dict[str, dict[str, Any]] = {}  # each bit width's copy: built, measured, dropped
    for b in tqdm(bits, desc="quantization attack", disable=not progress):
        quantized = (quantize_nf4 if b == 4 else quantize_int8)(model, method=method)
        figures = _measure(quantized, **measure, decoding=decoding, desc=f"{b}-bit", attacked=True)
        del quantized
        entries[str(b)] = {
            "bits": b, "scheme": "nf4" if b == 4 else "int8", **figures,
            "delta_forget_nll": figures["forget_nll"] - full["forget_nll"],
            "delta_forget_rouge_l": None if figures["forget_rouge_l"] is None
            else figures["forget_rouge_l"] - full["forget_rouge_l"],
            **_recovery(full, figures, reference),
        }
    return {
        "attack": "quantization", "threat_model": QUANT_THREAT_MODEL,
        "decoding": DECODING_KEPT if decoding is not None else None, "method": method, "num_rows": len(rows),
        "max_new_tokens": max_new_tokens if rouge else None, "full_precision": full, "original": reference,
        "bits": entries, "seconds": time.perf_counter() - start,
    }


def _check_bits(bits: Sequence[int], method: str) -> tuple[int, ...]:
    """``bits`` as a tuple; refused unless distinct values from ``(4, 8)`` and ``method`` is ``"roundtrip"`` or
    ``"bnb"``; NF4 and real bitsandbytes layers need bitsandbytes installed."""
    bits = tuple(bits)
    if not bits or any(b not in (4, 8) for b in bits) or len(set(bits)) != len(bits):
        raise ValueError(f"bits must be distinct values from (4, 8), got {bits!r}.")
    if method not in ("roundtrip", "bnb"):
        raise ValueError(f"method must be 'roundtrip' or 'bnb', got {method!r}.")
    if (4 in bits or method == "bnb") and importlib.util.find_spec("bitsandbytes") is None:
        raise ValueError("The 4-bit NF4 attack needs bitsandbytes: pip install 'hf-unlearn[quantization]'.")
    return bits

