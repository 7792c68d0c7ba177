"""Forget/retain pairing: the rows tokenized for TRL, each forget example paired with a retain example, and the
collator that keeps the two halves of a batch apart (the retain half's keys carry the ``retain_`` prefix).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from datasets import Dataset
from transformers import TrainerCallback

from ...data import prepare_qa
from ...data.documents import DEFAULT_CHUNK_LENGTH, chunk_documents, documents_dataset, is_documents

RETAIN_PREFIX = "retain_"
MODEL_COLUMNS = ("input_ids", "labels")


def as_dataset(data: Any) -> Dataset:
    """A forget or retain set as a ``datasets.Dataset``: a path or a list of strings as documents
    (:func:`hf_unlearn.data.documents_dataset`), a list of dicts row by row."""
    if isinstance(data, Dataset):
        return data
    if isinstance(data, (str, os.PathLike)):
        return documents_dataset(data)
    rows = list(data)
    if rows and all(isinstance(r, str) for r in rows):
        return documents_dataset(rows)
    return Dataset.from_list(rows)


def to_trl_format(
    dataset: Dataset | Sequence[dict[str, Any]], tokenizer: Any, template: Any = None, max_length: int | None = None
) -> Dataset:
    """TOFU rows tokenized by :func:`hf_unlearn.data.prepare_qa` (the tokens the evaluator scores) and documents
    cut into chunks of ``max_length`` tokens (2048 when ``None``) labelled on every token; other rows pass through.
    """
    dataset = as_dataset(dataset)
    if is_documents(dataset):
        chunks = chunk_documents(dataset, tokenizer, max_length or DEFAULT_CHUNK_LENGTH)
        return Dataset.from_list([{"input_ids": f["input_ids"], "labels": f["labels"]} for f in chunks])
    columns = set(dataset.column_names)
    if not {"question", "answer"} <= columns or columns & {"prompt", "messages", "text", "input_ids"}:
        return dataset  # not TOFU rows
    rows = [
        {"input_ids": list(f["input_ids"]), "labels": list(f["labels"])}
        for f in prepare_qa(dataset, tokenizer, template=template, validate=False)
    ]
    return Dataset.from_list(rows)


def _identity_keys(dataset: Dataset) -> tuple[str, ...] | None:
    columns = set(dataset.column_names)
    for keys in (("question", "answer"), ("prompt", "completion"), ("messages",), ("text",), ("input_ids",)):
        if set(keys) <= columns:
            return keys
    return None


def retain_partner_indices(num_forget: int, num_retain: int, seed: int = 0, epoch: int = 0) -> list[int]:
    """For each forget index, the index of its retain partner in ``epoch``: a seeded permutation of the retain
    set per epoch, cycled when it is smaller than the forget set."""
    if num_forget < 1:
        raise ValueError("The forget set is empty: nothing to unlearn.")
    if num_retain < 1:
        raise ValueError("The retain set is empty: a retain example is needed for each forget example.")
    rng = random.Random(seed * 1_000_003 + epoch)
    order = list(range(num_retain))
    rng.shuffle(order)
    return [order[i % num_retain] for i in range(num_forget)]


class PairedForgetRetainDataset(torch.utils.data.Dataset):
    """Forget example ``i`` with its retain partner of the current epoch (:func:`retain_partner_indices`) under
    the ``retain_`` prefix. An epoch has ``len(forget)`` items; with ``cycle=True`` ``max(len(forget),
    len(retain))``, item ``i`` being forget example ``i mod len(forget)``.
    """

    def __init__(self, forget: Dataset, retain: Dataset, seed: int = 0, columns: Sequence[str] = MODEL_COLUMNS,
                 cycle: bool = False):
        self.forget = forget
        self.retain = retain
        self.seed = seed
        self.columns = tuple(columns)
        self.cycle = bool(cycle)
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        self.length = max(len(self.forget), len(self.retain)) if self.cycle else len(self.forget)
        self.partners = retain_partner_indices(self.length, len(self.retain), self.seed, self.epoch)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Any]:
        forget = self.forget[int(index) % len(self.forget)]
        retain = self.retain[self.partners[int(index)]]
        item = {key: forget[key] for key in self.columns}
        item.update({RETAIN_PREFIX + key: retain[key] for key in self.columns})
        return item


class PairingEpochCallback(TrainerCallback):
    """Sets the epoch of a :class:`PairedForgetRetainDataset` at the start of every epoch: the loader that skips
    a resumed epoch's trained batches does not forward ``set_epoch``."""

    def __init__(self, dataset: PairedForgetRetainDataset):
        self.dataset = dataset

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.dataset.set_epoch(int(state.epoch or 0))


@dataclass
class PairedCollator:
    """Collates forget fields with ``base`` and ``retain_``-prefixed fields separately with ``base`` again."""

    base: Callable[[list[dict[str, Any]]], dict[str, Any]]

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        forget = [{k: v for k, v in f.items() if not k.startswith(RETAIN_PREFIX)} for f in features]
        batch = dict(self.base(forget))
        if any(k.startswith(RETAIN_PREFIX) for k in features[0]):
            retain = [{k[len(RETAIN_PREFIX):]: v for k, v in f.items() if k.startswith(RETAIN_PREFIX)} for f in features]
            batch.update({RETAIN_PREFIX + k: v for k, v in self.base(retain).items()})
        return batch
