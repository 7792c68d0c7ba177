"""Batched greedy generation (left padding), never past the model's maximum positions: each batch's new tokens
are capped at ``max_positions - prompt width``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from tqdm.auto import tqdm

from ..data.prompts import (
    PromptTemplate,
    ensure_pad_token,
    model_max_positions,
    resolve_template,
    tokenize_prompt,
)
from ..logprobs import eval_mode, model_device

DEFAULT_MAX_NEW_TOKENS = 200  # open-unlearning generation_args max_new_tokens; TOFU: max_length 200


def left_pad(sequences: Sequence[Sequence[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` of token lists padded on the left to a common width."""
    width = max(len(s) for s in sequences)
    ids = [[pad_token_id] * (width - len(s)) + list(s) for s in sequences]
    mask = [[0] * (width - len(s)) + [1] * len(s) for s in sequences]
    return torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.long)


@torch.no_grad()
def greedy_generate(
    model: Any, tokenizer: Any, encoded: Sequence[Sequence[int]], *, batch_size: int, max_new_tokens: int,
    generation_kwargs: Mapping[str, Any] | None = None, progress: bool = False, desc: str = "generating",
) -> list[str]:
    """Greedy continuations of the token lists ``encoded``, in their order: sorted by length, left-padded in batches
    of ``batch_size``, ``model.generate(do_sample=False)`` with at most ``max_new_tokens`` new tokens (fewer where
    the model's maximum positions require; ``generation_kwargs`` override or extend these arguments), the new
    tokens decoded without special tokens."""
    limit = model_max_positions(model)
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    device = model_device(model)
    kwargs = {"max_new_tokens": max_new_tokens, "do_sample": False, "pad_token_id": tokenizer.pad_token_id,
              **(generation_kwargs or {})}
    out: list[str] = [""] * len(encoded)
    with eval_mode(model):
        for start in tqdm(range(0, len(order), batch_size), desc=desc, disable=not progress, leave=False):
            idx = order[start : start + batch_size]
            input_ids, attention_mask = left_pad([encoded[i] for i in idx], tokenizer.pad_token_id)
            batch_kwargs = dict(kwargs)
            if limit is not None:
                batch_kwargs["max_new_tokens"] = min(int(kwargs["max_new_tokens"]), limit - input_ids.shape[1])
            generated = model.generate(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                                       **batch_kwargs)
            texts = tokenizer.batch_decode(generated[:, input_ids.shape[1] :], skip_special_tokens=True)
            for i, text in zip(idx, texts):
                out[i] = text
    return out


def generate_answers(
    model: Any, tokenizer: Any, questions: Sequence[str], *, batch_size: int = 16,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, generation_kwargs: Mapping[str, Any] | None = None,
    template: str | PromptTemplate | None = None, progress: bool = False, desc: str = "generating",
) -> list[str]:
    """Greedy answers to ``questions`` (:func:`greedy_generate`), prompted as :func:`hf_unlearn.data.tokenize_qa`
    prompts them with ``template``; whitespace stripped, and a leading answer tag removed when the template scores
    it as part of the answer (``tofu-phi``). Refused (``ValueError``): bad sizes, or a prompt as long as the
    model's maximum positions."""
    if batch_size < 1 or max_new_tokens < 1:
        raise ValueError(f"batch_size and max_new_tokens must be >= 1, got {batch_size} and {max_new_tokens}.")
    ensure_pad_token(tokenizer)
    t = resolve_template(tokenizer, template)
    encoded = [tokenize_prompt(tokenizer, q, template=t) for q in questions]
    limit = model_max_positions(model)
    if limit is not None and encoded:
        longest = max(range(len(encoded)), key=lambda i: len(encoded[i]))
        if len(encoded[longest]) >= limit:
            raise ValueError(f"The prompt of question {longest} is {len(encoded[longest])} tokens, which leaves no room to generate within the model's {limit} positions; shorten the question or use a model with more.")
    tag = t.answer_tag.strip() if (t.kind == "plain" and not t.answer_tag_in_prompt) else ""
    texts = greedy_generate(model, tokenizer, encoded, batch_size=batch_size, max_new_tokens=max_new_tokens,
                            generation_kwargs=generation_kwargs, progress=progress, desc=desc)
    texts = [text.strip() for text in texts]
    return [text[len(tag) :].strip() if tag and text.startswith(tag) else text for text in texts]
