"""Batched greedy answer generation from the package's prompts (left padding, as `generate` needs)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from tqdm.auto import tqdm

from ..data.prompts import build_prompt, ensure_pad_token, has_chat_template


def _model_device(model: Any) -> torch.device:
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration):
        return torch.device("cpu")


def left_pad(sequences: Sequence[Sequence[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` of token lists padded on the left to a common width."""
    width = max(len(s) for s in sequences)
    ids = [[pad_token_id] * (width - len(s)) + list(s) for s in sequences]
    mask = [[0] * (width - len(s)) + [1] * len(s) for s in sequences]
    return torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.long)


@torch.no_grad()
def generate_answers(
    model: Any,
    tokenizer: Any,
    questions: Sequence[str],
    *,
    batch_size: int = 16,
    max_new_tokens: int = 64,
    generation_kwargs: Mapping[str, Any] | None = None,
    progress: bool = False,
    desc: str = "generating",
) -> list[str]:
    """Greedy answers to ``questions``, prompted by :func:`hf_unlearn.data.build_prompt`.

    Prompts are tokenized exactly as :func:`hf_unlearn.data.tokenize_qa` tokenizes them, sorted by
    length, left-padded in batches of ``batch_size`` and passed to ``model.generate`` with
    ``do_sample=False``; ``generation_kwargs`` (e.g. ``logits_processor``) override or extend
    those arguments. Returns the decoded new tokens (special tokens dropped, whitespace stripped),
    in the order of ``questions``.
    """
    if batch_size < 1 or max_new_tokens < 1:
        raise ValueError(
            f"batch_size and max_new_tokens must be >= 1, got {batch_size} and {max_new_tokens}."
        )
    ensure_pad_token(tokenizer)
    add_special = not has_chat_template(tokenizer)
    encoded = [
        tokenizer(build_prompt(tokenizer, q), add_special_tokens=add_special)["input_ids"] for q in questions
    ]
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    device = _model_device(model)
    kwargs: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "do_sample": False,
        "pad_token_id": tokenizer.pad_token_id,
    }
    kwargs.update(generation_kwargs or {})
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    answers: list[str] = [""] * len(encoded)
    try:
        for start in tqdm(range(0, len(order), batch_size), desc=desc, disable=not progress, leave=False):
            idx = order[start : start + batch_size]
            input_ids, attention_mask = left_pad([encoded[i] for i in idx], tokenizer.pad_token_id)
            out = model.generate(
                input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), **kwargs
            )
            texts = tokenizer.batch_decode(out[:, input_ids.shape[1] :], skip_special_tokens=True)
            for i, text in zip(idx, texts):
                answers[i] = text.strip()
    finally:
        if was_training and hasattr(model, "train"):
            model.train()
    return answers
