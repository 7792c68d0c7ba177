"""Speed references that method timings are compared against, measured in the same process.

* :func:`plain_forward_seconds`: tokenizing the rows and one no-grad forward pass over them, the
  floor for any method that reads the data (GROM's target: within 3x of it).
* :func:`generate_seconds` / :func:`generation_speed`: greedy ``generate`` wall time on one batch
  with and without logits processors (T3's target: at least half the plain tokens per second).
* :func:`load_speed_subject`: the model and forget/retain rows the speed scripts in
  ``benchmarks/`` measure.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def plain_forward_seconds(model: Any, tokenizer: Any, rows: list[dict[str, Any]], batch_size: int = 16) -> float:
    """Seconds of tokenizing ``rows`` (question/answer) and one no-grad forward pass over them.

    Batches are length-sorted and right-padded, as GROM's key collection does them.
    """
    from ..data import collate_qa, ensure_pad_token, tokenize_qa

    ensure_pad_token(tokenizer)
    device = next(model.parameters()).device
    _sync()
    start = time.perf_counter()
    feats = [tokenize_qa(tokenizer, r["question"], r["answer"]) for r in rows]
    feats.sort(key=lambda f: len(f["input_ids"]))
    with torch.no_grad():
        for i in range(0, len(feats), batch_size):
            batch = collate_qa(feats[i : i + batch_size], tokenizer.pad_token_id, "right")
            model(
                input_ids=batch["input_ids"].to(device),
                attention_mask=batch["attention_mask"].to(device),
                position_ids=batch["position_ids"].to(device),
            )
    _sync()
    return time.perf_counter() - start


def generate_seconds(model: Any, enc: dict[str, torch.Tensor], max_new_tokens: int, processors: Any = None,
                     repeats: int = 1) -> float:
    """Median seconds of one greedy ``generate`` call producing exactly ``max_new_tokens`` (after a warm-up)."""
    kwargs: dict[str, Any] = dict(max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False)
    if processors is not None:
        kwargs["logits_processor"] = processors
    times = []
    for i in range(repeats + 1):
        _sync()
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(**enc, **kwargs)
        _sync()
        if i > 0:
            times.append(time.perf_counter() - start)
    if out.shape[1] != enc["input_ids"].shape[1] + max_new_tokens:
        raise RuntimeError(f"generate stopped early: {out.shape[1] - enc['input_ids'].shape[1]} of {max_new_tokens} tokens")
    return statistics.median(times)


def generation_speed(model: Any, tokenizer: Any, questions: list[str], processors: Any, max_new_tokens: int = 32,
                     repeats: int = 1) -> dict[str, float]:
    """Tokens per second of greedy ``generate`` on one left-padded batch of ``questions``, plain and with ``processors``.

    Returns ``plain_tokens_per_s``, ``tokens_per_s`` (with the processors) and ``speed_ratio`` =
    with / plain (1.0 means no slowdown).
    """
    from ..data import build_prompt, ensure_pad_token

    ensure_pad_token(tokenizer)
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        enc = tokenizer([build_prompt(tokenizer, q) for q in questions], return_tensors="pt", padding=True)
    finally:
        tokenizer.padding_side = side
    device = next(model.parameters()).device
    enc = {k: v.to(device) for k, v in enc.items()}
    n_tokens = len(questions) * max_new_tokens
    plain = generate_seconds(model, enc, max_new_tokens, None, repeats)
    tilted = generate_seconds(model, enc, max_new_tokens, processors, repeats)
    return {"plain_tokens_per_s": n_tokens / plain, "tokens_per_s": n_tokens / tilted, "speed_ratio": plain / tilted,
            "batch_size": len(questions), "max_new_tokens": max_new_tokens}


def load_speed_subject(model: str | None, cache_dir: str | None, device: str | None, source: str, forget_split: str
                       ) -> tuple[Any, Any, list[dict[str, Any]], list[dict[str, Any]], torch.device]:
    """``(model, tokenizer, forget rows, retain rows, device)``: ``model`` (a local folder or Hub id; default: the
    cached TOFU-tiny test target) in eval mode on ``device`` (default: CUDA when available), pad token set."""
    from ..data import RETAIN_FOR_FORGET, ensure_pad_token, load_tofu_rows

    if model:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        lm = AutoModelForCausalLM.from_pretrained(model, dtype="auto")
        tokenizer = AutoTokenizer.from_pretrained(model)
    else:
        from .subjects import load_tiny, tiny_models

        lm, tokenizer = load_tiny(tiny_models(cache_dir=cache_dir).target)
    target_device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    lm.to(target_device).eval()
    ensure_pad_token(tokenizer)
    forget = load_tofu_rows(forget_split, source)
    retain = load_tofu_rows(RETAIN_FOR_FORGET[forget_split], source)
    return lm, tokenizer, forget, retain, target_device
