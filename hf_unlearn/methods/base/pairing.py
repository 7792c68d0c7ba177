"""Forget/retain pairing: TOFU rows tokenized for TRL and documents cut into chunks, each forget example paired with a
retain example, and the collator that keeps the two halves of a batch apart (the retain half's keys carry the
``retain_`` prefix).
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

__all__ = ["MODEL_COLUMNS", "RETAIN_PREFIX", "PairedCollator", "PairedForgetRetainDataset", "PairingEpochCallback",
           "as_dataset", "retain_partner_indices", "to_trl_format"]


def _is_tofu_rows(dataset: Dataset) -> bool:
    columns = set(dataset.column_names)
    return {"question", "answer"} <= columns and not columns & {"prompt", "messages", "text", "input_ids"}


def as_dataset(data: Any) -> Dataset:
    """A forget or retain set as a ``datasets.Dataset``: a dataset as is; a path (a ``.txt``/``.json``/``.jsonl``
    file or a folder of them) or a list of strings as a documents dataset (one ``text`` column,
    :func:`hf_unlearn.data.documents_dataset`); a list of dicts row by row."""
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
    """TOFU-shaped rows (``question``/``answer``) and documents tokenized for TRL; other formats pass through.

    Each TOFU row becomes ``{"input_ids", "labels"}`` from :func:`hf_unlearn.data.prepare_qa` with ``template``
    (a preset name, a :class:`~hf_unlearn.data.PromptTemplate` or ``None`` for the default: the tokenizer's chat
    template when it has one, else ``"Question: {question}\\nAnswer:"``), so the tokens and the answer-only labels
    are exactly the ones the evaluator scores. Documents (a ``text`` column and no other kind of row's columns,
    :func:`hf_unlearn.data.is_documents`; anything :func:`as_dataset` reads) are joined with a blank line and cut
    into chunks of ``max_length`` tokens (2048 when ``None``) with labels on every token
    (:func:`hf_unlearn.data.chunk_documents`). TRL keeps pre-tokenized rows as they are (it only truncates them to
    ``max_length``). TRL prompt/completion and conversational rows pass through unchanged.
    """
    dataset = as_dataset(dataset)
    if is_documents(dataset):
        chunks = chunk_documents(dataset, tokenizer, max_length or DEFAULT_CHUNK_LENGTH)
        return Dataset.from_list([{"input_ids": f["input_ids"], "labels": f["labels"]} for f in chunks])
    if not _is_tofu_rows(dataset):
        return dataset
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
    """For each forget index, the index of the retain example paired with it in ``epoch``.

    Retain examples are drawn without replacement from a seeded permutation (cycled when the
    retain set is smaller than the forget set), and a new permutation is drawn each epoch, so over
    epochs the forget set meets all of the retain set.
    """
    if num_forget < 1:
        raise ValueError("The forget set is empty: nothing to unlearn.")
    if num_retain < 1:
        raise ValueError("The retain set is empty: a retain example is needed for each forget example.")
    rng = random.Random(seed * 1_000_003 + epoch)
    order = list(range(num_retain))
    rng.shuffle(order)
    return [order[i % num_retain] for i in range(num_forget)]

class PairedForgetRetainDataset(torch.utils.data.Dataset):
    """Forget example ``i`` together with its retain partner for the current epoch.

    Item ``i`` holds the forget fields (``input_ids``, ``labels``) and the partner's fields prefixed with
    ``retain_``. Partners come from :func:`retain_partner_indices` (seeded, redrawn each epoch
    through :meth:`set_epoch`, which :class:`PairingEpochCallback` calls at the start of every epoch, a resumed
    one included), so a forget example meets the same retain example in every process and every run with the
    same seed.

    An epoch has ``len(forget)`` items; with ``cycle=True`` it has ``max(len(forget), len(retain))`` and item
    ``i`` is forget example ``i mod len(forget)``, so that one epoch cycles the smaller set over the larger one
    (MASC's ``epoch_length="max(forget,retain)"``, the authors' loop); with a shuffled sampler every forget
    example then occurs ``floor`` or ``ceil`` of ``length / len(forget)`` times per epoch.
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
    """Sets the epoch of a :class:`PairedForgetRetainDataset` at the start of every epoch.

    The Trainer's dataloader forwards ``set_epoch`` to its dataset, but the loader it builds to skip the batches
    already trained in a resumed epoch (``skip_first_batches``) does not, so a run resumed mid-epoch would draw
    the rest of that epoch with epoch 0's partners. ``state.epoch`` is ``e + k / steps_in_epoch`` after the
    ``k``-th batch of epoch ``e`` (restored from the checkpoint on resume), so its integer part is the epoch the
    loop enters.
    """

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
