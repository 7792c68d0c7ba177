"""The one place where prompt text is built and question/answer pairs are tokenized: every method and the
evaluator go through :func:`format_qa` and :func:`tokenize_qa`, so the answer tokens a method unlearns are the
tokens the evaluator scores. ``template=`` is a :class:`PromptTemplate`, a preset name (:data:`PROMPT_TEMPLATES`)
or ``None`` (the tokenizer's chat template when it has one, else ``plain``: ``"Question: {question}\nAnswer:"`` +
``" {answer}"``).

Tokenization is whole-text, as TOFU, open-unlearning and TRL's ``SFTTrainer`` do: prompt + completion tokenized as
one text, the prompt masked by the common prefix of its tokens and the whole text's (TRL's rule).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from dataclasses import dataclass
from typing import Any, Literal

IGNORE_INDEX = -100


@dataclass(frozen=True)
class PromptTemplate:
    """How a question is put to a model and how its answer follows.

    ``kind="chat"``: ``[system?, user: question]`` (+ ``assistant: answer``) through the chat template
    (``chat_template``, else the tokenizer's), with ``date_string`` when set. ``kind="plain"``: ``prefix +
    question_start_tag + question + question_end_tag + answer_tag + answer`` with the tokenizer's special tokens
    and EOS appended; ``answer_tag_in_prompt=False`` scores the answer tag with the answer (as TOFU does).
    """

    kind: Literal["chat", "plain"] = "plain"
    question_start_tag: str = ""
    question_end_tag: str = ""
    answer_tag: str = ""
    answer_tag_in_prompt: bool = True
    prefix: str = ""
    system_prompt: str | None = None
    date_string: str | None = None
    chat_template: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("chat", "plain"):
            raise ValueError(f"PromptTemplate.kind must be 'chat' or 'plain', got {self.kind!r}.")
        if self.kind == "plain" and (self.system_prompt is not None or self.date_string is not None):
            raise ValueError(
                "system_prompt and date_string are passed to a chat template; a plain template puts any "
                "system text in `prefix`."
            )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (for reports and provenance)."""
        return dataclasses.asdict(self)


PROMPT_TEMPLATES: dict[str, PromptTemplate] = {
    # locuslab/tofu config/model_config.yaml, llama2-7b: "[INST] " + q + " [/INST]" + "" + answer.
    "tofu-llama2": PromptTemplate(
        kind="plain", question_start_tag="[INST] ", question_end_tag=" [/INST]", answer_tag="", name="tofu-llama2"
    ),
    # locuslab/tofu config/model_config.yaml, phi: "Question: " + q + "\n" + "Answer: " + answer; TOFU masks
    # only the question part, so "Answer: " is scored with the answer.
    "tofu-phi": PromptTemplate(kind="plain", question_start_tag="Question: ", question_end_tag="\n",
                               answer_tag="Answer: ", answer_tag_in_prompt=False, name="tofu-phi"),
    # locuslab/open-unlearning configs/model/Llama-3.1-8B-Instruct.yaml (and the Llama-3.2 TOFU models):
    # apply_chat_template with system prompt "You are a helpful assistant." and date_string "10 Apr 2025".
    "open-unlearning-llama3": PromptTemplate(
        kind="chat", system_prompt="You are a helpful assistant.", date_string="10 Apr 2025",
        name="open-unlearning-llama3",
    ),
    # locuslab/open-unlearning configs/model/Qwen2.5-*-Instruct.yaml template_args, rendered as text
    # (open-unlearning's non-chat path: system_prompt_with_special_tokens + user/assistant tags, then EOS).
    "chatml": PromptTemplate(kind="plain", prefix="<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n",
                             question_start_tag="<|im_start|>user\n", question_end_tag="<|im_end|>\n",
                             answer_tag="<|im_start|>assistant\n", name="chatml"),
    # hf_unlearn's default without a chat template: "Question: {q}\nAnswer:" + " {answer}".
    "plain": PromptTemplate(kind="plain", question_start_tag="Question: ", question_end_tag="\nAnswer:",
                            answer_tag=" ", answer_tag_in_prompt=False, name="plain"),
    # The tokenizer's own chat template, no system prompt (the default when the tokenizer has one).
    "chat": PromptTemplate(kind="chat", name="chat"),
}


def get_template(name: str) -> PromptTemplate:
    """The preset called ``name``; a clear error lists the presets otherwise."""
    try:
        return PROMPT_TEMPLATES[name]
    except KeyError:
        raise ValueError(
            f"Unknown prompt template {name!r}; the presets are: {', '.join(sorted(PROMPT_TEMPLATES))}."
        ) from None


def has_chat_template(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` carries a chat template that prompts should go through."""
    return bool(getattr(tokenizer, "chat_template", None))


def resolve_template(tokenizer: Any, template: str | PromptTemplate | None = None) -> PromptTemplate:
    """The :class:`PromptTemplate` that ``template`` names for ``tokenizer`` (``None``: ``chat`` when the tokenizer
    has a chat template, else ``plain``); a chat template without one is refused."""
    if template is None:
        template = "chat" if has_chat_template(tokenizer) else "plain"
    if isinstance(template, str):
        template = get_template(template)
    if not isinstance(template, PromptTemplate):
        raise TypeError(f"template must be None, a preset name or a PromptTemplate, got {type(template).__name__}.")
    if template.kind == "chat" and not (template.chat_template or has_chat_template(tokenizer)):
        raise ValueError(
            f"Prompt template {template.name or 'chat'!r} renders through a chat template, but the tokenizer has "
            "none; pick a plain template (e.g. 'plain', 'tofu-llama2', 'tofu-phi', 'chatml')."
        )
    return template


def _chat_kwargs(template: PromptTemplate) -> dict[str, Any]:
    given = {"chat_template": template.chat_template, "date_string": template.date_string}
    return {k: v for k, v in given.items() if v is not None}


def _chat_messages(template: PromptTemplate, question: str, answer: str | None = None) -> list[dict[str, str]]:
    messages = [] if template.system_prompt is None else [{"role": "system", "content": template.system_prompt}]
    messages.append({"role": "user", "content": question})
    if answer is not None:
        messages.append({"role": "assistant", "content": answer})
    return messages


def template_fingerprint(tokenizer: Any, template: str | PromptTemplate | None = None) -> dict[str, Any]:
    """What identifies the prompts ``template`` builds with ``tokenizer`` (provenance): ``{"template", "kind",
    "fields", "chat_template_sha256"}`` (the last for the chat kind only)."""
    t = resolve_template(tokenizer, template)
    out: dict[str, Any] = {"template": t.name, "kind": t.kind, "fields": t.to_dict()}
    if t.kind == "chat":
        source = t.chat_template or tokenizer.chat_template
        if not isinstance(source, str):
            source = repr(source)
        out["chat_template_sha256"] = hashlib.sha256(source.encode("utf-8")).hexdigest()
    return out


def build_prompt(tokenizer: Any, question: str, *, template: str | PromptTemplate | None = None) -> str:
    """Prompt text for ``question`` (what the model sees before its answer, also when generating)."""
    return format_qa(tokenizer, question, "", template=template)[0]


def format_qa(
    tokenizer: Any, question: str, answer: str, *, template: str | PromptTemplate | None = None
) -> tuple[str, str]:
    """``(prompt_text, completion_text)`` of a question/answer pair; the completion never contains prompt text."""
    t = resolve_template(tokenizer, template)
    if t.kind == "chat":
        kwargs = _chat_kwargs(t)
        prompt = tokenizer.apply_chat_template(
            _chat_messages(t, question), tokenize=False, add_generation_prompt=True, **kwargs
        )
        full = tokenizer.apply_chat_template(_chat_messages(t, question, answer), tokenize=False, **kwargs)
        if full.startswith(prompt):
            return prompt, full[len(prompt) :]
        # Templates that rewrite earlier turns (rare): fall back to the answer text itself.
        return prompt, answer
    head = t.prefix + t.question_start_tag + question + t.question_end_tag
    if t.answer_tag_in_prompt:
        return head + t.answer_tag, answer
    return head, t.answer_tag + answer


def tokenize_prompt(
    tokenizer: Any, question: str, *, template: str | PromptTemplate | None = None
) -> list[int]:
    """Token ids of the prompt alone (for generation), tokenized as :func:`tokenize_qa` tokenizes it."""
    t = resolve_template(tokenizer, template)
    prompt = build_prompt(tokenizer, question, template=t)
    return list(tokenizer(prompt, add_special_tokens=t.kind == "plain")["input_ids"])


def tokenize_qa(
    tokenizer: Any, question: str, answer: str, max_length: int | None = None, *,
    template: str | PromptTemplate | None = None,
) -> dict[str, Any]:
    """``{"input_ids", "attention_mask", "labels", "prompt_length"}`` of prompt + answer from whole-text
    tokenization (plain templates: special tokens, EOS appended unless last); ``labels`` is ``-100`` on the prompt
    (the common prefix of the prompt's and the whole text's tokens). ``max_length`` truncates the answer end; a
    prompt that leaves no room for one answer token is refused (``ValueError``)."""
    t = resolve_template(tokenizer, template)
    prompt, completion = format_qa(tokenizer, question, answer, template=t)
    special = t.kind == "plain"
    prompt_ids = list(tokenizer(prompt, add_special_tokens=special)["input_ids"])
    input_ids = list(tokenizer(prompt + completion, add_special_tokens=special)["input_ids"])
    if special and tokenizer.eos_token_id is not None and (not input_ids or input_ids[-1] != tokenizer.eos_token_id):
        input_ids.append(tokenizer.eos_token_id)
    prompt_length = len(os.path.commonprefix([prompt_ids, input_ids]))
    if max_length is not None:
        if prompt_length + 1 > max_length:
            raise ValueError(
                f"The prompt alone is {prompt_length} tokens, which leaves no room for an answer token within "
                f"max_length={max_length}; raise max_length (the model's limit allowing) or shorten the question."
            )
        input_ids = input_ids[:max_length]
    return {
        "input_ids": input_ids, "attention_mask": [1] * len(input_ids),
        "labels": [IGNORE_INDEX] * prompt_length + input_ids[prompt_length:], "prompt_length": prompt_length,
    }


def model_max_positions(model: Any) -> int | None:
    """The longest sequence ``model`` (or its config) can position (``max_position_embeddings``, ``n_positions``,
    ``max_sequence_length``, ``seq_length`` or ``n_ctx`` of the text config), ``None`` when it does not say."""
    config = getattr(model, "config", model)
    if hasattr(config, "get_text_config"):
        try:
            config = config.get_text_config()
        except Exception:  # noqa: BLE001 - any config without a text part
            pass
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def ensure_pad_token(tokenizer: Any) -> Any:
    """Give ``tokenizer`` a pad token (its EOS token) when it has none; refuse when it has neither."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError("The tokenizer has neither a pad token nor an EOS token to use as one; "
                             "set `tokenizer.pad_token` before unlearning or evaluating.")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def collate_qa(
    features: list[dict[str, list[int]]], pad_token_id: int, padding_side: str = "right"
) -> dict[str, Any]:
    """Pad :func:`tokenize_qa` examples into a batch of tensors, with ``position_ids`` so that left and right
    padding give the same log-likelihoods."""
    import torch

    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    width = max(len(f["input_ids"]) for f in features)
    batch: dict[str, list[list[int]]] = {"input_ids": [], "attention_mask": [], "labels": [], "position_ids": []}
    for f in features:
        n = len(f["input_ids"])
        for key, values, fill in (("input_ids", f["input_ids"], pad_token_id), ("attention_mask", [1] * n, 0),
                                  ("labels", f["labels"], IGNORE_INDEX), ("position_ids", list(range(n)), 0)):
            pad = [fill] * (width - n)
            batch[key].append(list(values) + pad if padding_side == "right" else pad + list(values))
    return {k: torch.tensor(v, dtype=torch.long) for k, v in batch.items()}
