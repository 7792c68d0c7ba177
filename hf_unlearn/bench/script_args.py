"""The shared plumbing of the example scripts (``examples/scripts/*.py``), as TRL ships ``trl.ScriptArguments``.

Each example script ``examples/scripts/<method>.py`` has ``make_parser()`` (:func:`method_parser`:
:class:`ScriptArguments`, :class:`OutputArguments` and every field of the method's config, for ``--help``) and
``main(script_args, output_args, settings)``, which runs :func:`run_script`: the checks of ``hf-unlearn unlearn``
(:mod:`hf_unlearn.options`, :mod:`hf_unlearn.preconditions`), then :func:`hf_unlearn.run.unlearn`, the function
the command line's ``unlearn`` runs, into a folder that is swapped in when complete. The method's settings are
the options given on the command line, read by :func:`hf_unlearn.options.parse_method_settings` as the command
line reads them (:func:`parse_script_args`), so ``python examples/scripts/npo.py --beta 0.2 ...`` and
``hf-unlearn unlearn --method npo --beta 0.2 ...`` write the same folder. The data come from a TOFU split (the
Hub dataset, a folder of ``<config>.jsonl`` files, or the built-in ``synthetic`` authors) or from the user's own
JSON Lines files of ``question``/``answer`` rows.

This module lives in ``hf_unlearn.bench`` (not the library core) because the ``tofu-tiny`` model shortcut
builds the model with :mod:`hf_unlearn.bench.subjects`, and the core never imports the benchmark harness.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hf_unlearn.data import RETAIN_FOR_FORGET, load_tofu_rows
from hf_unlearn.data.tofu import read_qa_file

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import HfArgumentParser, PreTrainedModel, PreTrainedTokenizerBase

    from hf_unlearn.run import Unlearned

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


@dataclass
class OutputArguments:
    """Where an example script writes its result, as ``hf-unlearn unlearn``'s ``--output`` / ``--overwrite`` /
    ``--resume`` / ``--verbose``."""

    output_dir: str | None = field(
        default=None, metadata={"help": "Folder for the result (refused if not empty; default: outputs/<method>)."})
    overwrite: bool = field(default=False, metadata={"help": "Replace a non-empty output folder (swapped in when done)."})
    resume: bool = field(default=False, metadata={
        "help": "Trainer methods: resume from the latest checkpoint-* in output_dir (a run with save_strategy=steps)."})
    verbose: bool = field(default=False, metadata={"help": "Also print the per-step training logs."})


def method_parser(method: str) -> HfArgumentParser:
    """The parser of ``examples/scripts/<method>.py``: :class:`ScriptArguments`, :class:`OutputArguments` and one
    option per field of the method's config (:func:`hf_unlearn.options.options_dataclass`); its ``--help`` lists
    them all."""
    from transformers import HfArgumentParser

    from hf_unlearn.options import method_config_class, options_dataclass

    return HfArgumentParser((ScriptArguments, OutputArguments, options_dataclass(method_config_class(method))))


def parse_script_args(method: str, argv: list[str] | None = None) -> tuple[ScriptArguments, OutputArguments,
                                                                            dict[str, Any]]:
    """``(script_args, output_args, settings)`` from ``argv`` (default ``sys.argv[1:]``): the settings are the
    method options given (:func:`hf_unlearn.options.parse_method_settings`, as ``hf-unlearn unlearn`` reads
    them). ``-h`` / ``--help`` prints :func:`method_parser`'s help and exits."""
    from transformers import HfArgumentParser

    from hf_unlearn.options import join_negative_values, parse_method_settings

    argv = join_negative_values(list(sys.argv[1:] if argv is None else argv))
    if "-h" in argv or "--help" in argv:
        method_parser(method).parse_args(["--help"])
    common = HfArgumentParser((ScriptArguments, OutputArguments))
    script_args, output_args, rest = common.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    if output_args.output_dir is None:
        output_args.output_dir = f"outputs/{method}"
    return script_args, output_args, parse_method_settings(method, rest)


def run_script(method: str, script_args: ScriptArguments, output_args: OutputArguments,
               settings: dict[str, Any]) -> Unlearned:
    """What an example script runs: the checks ``hf-unlearn unlearn`` makes before any work (settings, output
    folder, rows, what the method would refuse with this model), then :func:`hf_unlearn.run.unlearn` into a
    temporary folder swapped in as ``output_dir`` when complete (in place when resuming or checkpointing, so that
    checkpoints outlive an interrupted run). The folder holds the method's artifact, the tokenizer beside changed
    weights and ``logs/<method>.jsonl``."""
    from hf_unlearn.options import TRAINER_CLASSES, UserError, validate_settings
    from hf_unlearn.preconditions import check_run_preconditions
    from hf_unlearn.run import unlearn
    from hf_unlearn.safe_output import atomic_directory, check_output_dir

    out = Path(output_args.output_dir).expanduser()
    config = validate_settings(method, settings, out)
    checkpointing = method in TRAINER_CLASSES and str(settings.get("save_strategy", "no")).lower().split(".")[-1] != "no"
    path = model_path(script_args)
    inputs = [path, script_args.forget_file, script_args.retain_file]
    if output_args.resume:
        if method not in TRAINER_CLASSES:
            raise UserError(f"--resume applies to trainer methods ({', '.join(TRAINER_CLASSES)}), not {method}.")
        check_output_dir(out, inputs, overwrite=True)
    else:
        check_output_dir(out, inputs, overwrite=output_args.overwrite)
    model, tokenizer = load_model_and_tokenizer(path)
    forget, retain = load_forget_retain(script_args)
    check_run_preconditions(method, config, model, tokenizer, forget, retain)
    options: dict[str, Any] = dict(echo_logs=output_args.verbose, resume_from_checkpoint=True if output_args.resume else None)
    if checkpointing or output_args.resume:
        out.mkdir(parents=True, exist_ok=True)
        return unlearn(method, model, tokenizer, forget, retain, out, settings,
                       log_path=out / "logs" / f"{method}.jsonl", **options)
    with atomic_directory(out, overwrite=output_args.overwrite, all_ranks=True) as work:
        return unlearn(method, model, tokenizer, forget, retain, work, settings,
                       log_path=work / "logs" / f"{method}.jsonl", **options)


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
    a path that :func:`model_path` already returned, checked as ``hf-unlearn unlearn`` checks them
    (:func:`hf_unlearn.preconditions.load_model`: a ``UserError`` line for a missing path, damaged or pickle-only
    weights, weights that do not fit the config, NaN weights)."""
    from hf_unlearn.preconditions import load_model

    path = source if isinstance(source, str) else model_path(source)
    return load_model(path)


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
