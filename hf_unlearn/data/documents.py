"""Documents as training data (a deletion request is often articles, a book, posts): :func:`load_documents` reads
plain texts; :func:`chunk_documents` joins them with a blank line, tokenizes once and cuts consecutive chunks of
``max_length`` tokens (a BOS token first when the tokenizer adds one), labels equal to the input ids, as
open-unlearning's ``PretrainingDataset`` does."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .prompts import IGNORE_INDEX, ensure_pad_token
from .strict_json import parse_json, refuse_byte_order_mark

DOCUMENT_SEPARATOR = "\n\n"  # open-unlearning's PretrainingDataset joins the raw texts with a blank line
DEFAULT_CHUNK_LENGTH = 2048  # open-unlearning's MUSE max_length
DOCUMENT_FILE_SUFFIXES = (".txt", ".json", ".jsonl")
# Columns that make a dataset rows of another kind (question/answer, TRL prompt/completion or chat, tokenized).
_NOT_DOCUMENT_COLUMNS = frozenset({"question", "answer", "prompt", "completion", "messages", "input_ids"})


def _texts_from_items(items: Iterable[Any], text_key: str, origin: str,
                      item_names: Sequence[str] | None = None) -> list[str]:
    """The texts of ``items`` (strings, or mappings with ``text_key``); a ``ValueError`` names ``origin`` and the
    item (``item_names[i]``, else ``item i``) that is no text, or an empty or whitespace-only one."""
    out = []
    for i, item in enumerate(items):
        name = item_names[i] if item_names is not None else f"item {i}"
        if isinstance(item, Mapping):
            if text_key not in item:
                raise ValueError(f"{origin}: {name} has no {text_key!r} field (fields: {sorted(map(str, item))}).")
            item = item[text_key]
        if not isinstance(item, str):
            raise ValueError(f"{origin}: {name} is a {type(item).__name__}, not a text.")
        if not item.strip():
            raise ValueError(f"{origin}: {name} is an empty or whitespace-only document, so there is nothing in it to "
                             "unlearn or keep; remove it or give it its text.")
        out.append(item)
    return out


def _read_file(path: Path, text_key: str) -> list[str]:
    """The documents of one file (see :func:`load_documents`): JSON read by
    :func:`~hf_unlearn.data.strict_json.parse_json`, a UTF-8 byte-order mark refused in every kind."""
    suffix = path.suffix.lower()
    if suffix not in DOCUMENT_FILE_SUFFIXES:
        raise ValueError(f"{path}: documents are read from {', '.join(DOCUMENT_FILE_SUFFIXES)} files, not {suffix!r}.")
    text = path.read_text(encoding="utf-8")
    refuse_byte_order_mark(text, str(path))
    if suffix == ".txt":
        return _texts_from_items([text], text_key, str(path), ["the file"])
    if suffix == ".jsonl":
        numbered = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
        items = [parse_json(line, f"{path}: line {n}") for n, line in numbered]
        return _texts_from_items(items, text_key, str(path), [f"line {n}" for n, _ in numbered])
    data = parse_json(text, str(path))
    if isinstance(data, (str, Mapping)):
        data = [data]
    return _texts_from_items(data, text_key, str(path))


def load_documents(source: Any, *, text_key: str = "text") -> list[str]:
    """The documents of ``source`` as a list of strings, in order: a list of strings (or dicts with ``text_key``),
    a ``datasets.Dataset`` column, a ``.txt`` file (one document), a ``.jsonl`` file (one a line), a ``.json`` file
    (a list), or a folder of such files (name order). ``ValueError``: an empty source or document, a non-text item,
    another file kind, a link in a folder, a byte-order mark, a repeated JSON key, a plain string that is no path;
    ``FileNotFoundError``: a missing path."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source).expanduser()
        if isinstance(source, str) and not path.exists() and (len(source) > 255 or "\n" in source):
            raise ValueError("load_documents got a plain text; pass a list of documents ([text]) or a file path.")
        if not path.exists():
            raise FileNotFoundError(f"No documents at {path}.")
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in DOCUMENT_FILE_SUFFIXES) if path.is_dir() else [path]
        for file in files:  # a link may lead anywhere, a system file say, which would then be unlearned or kept
            if path.is_dir() and file.is_symlink():
                raise ValueError(f"{file} is a symbolic link (to {os.readlink(file)}); documents are read from the "
                                 "folder's own files only: copy the file into the folder instead.")
        docs = [d for f in files for d in _read_file(f, text_key)]
        origin = str(path)
    else:
        column_names = getattr(source, "column_names", None)
        if column_names is not None:
            if text_key not in column_names:
                raise ValueError(f"The dataset has no {text_key!r} column (columns: {list(column_names)}).")
            source = source[text_key]
        docs = _texts_from_items(source, text_key, "documents")
        origin = "the documents"
    if not docs:
        raise ValueError(f"{origin} hold no document.")
    return docs


def documents_dataset(source: Any, *, text_key: str = "text") -> Any:
    """A ``datasets.Dataset`` with one ``text`` column, one row per document of ``source``
    (:func:`load_documents`): what the unlearning trainers take as a documents forget or retain set."""
    from datasets import Dataset

    return Dataset.from_dict({"text": load_documents(source, text_key=text_key)})


def is_documents(dataset: Any) -> bool:
    """Whether ``dataset`` (a ``datasets.Dataset``) holds documents: a ``text`` column and none of the columns of
    question/answer, prompt/completion, chat or tokenized rows."""
    columns = set(getattr(dataset, "column_names", None) or ())
    return "text" in columns and not columns & _NOT_DOCUMENT_COLUMNS


def chunk_token_ids(token_ids: Sequence[int], max_length: int, prefix: Sequence[int] = ()) -> list[list[int]]:
    """Consecutive chunks of ``token_ids``, each ``prefix`` followed by at most ``max_length - len(prefix)`` ids:

        chunk_i = prefix + token_ids[i * s : (i + 1) * s],   s = max_length - len(prefix),   i = 0 .. ceil(n / s) - 1

    so every chunk has at most ``max_length`` ids and every id is in exactly one chunk, in order. A last chunk of
    a single token (nothing to predict without a prefix) is left out.
    """
    step = max_length - len(prefix)
    if step < 1:
        raise ValueError(f"max_length={max_length} leaves no room for a token after the {len(prefix)}-token prefix.")
    ids = list(token_ids)
    chunks = [list(prefix) + ids[i : i + step] for i in range(0, len(ids), step)]
    if chunks and len(chunks[-1]) < 2:
        chunks.pop()
    return chunks


def bos_prefix(tokenizer: Any) -> list[int]:
    """``[bos_token_id]`` when the tokenizer starts an encoded text with its BOS token, else ``[]``."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return []
    ids = tokenizer("a", add_special_tokens=True)["input_ids"]
    return [bos] if ids[:1] == [bos] else []


def chunk_documents(
    documents: Any, tokenizer: Any, max_length: int = DEFAULT_CHUNK_LENGTH, *,
    separator: str = DOCUMENT_SEPARATOR, padding: bool = False, text_key: str = "text",
) -> list[dict[str, list[int]]]:
    """``{"input_ids", "attention_mask", "labels"}`` features (``labels == input_ids``) of ``documents`` joined
    with ``separator``, tokenized once and cut by :func:`chunk_token_ids` (BOS first when the tokenizer adds one);
    ``padding=True`` right-pads each to ``max_length`` (label ``-100``)."""
    if not isinstance(max_length, int) or max_length < 2:
        raise ValueError(f"max_length must be an integer >= 2, got {max_length!r}.")
    docs = load_documents(documents, text_key=text_key)
    ids = tokenizer(separator.join(docs), add_special_tokens=False, verbose=False)["input_ids"]
    chunks = chunk_token_ids(ids, max_length, bos_prefix(tokenizer))
    if padding:
        ensure_pad_token(tokenizer)
    features = []
    for chunk in chunks:
        pad = max_length - len(chunk) if padding else 0
        features.append({
            "input_ids": chunk + [tokenizer.pad_token_id] * pad,
            "attention_mask": [1] * len(chunk) + [0] * pad, "labels": list(chunk) + [IGNORE_INDEX] * pad,
        })
    return features


def as_documents(data: Any, *, plain_lists: bool = True) -> list[str] | None:
    """The documents of ``data`` when it is a documents set (an existing path, a dataset :func:`is_documents`
    accepts, ``{"text"}`` dicts, or with ``plain_lists`` a list of strings), else ``None``."""
    if data is None:
        return None
    if isinstance(data, (str, os.PathLike)):
        exists = len(str(data)) < 4096 and "\n" not in str(data) and Path(data).expanduser().exists()
        return load_documents(data) if exists else None
    if getattr(data, "column_names", None) is not None:
        return load_documents(data) if is_documents(data) else None
    if isinstance(data, Mapping) or not isinstance(data, Sequence) or not data:
        return None
    if plain_lists and all(isinstance(d, str) for d in data):
        return list(data)
    if all(isinstance(d, Mapping) and set(d) == {"text"} for d in data):
        return load_documents(data)
    return None


def chunk_length(max_length: int | None, limit: int | None) -> int:
    """The chunk length for documents: ``min(max_length, limit)`` of those given (the model's maximum
    positions ``limit`` always applies), :data:`DEFAULT_CHUNK_LENGTH` when neither is."""
    bounds = [int(v) for v in (max_length, limit) if v is not None]
    return min(bounds) if bounds else DEFAULT_CHUNK_LENGTH


def is_document_rows(rows: Sequence[Mapping[str, Any]] | None) -> bool:
    """Whether ``rows`` are documents as ``{"text"}`` rows (what :func:`as_documents` gives, one row each)."""
    return bool(rows) and "text" in rows[0]


def shared_documents(forget: Sequence[str], retain: Sequence[str]) -> int:
    """Number of ``forget`` documents that also occur (same text, surrounding whitespace ignored) in ``retain``."""
    seen = {d.strip() for d in retain}
    return sum(d.strip() in seen for d in forget)


def document_heads(documents: Sequence[str], tokenizer: Any, max_length: int) -> tuple[list[dict[str, list[int]]], int]:
    """Each document on its own as one example: its tokens (a BOS token first when the tokenizer adds one) cut
    to the first ``max_length``, labels on every token. Returns ``(features, number of documents cut)``; what
    scoring one figure per document uses (as MUSE scores each privleak text from its beginning)."""
    if not isinstance(max_length, int) or max_length < 2:
        raise ValueError(f"max_length must be an integer >= 2, got {max_length!r}.")
    prefix = bos_prefix(tokenizer)
    features, cut = [], 0
    for doc in documents:
        ids = prefix + tokenizer(doc, add_special_tokens=False, verbose=False)["input_ids"]
        cut += len(ids) > max_length
        ids = ids[:max_length]
        features.append({"input_ids": ids, "attention_mask": [1] * len(ids), "labels": list(ids)})
    return features, cut
