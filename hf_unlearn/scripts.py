"""The example scripts' arguments and loaders, as TRL ships ``trl.ScriptArguments`` beside ``trl/scripts``: where the
model and the forget/retain rows come from, loaded with the command line's checks."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hf_unlearn.preconditions import load_model, load_rows

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


__all__ = [
    "TOFU_TINY", "ScriptArguments", "check_output_folder", "load_forget_retain", "load_model_and_tokenizer",
    "method_option_names", "model_path", "qa_dataset", "tofu_tiny_target",
]

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
    forget_file: str | None = field(default=None, metadata={
        "help": "What to forget: JSON Lines of question/answer rows, or documents (a .txt file, a folder of them, "
                "JSON Lines of texts)."})
    retain_file: str | None = field(default=None, metadata={
        "help": "What to keep: question/answer rows or documents, as --forget_file."})


def method_option_names(method: str) -> frozenset[str]:
    """The option names of ``method``'s config (a model option of the same name is the method's)."""
    from hf_unlearn.options import method_config_class, option_fields

    return frozenset(f.name for f in option_fields(method_config_class(method)))


def tofu_tiny_target(source: str, forget_split: str) -> str:
    """The folder of the TOFU-tiny target for ``source`` and ``forget_split``, built or reused from the cache."""
    from .demo import build_tiny_pair, recipe_for

    size = "test" if source == "synthetic" else "tofu-test"
    return str(build_tiny_pair(source, forget_split, recipe_for(size)).target)


def model_path(script_args: ScriptArguments) -> str:
    """The model folder or Hub id to load (``tofu-tiny``: :func:`tofu_tiny_target`)."""
    if script_args.model_name_or_path != TOFU_TINY:
        return script_args.model_name_or_path
    return tofu_tiny_target(script_args.dataset_name, script_args.forget_split)


def load_model_and_tokenizer(source: ScriptArguments | str, dtype: Any = None
                             ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The causal LM (in ``dtype``) and its tokenizer, checked as ``hf-unlearn unlearn`` checks them."""
    path = source if isinstance(source, str) else model_path(source)
    return load_model(path, dtype=dtype)


def check_output_folder(output_dir: str | os.PathLike, script_args: ScriptArguments, overwrite: bool = False) -> Path:
    """Refuse, before any model loads, an output folder the run must not write; returns it absolute."""
    from .safe_output import check_output_dir

    model = script_args.model_name_or_path
    return check_output_dir(output_dir, [model] if os.path.isdir(model) else [], overwrite=overwrite)


def qa_dataset(rows: list[dict[str, Any]]) -> Dataset:
    """A ``datasets.Dataset`` of the ``question`` and ``answer`` of each row."""
    from datasets import Dataset

    return Dataset.from_list([{"question": r["question"], "answer": r["answer"]} for r in rows])


def load_forget_retain(
    script_args: ScriptArguments, needs_retain: bool = True, as_dataset: bool = False
) -> tuple[Any, Any]:
    """The forget rows and the retain rows (``None`` unless ``needs_retain``), checked as they load: files
    or TOFU's ``forget_split`` and its retain complement; with ``as_dataset`` as :func:`qa_dataset` datasets."""
    from hf_unlearn.data import RETAIN_FOR_FORGET

    forget = load_rows(script_args.forget_split, script_args.dataset_name, script_args.forget_file)
    retain = load_rows(RETAIN_FOR_FORGET[script_args.forget_split], script_args.dataset_name,
                       script_args.retain_file) if needs_retain else None
    if as_dataset:
        return qa_dataset(forget), None if retain is None else qa_dataset(retain)
    return forget, retain

