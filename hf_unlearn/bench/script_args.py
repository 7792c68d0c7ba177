"""The shared plumbing of the example scripts (``examples/scripts/*.py``), as TRL ships ``trl.ScriptArguments``.

Each example script parses :class:`ScriptArguments` next to its own method config with
:class:`~transformers.HfArgumentParser`, then calls :func:`load_model_and_tokenizer` and
:func:`load_forget_retain` before running its method. The data come from a TOFU split (the Hub dataset, a
folder of ``<config>.jsonl`` files, or the built-in ``synthetic`` authors) or from the user's own JSON Lines
files of ``question``/``answer`` rows.

This module lives in ``hf_unlearn.bench`` (not the library core) because the ``tofu-tiny`` model shortcut
builds the model with :mod:`hf_unlearn.bench.subjects`, and the core never imports the benchmark harness.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hf_unlearn.data import RETAIN_FOR_FORGET, load_tofu_rows
from hf_unlearn.data.tofu import read_qa_file

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

TOFU_TINY = "tofu-tiny"  # the model shortcut: TOFU-tiny, built and cached on first use


@dataclass
class ScriptArguments:
    """Where the model and the forget/retain rows of an example script come from."""

    model_name_or_path: str = field(
        default=TOFU_TINY,
        metadata={"help": "Causal LM to unlearn from (folder or Hub id); 'tofu-tiny' builds and caches TOFU-tiny."},
    )
    dataset_name: str = field(
        default_factory=lambda: os.environ.get("HF_UNLEARN_TOFU_DIR", "").strip() or "locuslab/TOFU",
        metadata={"help": "TOFU source: Hub id, folder of <config>.jsonl, or 'synthetic' (default: "
                          "$HF_UNLEARN_TOFU_DIR when set, else locuslab/TOFU)."},
    )
    forget_split: str = field(default="forget10", metadata={"help": "TOFU forget split: forget01, forget05, forget10."})
    forget_file: str | None = field(default=None, metadata={"help": "JSON Lines of question/answer rows to forget."})
    retain_file: str | None = field(default=None, metadata={"help": "JSON Lines of question/answer rows to keep."})


def model_path(script_args: ScriptArguments) -> str:
    """The model folder or Hub id to load; ``tofu-tiny`` builds (or reuses the cached) TOFU-tiny target model
    for ``dataset_name`` and ``forget_split`` (the small recipe on the synthetic authors, the TOFU-sized one
    otherwise) and returns its folder."""
    if script_args.model_name_or_path != TOFU_TINY:
        return script_args.model_name_or_path
    from hf_unlearn.bench.subjects import build_tiny_pair, recipe_for

    size = "test" if script_args.dataset_name == "synthetic" else "tofu-test"
    return str(build_tiny_pair(script_args.dataset_name, script_args.forget_split, recipe_for(size)).target)


def load_model_and_tokenizer(source: ScriptArguments | str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The causal LM and its tokenizer, from the script arguments (resolved with :func:`model_path`) or from
    a path that :func:`model_path` already returned."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = source if isinstance(source, str) else model_path(source)
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def load_rows(file: str | None, split: str, source: str) -> list[dict[str, Any]]:
    """The rows of the JSON Lines ``file`` when given, else those of TOFU config ``split`` from ``source``; either
    way checked when loaded (an empty, null or non-string question or answer is refused, naming the row)."""
    return read_qa_file(file) if file else load_tofu_rows(split, source)


def qa_dataset(rows: list[dict[str, Any]]) -> Dataset:
    """A :class:`datasets.Dataset` of just the ``question`` and ``answer`` of each row (what the trainers take)."""
    from datasets import Dataset

    return Dataset.from_list([{"question": r["question"], "answer": r["answer"]} for r in rows])


def load_forget_retain(
    script_args: ScriptArguments, needs_retain: bool = True, as_dataset: bool = False
) -> tuple[Any, Any]:
    """The forget rows and the retain rows (``None`` unless ``needs_retain``).

    The forget rows are ``forget_file`` or TOFU's ``forget_split``; the retain rows are ``retain_file`` or the
    TOFU retain split that complements ``forget_split`` (``retain90`` for ``forget10``). Both come as lists of
    dicts, or with ``as_dataset`` as question/answer :func:`qa_dataset` datasets for the trainers.
    """
    forget = load_rows(script_args.forget_file, script_args.forget_split, script_args.dataset_name)
    retain = None
    if needs_retain:
        retain_split = RETAIN_FOR_FORGET[script_args.forget_split]
        retain = load_rows(script_args.retain_file, retain_split, script_args.dataset_name)
    if as_dataset:
        return qa_dataset(forget), None if retain is None else qa_dataset(retain)
    return forget, retain
