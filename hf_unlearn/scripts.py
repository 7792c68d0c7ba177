"""One run path for a method: what ``hf-unlearn unlearn`` and the per-method scripts (``examples/scripts/*.py``) run,
and the scripts' arguments, as TRL ships ``trl.ScriptArguments`` beside ``trl/scripts``.

:func:`run_unlearn` is the run: the checks made before any work (the method's settings, the output folder, the
rows, what the method would refuse with this model), then :func:`hf_unlearn.run.unlearn` into a temporary folder
that is swapped in as the output folder when complete (in place when resuming or checkpointing, so that
checkpoints outlive an interrupted run). :class:`UnlearnRun` says what to run; the command line builds one from
its options and adds its own steps (``--select``, ``--eval``) as hooks, a script builds one with
:func:`run_script`.

Each example script ``examples/scripts/<method>.py`` has ``make_parser()`` (:func:`method_parser`:
:class:`ScriptArguments`, :class:`OutputArguments` and every field of the method's config, for ``--help``) and
``main(script_args, output_args, settings)``, which runs :func:`run_script`. The method's settings are the options
given on the command line, read by :func:`hf_unlearn.options.parse_method_settings` as the command line reads them
(:func:`parse_script_args`), so ``python examples/scripts/npo.py --beta 0.2 ...`` and
``hf-unlearn unlearn --method npo --beta 0.2 ...`` write the same folder. The data come from a TOFU split (the Hub
dataset, a folder of ``<config>.jsonl`` files, or the built-in ``synthetic`` authors) or from the user's own JSON
Lines files of ``question``/``answer`` rows.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hf_unlearn.model_options import ModelOptions
from hf_unlearn.preconditions import (
    check_resume_request,
    check_run_preconditions,
    load_model,
    load_rows,
    run_request,
)

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import HfArgumentParser, PreTrainedModel, PreTrainedTokenizerBase

    from hf_unlearn.result import Unlearned

__all__ = [
    "TOFU_TINY", "OutputArguments", "RunFailure", "ScriptArguments", "UnlearnRun", "check_output", "load_forget_retain",
    "check_memory", "load_model_and_tokenizer", "method_option_names", "method_parser", "model_path", "parse_script_args", "qa_dataset", "run_script",
    "run_unlearn", "tofu_tiny_target",
]

TOFU_TINY = "tofu-tiny"  # the model shortcut: TOFU-tiny, built and cached on first use


class RunFailure(Exception):
    """A method failed during a phase: reported as one line (method, phase, log file), exit status 1.

    ``printed`` is true when the progress line already showed it (then the command line prints nothing more)."""

    def __init__(self, message: str, printed: bool = False):
        super().__init__(message)
        self.printed = printed


# ---------------------------------------------------------------------------------------------- the run
@dataclass
class UnlearnRun:
    """One run of a method: the model (a folder or Hub id), the method and its settings (fields of its config),
    the rows (TOFU's ``forget_split`` of ``data`` and the retain split that complements it, or JSON Lines files of
    question/answer rows) and the output folder; ``device`` is a resolved device name (``None``: where
    transformers loads the model); ``model_options`` (:class:`~hf_unlearn.model_options.ModelOptions`, TRL's
    ``--dtype`` / ``--use_peft`` / ``--lora_*``) the dtype the model loads in and the LoRA adapter a trainer
    trains (``None``: transformers' default dtype, no adapter)."""

    method: str
    model: str
    output: str | os.PathLike
    settings: dict[str, Any]
    data: str
    forget_split: str = "forget10"
    forget_file: str | None = None
    retain_file: str | None = None
    overwrite: bool = False
    resume: bool = False
    verbose: bool = False
    device: str | None = None
    model_options: Any = None

    @property
    def folder(self) -> Path:
        return Path(self.output).expanduser()

    @property
    def checkpointing(self) -> bool:
        """Whether the Trainer writes checkpoints into the output folder (a trainer method with a save strategy)."""
        from hf_unlearn.options import TRAINER_CLASSES

        strategy = str(self.settings.get("save_strategy", "no")).lower().split(".")[-1]
        return self.method in TRAINER_CLASSES and strategy != "no"


def check_output(run: UnlearnRun) -> Any:
    """The checks of the settings and the output folder, before any row or model loads; returns the method's
    config built from the settings (:func:`hf_unlearn.options.validate_settings`). ``resume`` needs a trainer
    method and a ``checkpoint-*`` folder in the output folder; a checkpointing run needs an empty folder; the
    output folder may not overlap the model, the data folder or the rows files."""
    from hf_unlearn.options import TRAINER_CLASSES, UserError, validate_settings
    from hf_unlearn.safe_output import FAILED_SUFFIX, OutputDirError, check_output_dir

    out = run.folder
    config = validate_settings(run.method, run.settings, out)
    options = run.model_options
    if options is not None and options.use_peft and run.method not in TRAINER_CLASSES:
        raise UserError(f"--use_peft trains a LoRA adapter with a trainer; {run.method} is not trained by one "
                        f"(trainer methods: {', '.join(TRAINER_CLASSES)}).")
    if (options is not None and options.dtype == "float16" and run.method in TRAINER_CLASSES
            and not options.use_peft and not getattr(config, "use_peft", False)):
        raise UserError(f"--dtype float16 would train {run.method}'s float16 weights in place, with no float32 "
                        "master weights or gradient scaling: AdamW's updates underflow. Load in --dtype float32 "
                        "(add --fp16 True for mixed precision), --dtype bfloat16, or train an adapter with "
                        "--use_peft.")
    inputs = [run.model, run.data if run.data and os.path.isdir(run.data) else None, run.forget_file, run.retain_file]
    try:
        if run.resume:
            if run.method not in TRAINER_CLASSES:
                raise UserError(f"--resume applies to trainer methods ({', '.join(TRAINER_CLASSES)}), not "
                                f"{run.method}.")
            if not (out.is_dir() and any(p.is_dir() for p in out.glob("checkpoint-*"))):
                raise UserError(f"--resume: no checkpoint-* folder in {out} to resume from.")
            check_output_dir(out, inputs, overwrite=True)
        else:
            if run.checkpointing and run.overwrite and out.is_dir() and any(out.iterdir()):
                raise UserError(f"With save_strategy={run.settings['save_strategy']} the run writes its checkpoints "
                                f"into {out}; choose an empty folder, or --resume a run that stopped.")
            check_output_dir(out, inputs, overwrite=run.overwrite, siblings=(FAILED_SUFFIX,))
    except OutputDirError as err:
        raise UserError(str(err)) from None
    return config


class _Phases:
    """The phase a run is in, told to a :class:`~hf_unlearn.console.PhaseReporter` (one console line each)."""

    def __init__(self, reporter: Any, label: str):
        self.reporter, self.label, self.name = reporter, label, "training"

    def start(self, name: str) -> None:
        self.name = name
        self.reporter.start(self.label, name)

    def entered(self, name: str) -> None:  # a step within the phase (no new line)
        self.name = name

    def done(self, note: str = "") -> None:
        self.reporter.done(note)


def run_unlearn(
    run: UnlearnRun,
    *,
    prepare: Callable[[list, list], tuple[Any, list]] | None = None,
    after: Callable[[Unlearned, Any, Path, _Phases], None] | None = None,
    reporter: Any = None,
    selection_steps: int = 50,
) -> Unlearned:
    """Check, then run ``run.method`` with :func:`hf_unlearn.run.unlearn` and save its result in the output folder.

    Before any work: the settings and the output folder (:func:`check_output`), the rows as they load
    (:func:`hf_unlearn.preconditions.load_rows`), ``prepare(forget, retain) -> (criterion, retain)`` (the command
    line's ``--select`` and its other checks; the criterion may be ``None``), for ``--resume`` the run's recorded
    request (:func:`~hf_unlearn.preconditions.check_resume_request`: the same method, settings and rows), the
    model (:func:`load_model`) and
    what the method would refuse with it (:func:`check_run_preconditions`). The method then runs in a temporary
    folder swapped in when complete, or in the output folder itself when resuming or checkpointing; ``after(result,
    tokenizer, folder, phases)`` runs inside it (the command line's ``--eval``). The folder holds the method's artifact, the
    tokenizer beside changed weights and ``logs/<method>.jsonl``.

    A failure is written to the log with its phase and the run's folder is kept beside the output folder
    (``<output>.failed``); with a ``reporter`` (:class:`~hf_unlearn.console.PhaseReporter`, one console line per
    phase) it is raised as :class:`RunFailure`, else as it was raised.
    """
    from hf_unlearn.console import PhaseReporter, log_exception
    from hf_unlearn.data import RETAIN_FOR_FORGET
    from hf_unlearn.run import unlearn
    from hf_unlearn.safe_output import atomic_directory, atomic_write_json, gated_path, keep_failed

    config = check_output(run)
    forget = load_rows(run.forget_split, run.data, run.forget_file)
    retain = load_rows(RETAIN_FOR_FORGET[run.forget_split], run.data, run.retain_file)
    criterion, retain = prepare(forget, retain) if prepare is not None else (None, retain)
    request = run_request(run.method, config, forget, retain) if run.checkpointing or run.resume else None
    if run.resume:
        check_resume_request(run.folder, request)
    check_memory(run, config, forget, retain)
    options = run.model_options
    model, tokenizer = load_model(run.model, run.device, dtype=None if options is None else options.torch_dtype())
    check_run_preconditions(run.method, config, model, tokenizer, forget, retain)
    peft_config = None if options is None else options.peft_config()

    say = reporter or PhaseReporter(enabled=False)
    phases = _Phases(say, run.method)
    state: dict[str, Any] = {}

    def train(work: Path) -> None:
        state["log"] = log_path = work / "logs" / f"{run.method}.jsonl"
        try:
            phases.start("training")
            result = unlearn(run.method, model, tokenizer, forget, retain, work, run.settings, log_path=log_path,
                             echo_logs=run.verbose, quiet=True, resume_from_checkpoint=True if run.resume else None,
                             criterion=criterion, selection_steps=selection_steps, on_phase=phases.entered,
                             peft_config=peft_config)
            state["result"] = result
            phases.done(f"{result.info['global_step']} steps" if result.info.get("global_step") else "")
            if after is not None:
                after(result, tokenizer, work, phases)
        except Exception as err:
            log_exception(log_path, phases.name, err)
            state["failed"] = True
            raise

    out = run.folder
    try:
        if run.checkpointing or run.resume:  # checkpoints must outlive an interrupted run: train in place
            gated_path(out).mkdir(parents=True, exist_ok=True)
            if not run.resume and os.environ.get("RANK", "0") == "0":  # one writer under a launch
                from hf_unlearn.methods.base.checkpoints import RUN_REQUEST_NAME

                atomic_write_json(out / "logs" / RUN_REQUEST_NAME, request)
            train(out)
        else:
            with atomic_directory(out, overwrite=run.overwrite, all_ranks=True) as work:
                try:
                    train(work)
                except BaseException:
                    # keep the log (and anything written) to inspect, under a name nothing else has
                    kept = keep_failed(work, out)
                    state["log"] = kept / "logs" / f"{run.method}.jsonl"
                    raise
    except Exception as err:
        if reporter is None:
            raise
        phase = phases.name if state.get("failed") else "its run"
        raise RunFailure(say.fail(err, state.get("log"), phase=phase), printed=True) from err
    return state["result"]


def check_memory(run: UnlearnRun, config: Any, forget: list, retain: list) -> None:
    """On a CUDA device, refuse before the model loads (one line) a run whose memory plan does not fit the device
    (:func:`hf_unlearn.memory_plan.check_run_memory`, from the model's config and tokenizer: the longest
    forget or retain row sets the sequence length). A sharded launch (FSDP, DeepSpeed) is not checked: the plan
    is for one process holding the whole model."""
    from hf_unlearn.memory_plan import check_run_memory, device_capacity, dtype_bytes, sharded_launch

    if device_capacity(run.device) is None or sharded_launch():
        return
    from transformers import AutoConfig, AutoTokenizer

    model_config = AutoConfig.from_pretrained(run.model, trust_remote_code=False)
    tokenizer = AutoTokenizer.from_pretrained(run.model, trust_remote_code=False)
    texts = [r.get("text") or f"{r.get('question', '')} {r.get('answer', '')}" if isinstance(r, dict) else str(r)
             for r in [*forget, *(retain or [])]]
    longest = max((len(ids) for ids in tokenizer(texts)["input_ids"]), default=1) + 32  # + the prompt template
    seq_len = min(longest, getattr(config, "max_length", None) or longest)
    dtype = run.model_options.dtype if run.model_options is not None else "auto"
    check_run_memory(run.method, config, model_config, run.model_options, run.device, seq_len,
                     weight_bytes=dtype_bytes(dtype, model_config))


# ---------------------------------------------------------------------------------------------- the scripts
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
    #: TRL's model options (``--dtype``, ``--use_peft``, ``--lora_*``) read by :func:`parse_script_args`.
    model_options: ModelOptions = field(default_factory=ModelOptions, init=False)


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

    from hf_unlearn.model_options import model_options_dataclass
    from hf_unlearn.options import method_config_class, options_dataclass

    return HfArgumentParser((ScriptArguments, OutputArguments, model_options_dataclass(method_option_names(method)),
                             options_dataclass(method_config_class(method))))


def method_option_names(method: str) -> frozenset[str]:
    """The option names of ``method``'s config: a model option of the same name (a config that trains its own
    LoRA adapter has ``use_peft``, ``lora_r``, ...) is the method's."""
    from hf_unlearn.options import method_config_class, option_fields

    return frozenset(f.name for f in option_fields(method_config_class(method)))


def parse_script_args(method: str, argv: list[str] | None = None) -> tuple[ScriptArguments, OutputArguments,
                                                                            dict[str, Any]]:
    """``(script_args, output_args, settings)`` from ``argv`` (default ``sys.argv[1:]``): the settings are the
    method options given (:func:`hf_unlearn.options.parse_method_settings`, as ``hf-unlearn unlearn`` reads
    them) and ``script_args.model_options`` TRL's model options given (``--dtype``, ``--use_peft``, ``--lora_*``;
    :func:`~hf_unlearn.model_options.parse_model_options`). ``-h`` / ``--help`` prints :func:`method_parser`'s
    help and exits."""
    from transformers import HfArgumentParser

    from hf_unlearn.model_options import parse_model_options
    from hf_unlearn.options import join_negative_values, parse_method_settings

    argv = join_negative_values(list(sys.argv[1:] if argv is None else argv))
    if "-h" in argv or "--help" in argv:
        method_parser(method).parse_args(["--help"])
    common = HfArgumentParser((ScriptArguments, OutputArguments))
    script_args, output_args, rest = common.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    if output_args.output_dir is None:
        output_args.output_dir = f"outputs/{method}"
    script_args.model_options, rest = parse_model_options(rest, method_option_names(method))
    return script_args, output_args, parse_method_settings(method, rest)


def run_script(method: str, script_args: ScriptArguments, output_args: OutputArguments,
               settings: dict[str, Any]) -> Unlearned:
    """What an example script runs: :func:`run_unlearn`, the run of ``hf-unlearn unlearn``, with the script's
    arguments (the ``tofu-tiny`` model built first, :func:`model_path`)."""
    return run_unlearn(UnlearnRun(
        method, model_path(script_args), output_args.output_dir, settings, script_args.dataset_name,
        forget_split=script_args.forget_split, forget_file=script_args.forget_file,
        retain_file=script_args.retain_file, overwrite=output_args.overwrite, resume=output_args.resume,
        verbose=output_args.verbose, model_options=script_args.model_options,
    ))


def tofu_tiny_target(source: str, forget_split: str) -> str:
    """The folder of the TOFU-tiny target model for ``source`` and ``forget_split``, built (or reused from the
    cache) by :mod:`hf_unlearn.demo`: the small recipe on the synthetic authors, the TOFU-sized one otherwise."""
    from .demo import build_tiny_pair, recipe_for

    size = "test" if source == "synthetic" else "tofu-test"
    return str(build_tiny_pair(source, forget_split, recipe_for(size)).target)


def model_path(script_args: ScriptArguments) -> str:
    """The model folder or Hub id to load; ``tofu-tiny`` is the TOFU-tiny target model for ``dataset_name`` and
    ``forget_split`` (:func:`tofu_tiny_target`)."""
    if script_args.model_name_or_path != TOFU_TINY:
        return script_args.model_name_or_path
    return tofu_tiny_target(script_args.dataset_name, script_args.forget_split)


def load_model_and_tokenizer(source: ScriptArguments | str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The causal LM and its tokenizer, from the script arguments (resolved with :func:`model_path`) or from
    a path that :func:`model_path` already returned, checked as ``hf-unlearn unlearn`` checks them
    (:func:`hf_unlearn.preconditions.load_model`: a ``UserError`` line for a missing path, damaged or pickle-only
    weights, weights that do not fit the config, NaN weights)."""
    path = source if isinstance(source, str) else model_path(source)
    return load_model(path)


def qa_dataset(rows: list[dict[str, Any]]) -> Dataset:
    """A :class:`datasets.Dataset` of just the ``question`` and ``answer`` of each row (what the trainers take)."""
    from datasets import Dataset

    return Dataset.from_list([{"question": r["question"], "answer": r["answer"]} for r in rows])


def load_forget_retain(
    script_args: ScriptArguments, needs_retain: bool = True, as_dataset: bool = False
) -> tuple[Any, Any]:
    """The forget rows and the retain rows (``None`` unless ``needs_retain``), checked as they load
    (:func:`hf_unlearn.preconditions.load_rows`).

    The forget rows are ``forget_file`` or TOFU's ``forget_split``; the retain rows are ``retain_file`` or the
    TOFU retain split that complements ``forget_split`` (``retain90`` for ``forget10``). Both come as lists of
    dicts, or with ``as_dataset`` as question/answer :func:`qa_dataset` datasets for the trainers.
    """
    from hf_unlearn.data import RETAIN_FOR_FORGET

    forget = load_rows(script_args.forget_split, script_args.dataset_name, script_args.forget_file)
    retain = None
    if needs_retain:
        retain_split = RETAIN_FOR_FORGET[script_args.forget_split]
        retain = load_rows(retain_split, script_args.dataset_name, script_args.retain_file)
    if as_dataset:
        return qa_dataset(forget), None if retain is None else qa_dataset(retain)
    return forget, retain

