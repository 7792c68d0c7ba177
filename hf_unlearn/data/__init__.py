"""TOFU-shaped data: loading (Hub id, local folder or synthetic), prompts, tokenization (prepare_qa), the overlap of two sets;
documents (plain texts) cut into training chunks (chunk_documents)."""

from .documents import (
    DEFAULT_CHUNK_LENGTH,
    DOCUMENT_SEPARATOR,
    chunk_documents,
    chunk_token_ids,
    documents_dataset,
    is_documents,
    load_documents,
)
from .overlap import overlapping_examples
from .prepare import TRUNCATIONS, PromptTooLongError, prepare_qa
from .prompts import (
    IGNORE_INDEX,
    PROMPT_TEMPLATES,
    PromptTemplate,
    build_prompt,
    collate_qa,
    ensure_pad_token,
    format_qa,
    get_template,
    has_chat_template,
    model_max_positions,
    resolve_template,
    template_fingerprint,
    tokenize_prompt,
    tokenize_qa,
)
from .synthetic import synthetic_tofu
from .tofu import (
    FORGET_SPLITS,
    HOLDOUT_FOR_FORGET,
    RETAIN_FOR_FORGET,
    SYNTHETIC_SOURCE,
    TOFU_CONFIGS,
    TOFU_HUB_ID,
    check_rows,
    load_tofu,
    load_tofu_rows,
    read_jsonl,
    read_qa_file,
)

__all__ = [
    "FORGET_SPLITS", "HOLDOUT_FOR_FORGET", "IGNORE_INDEX", "PROMPT_TEMPLATES", "PromptTemplate",
    "RETAIN_FOR_FORGET", "SYNTHETIC_SOURCE", "TOFU_CONFIGS", "TOFU_HUB_ID", "build_prompt", "check_rows",
    "collate_qa", "ensure_pad_token", "format_qa", "has_chat_template", "load_tofu", "load_tofu_rows",
    "overlapping_examples", "read_jsonl", "read_qa_file", "synthetic_tofu", "tokenize_qa", "get_template",
    "model_max_positions", "resolve_template", "template_fingerprint", "tokenize_prompt", "prepare_qa",
    "PromptTooLongError", "TRUNCATIONS", "DEFAULT_CHUNK_LENGTH", "DOCUMENT_SEPARATOR", "chunk_documents",
    "chunk_token_ids", "documents_dataset", "is_documents", "load_documents",
]
