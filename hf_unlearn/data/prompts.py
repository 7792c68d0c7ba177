"""The one place where prompt text is built and question/answer pairs are tokenized.

Every part of hf_unlearn (trainers, evaluator, GROM key collection, T3 fitting) formats a
question and its answer through :func:`format_qa` and tokenizes through :func:`tokenize_qa`, so
the answer tokens that a method unlearns are exactly the tokens the evaluator scores.

* With a chat template, the prompt is ``apply_chat_template([user: question],
  add_generation_prompt=True)`` and the completion is whatever the full conversation
  ``[user: question, assistant: answer]`` adds after that prompt.
* Without one, the prompt is ``"Question: {question}\\nAnswer:"`` and the completion is
  ``" {answer}"`` followed by the EOS token.

Prompt and completion are tokenized separately and concatenated, so the boundary is exact and the
labels are ``-100`` on every prompt token (loss on answer tokens only).
"""

from __future__ import annotations

from typing import Any

IGNORE_INDEX = -100
PLAIN_PROMPT_TEMPLATE = "Question: {question}\nAnswer:"


def has_chat_template(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` carries a chat template that prompts should go through."""
    return bool(getattr(tokenizer, "chat_template", None))


def build_prompt(tokenizer: Any, question: str) -> str:
    """Prompt text for ``question``: the chat template when the tokenizer has one, else
    ``"Question: {question}\\nAnswer:"``."""
    if has_chat_template(tokenizer):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
        )
    return PLAIN_PROMPT_TEMPLATE.format(question=question)


def format_qa(tokenizer: Any, question: str, answer: str) -> tuple[str, str]:
    """Split a question/answer pair into ``(prompt_text, completion_text)``.

    The completion never contains prompt text; without a chat template it is ``" " + answer``
    (the EOS token is appended at tokenization, see :func:`tokenize_qa`).
    """
    prompt = build_prompt(tokenizer, question)
    if has_chat_template(tokenizer):
        full = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}, {"role": "assistant", "content": answer}],
            tokenize=False,
        )
        if full.startswith(prompt):
            return prompt, full[len(prompt) :]
        # Templates that rewrite earlier turns (rare): fall back to the answer text itself.
        return prompt, answer
    return prompt, " " + answer


def ensure_pad_token(tokenizer: Any) -> Any:
    """Give ``tokenizer`` a pad token (its EOS token) when it has none; refuse when it has neither."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(
                "The tokenizer has neither a pad token nor an EOS token to use as one; "
                "set `tokenizer.pad_token` before unlearning or evaluating."
            )
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def tokenize_qa(
    tokenizer: Any, question: str, answer: str, max_length: int | None = None
) -> dict[str, list[int]]:
    """Token ids of prompt + answer with answer-only labels.

    Returns ``{"input_ids", "attention_mask", "labels", "prompt_length"}`` where ``labels`` is
    ``-100`` on prompt tokens and equals ``input_ids`` on completion tokens. ``max_length``
    truncates the completion from the right (the prompt is always kept).
    """
    prompt, completion = format_qa(tokenizer, question, answer)
    prompt_ids = tokenizer(prompt, add_special_tokens=not has_chat_template(tokenizer))["input_ids"]
    completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
    if not has_chat_template(tokenizer) and tokenizer.eos_token_id is not None:
        completion_ids = completion_ids + [tokenizer.eos_token_id]
    if max_length is not None:
        completion_ids = completion_ids[: max(0, max_length - len(prompt_ids))]
    input_ids = list(prompt_ids) + list(completion_ids)
    return {
        "input_ids": input_ids,
        "attention_mask": [1] * len(input_ids),
        "labels": [IGNORE_INDEX] * len(prompt_ids) + list(completion_ids),
        "prompt_length": len(prompt_ids),
    }


def collate_qa(
    features: list[dict[str, list[int]]], pad_token_id: int, padding_side: str = "right"
) -> dict[str, Any]:
    """Pad tokenized examples from :func:`tokenize_qa` into a batch of tensors.

    ``padding_side`` is ``"right"`` or ``"left"``; ``position_ids`` are returned so that left
    padding gives the same positions (and so the same log-likelihoods) as right padding.
    """
    import torch

    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    width = max(len(f["input_ids"]) for f in features)
    batch = {"input_ids": [], "attention_mask": [], "labels": [], "position_ids": []}
    for f in features:
        n = len(f["input_ids"])
        pad = width - n
        ids, mask, labels = f["input_ids"], [1] * n, f["labels"]
        positions = list(range(n))
        if padding_side == "right":
            batch["input_ids"].append(ids + [pad_token_id] * pad)
            batch["attention_mask"].append(mask + [0] * pad)
            batch["labels"].append(labels + [IGNORE_INDEX] * pad)
            batch["position_ids"].append(positions + [0] * pad)
        else:
            batch["input_ids"].append([pad_token_id] * pad + ids)
            batch["attention_mask"].append([0] * pad + mask)
            batch["labels"].append([IGNORE_INDEX] * pad + labels)
            batch["position_ids"].append([0] * pad + positions)
    return {k: torch.tensor(v, dtype=torch.long) for k, v in batch.items()}
