"""The one run path of a registered method. On a loaded model: :func:`prepare_inputs` -> :func:`fit_or_train` ->
:func:`save`. From names (``hf-unlearn unlearn``): :func:`unlearn` runs :func:`check_request` -> :func:`load_inputs`
-> :func:`fit_or_train` -> :func:`save` -> :func:`evaluate` in a temporary folder swapped in when complete (in the
output folder itself when resuming or checkpointing, so that checkpoints outlive an interrupted run)."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from . import registry
from .locking import _is_secondary_rank
from .options import RunFailure, UserError, validate_settings
from .preconditions import (
    check_eval_configs,
    check_resume_request,
    check_retain_reference,
    check_run_preconditions,
    load_model,
    load_rows,
    rows_from_spec,
    run_request,
)
from .result import Unlearned, num_params
from .safe_output import append_text, gated_path

__all__ = [
    "EvaluationRequest", "Inputs", "JsonlLogCallback", "RunOutput", "SelectionRequest", "TrainOptions",
    "UnlearnRequest", "check_inputs", "check_request", "evaluate", "fit_or_train", "load_inputs", "nf4_forget_rouge",
    "prepare_inputs", "save", "selection_criterion", "unlearn",
]

#: The seed :func:`fit_or_train` sets (``torch.manual_seed``) before a method runs, unless told otherwise.
DEFAULT_SEED = 0


class JsonlLogCallback(TrainerCallback):
    """Append every Trainer log to a JSON Lines file (with ``step`` and ``epoch``); ``echo`` also prints it."""

    def __init__(self, path: str | os.PathLike, echo: bool = False):
        self.path = Path(path)
        self.echo = echo

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        record = {"step": state.global_step, "epoch": state.epoch, **logs}
        line = json.dumps(record, default=lambda v: v.item() if hasattr(v, "item") else str(v))
        append_text(self.path, line + "\n")
        if self.echo:
            print(line, flush=True)


# ---------------------------------------------------------------------------------------------- on a loaded model
@dataclass
class Inputs:
    """What a method runs on, checked (:func:`prepare_inputs`)."""

    method: str
    model: Any
    tokenizer: Any
    forget: Any
    retain: Any
    settings: dict[str, Any]
    config: Any
    output_dir: Path


@dataclass
class TrainOptions:
    """How a run goes, apart from the method's settings. ``seed=None`` leaves torch's seed; ``peft_config``
    trains a LoRA adapter on the frozen base; with a ``criterion`` the method picks its own strength (a trainer
    measures it every ``selection_steps`` optimizer steps, the best weights kept in ``keep``)."""

    seed: int | None = DEFAULT_SEED
    callbacks: Sequence[Any] = ()
    quiet: bool = True
    resume_from_checkpoint: str | bool | None = None
    peft_config: Any = None
    criterion: Any = None
    selection_steps: int = 50
    keep: str = "memory"


def check_rows_given(rows: Any, what: str) -> bool:
    """Check question/answer ``rows`` (list of dicts or ``datasets.Dataset``) as the CLI does (``ValueError``
    naming the first bad row); returns whether they were such rows (other inputs are left to the method)."""
    from .data import check_rows

    if hasattr(rows, "column_names"):  # a datasets.Dataset
        qa = bool({"question", "answer"} & set(rows.column_names))
    elif isinstance(rows, Sequence) and not isinstance(rows, (str, bytes)):
        qa = any(isinstance(r, Mapping) and ("question" in r or "answer" in r) for r in rows)
    else:
        qa = False
    if qa:
        check_rows(list(rows), f"the {what} rows")
    return qa


def check_inputs(method: str, model: Any, tokenizer: Any, forget: Any, retain: Any, output_dir: str | os.PathLike,
                 settings: dict[str, Any] | None = None) -> Any:
    """What ``hf-unlearn unlearn`` refuses before any work, as a ``ValueError``: bad rows, bad settings and,
    with question/answer rows and a loaded model, what the method would refuse. Returns the method's config."""
    qa_rows = check_rows_given(forget, "forget") & check_rows_given(retain, "retain")
    try:
        config = validate_settings(method, dict(settings or {}), output_dir)
        if qa_rows and hasattr(model, "config") and tokenizer is not None:
            check_run_preconditions(method, config, model, tokenizer, list(forget), list(retain))
    except UserError as err:
        raise ValueError(str(err)) from None
    return config


def prepare_inputs(method: str, model: Any, tokenizer: Any, forget: Any, retain: Any,
                   output_dir: str | os.PathLike, settings: dict[str, Any] | None = None) -> Inputs:
    """:func:`check_inputs`, then the checked :class:`Inputs` (``settings``: fields of the method's config)."""
    settings = dict(settings or {})
    config = check_inputs(method, model, tokenizer, forget, retain, output_dir, settings)
    return Inputs(method, model, tokenizer, forget, retain, settings, config, Path(output_dir))


def _as_dataset(rows: Any, columns: Sequence[str] = ()) -> Any:
    """Rows (or documents, as ``text``) as a ``datasets.Dataset``; a dataset as it is."""
    import datasets

    from .data.documents import as_documents

    if isinstance(rows, datasets.Dataset):
        return rows
    if (documents := as_documents(rows)) is not None:
        return datasets.Dataset.from_dict({"text": list(documents)})
    extra = [c for c in columns if c not in ("question", "answer")]
    return datasets.Dataset.from_list(
        [{"question": r["question"], "answer": r["answer"], **{c: r.get(c) for c in extra}} for r in rows])


def _train(trainer_cls: type, inputs: Inputs, options: TrainOptions) -> Unlearned:
    """Train with the method's trainer class; with a criterion a ``SelectionCallback`` joins the callbacks."""
    from .selection import SelectionCallback

    args = inputs.config
    callbacks = list(options.callbacks)
    selection = None
    if options.criterion is not None:
        selection = SelectionCallback(options.criterion, selection_steps=options.selection_steps, keep=options.keep,
                                      restore=not trainer_cls.stops_itself)
        callbacks.append(selection)
    # an objective without a retain term still watches a retain set with its divergence guard
    needs_retain = trainer_cls.needs_retain(args) or trainer_cls.watches_retain(args)
    trainer = trainer_cls(
        model=inputs.model, args=args, train_dataset=_as_dataset(inputs.forget, trainer_cls.forget_columns(args)),
        retain_dataset=_as_dataset(inputs.retain) if needs_retain else None,
        processing_class=inputs.tokenizer, callbacks=callbacks or None,
        **({} if options.peft_config is None else {"peft_config": options.peft_config}),
    )
    if options.quiet:  # the console shows one line per phase; the per-step logs go to callbacks
        from transformers.trainer_callback import PrinterCallback, ProgressCallback

        trainer.remove_callback(ProgressCallback)
        trainer.remove_callback(PrinterCallback)
    trainer.train(resume_from_checkpoint=options.resume_from_checkpoint)
    trained = trainer.model
    trained.eval()
    result = Unlearned(method=inputs.method, model=trained, artifact=trained, settings={},
                       trainable_params=sum(p.numel() for p in trained.parameters() if p.requires_grad),
                       total_params=num_params(trained), info=trainer.training_outcome().as_info())
    result.metrics.update(trainer.method_metrics(inputs.tokenizer, _as_dataset(inputs.forget), inputs.retain))
    if selection is not None:
        if selection.record is None:
            raise RuntimeError(f"{inputs.method}: the selection callback did not run (no training happened).")
        result.info["selection"] = selection.record.to_dict()
    result.info["trainer"] = trainer
    return result


def fit_or_train(inputs: Inputs, options: TrainOptions | None = None) -> Unlearned:
    """Run the method on ``inputs``, seeded and timed: its trainer, or its fit (``select`` with a criterion).
    ``settings`` of the result: the given ones updated with any the selection chose. A ``peft_config`` without a
    trainer, or a criterion without a selection, is refused (``ValueError``)."""
    import torch

    options = options or TrainOptions()
    info = registry.get_method(inputs.method)
    if options.peft_config is not None and not info.is_trainer:
        raise ValueError(f"{inputs.method} is not trained by a trainer; a LoRA adapter (peft_config, --use_peft) "
                         "applies to the trainer methods only.")
    if options.criterion is not None and not info.has_selection:
        raise ValueError(f"Method {inputs.method!r} has no strength selection; run it without a criterion.")
    if options.seed is not None:
        torch.manual_seed(options.seed)
    start = time.perf_counter()
    if info.is_trainer:
        result = _train(info.trainer_cls, inputs, options)
    elif options.criterion is not None:
        result = info.fit.select(inputs.model, inputs.tokenizer, inputs.forget, inputs.retain, inputs.config,
                                 options.criterion)
    else:
        result = info.fit(inputs.model, inputs.tokenizer, inputs.forget, inputs.retain, inputs.config)
    result.method = inputs.method
    result.settings = {**inputs.settings, **result.settings}
    result.seconds = time.perf_counter() - start
    return result


def save(result: Unlearned, inputs: Inputs, folder: str | os.PathLike,
         log_path: str | os.PathLike | None = None) -> None:
    """Save into ``folder``: the native artifact, the selection record, the tokenizer beside changed weights and,
    with ``log_path``, one ``trained`` log record; then release the training state."""
    from .console import log_event
    from .devices import device_of
    from .selection import SelectionRecord

    folder = gated_path(folder)
    result.save_pretrained(folder)  # a trainer's save_model writes from the main process of a launch
    if (trainer := result.info.get("trainer")) is not None:  # free the optimizer states and frozen reference
        trainer.release_training_state()
    if _is_secondary_rank():  # under torchrun / accelerate launch every process shares ``folder``
        return
    if result.info.get("selection"):
        SelectionRecord.from_dict(result.info["selection"]).save(folder)
    if result.weights_changed and result.artifact is result.model:
        inputs.tokenizer.save_pretrained(folder)
    if log_path is not None:
        log_event(log_path, "trained", method=inputs.method, seconds=result.seconds, settings=inputs.settings,
                  device=device_of(result.model))


def nf4_forget_rouge(model: Any, tokenizer: Any, forget_rows: list[dict[str, Any]],
                     eval_kwargs: dict[str, Any] | None = None) -> float:
    """Forget ROUGE-L recall of greedy answers of the NF4-quantized copy of ``model``: the mean over rows
    of ``LCS(answer, reference) / len(reference)`` in words. ``eval_kwargs``: ``batch_size``, ``max_new_tokens``."""
    from .evaluation import generate_answers, quantize_nf4, rouge_l_recall
    from .evaluation.generation import DEFAULT_MAX_NEW_TOKENS

    eval_kwargs = eval_kwargs or {}
    answers = generate_answers(quantize_nf4(model), tokenizer, [r["question"] for r in forget_rows],
                               batch_size=eval_kwargs.get("batch_size", 16),
                               max_new_tokens=eval_kwargs.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS))
    scores = rouge_l_recall(answers, [r["answer"] for r in forget_rows])
    return float(sum(scores) / len(scores))


def report_forget_rows(report: Any, source: str, forget_split: str) -> list[dict[str, Any]]:
    """The forget rows (of ``<forget_split>_perturbed``) a TOFU ``report`` scored."""
    from .data import load_tofu_rows

    return load_tofu_rows(f"{forget_split}_perturbed", source)[:report.splits["forget"]["num_examples"]]


# ---------------------------------------------------------------------------------------------- from names
@dataclass
class SelectionRequest:
    """``--select``: the strength chosen by the reference-free criterion (see the CLI options)."""

    holdout: str
    retain_validation: str | None = None
    groups: str | int = "rows"
    reference_model: str | None = None
    selection_steps: int = 50


@dataclass
class EvaluationRequest:
    """``--eval``: the TOFU report of the result, against ``retain_reference`` when given."""

    retain_reference: str | None = None
    max_new_tokens: int = 200
    nf4_check: bool = False


@dataclass
class UnlearnRequest:
    """What ``hf-unlearn unlearn`` runs: the method, the model (folder or Hub id), its settings, the
    rows (TOFU's ``forget_split`` of ``data`` and its retain complement, or rows files) and the output folder."""

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
    selection: SelectionRequest | None = None
    evaluation: EvaluationRequest | None = None

    @property
    def folder(self) -> Path:
        return Path(self.output).expanduser()

    @property
    def checkpointing(self) -> bool:
        """Whether a trainer writes checkpoints into the output folder (a save strategy)."""
        strategy = str(self.settings.get("save_strategy", "no")).lower().split(".")[-1]
        return registry.get_method(self.method).is_trainer and strategy != "no"


@dataclass
class RunOutput:
    """What :func:`unlearn` returns."""

    result: Unlearned
    tokenizer: Any
    report: Any = None


def check_request(request: UnlearnRequest) -> Any:
    """The checks before any row or model loads; returns the method's config. ``resume`` needs a trainer
    and a ``checkpoint-*`` folder; a checkpointing run needs an empty folder; the output may not overlap the inputs."""
    from .safe_output import FAILED_SUFFIX, OutputDirError, check_output_dir

    out, method = request.folder, request.method
    config = validate_settings(method, request.settings, out)
    trainer = registry.get_method(method).is_trainer
    options = request.model_options
    if options is not None and options.use_peft and not trainer:
        raise UserError(f"--use_peft trains a LoRA adapter with a trainer; {method} is not trained by one.")
    if (options is not None and options.dtype == "float16" and trainer and not options.use_peft
            and not getattr(config, "use_peft", False)):
        raise UserError(f"--dtype float16 would train {method}'s float16 weights in place, with no float32 master "
                        "weights or gradient scaling: AdamW's updates underflow. Load in --dtype float32 (add --fp16 "
                        "True for mixed precision), --dtype bfloat16, or train an adapter with --use_peft.")
    inputs = [request.model, request.data if request.data and os.path.isdir(request.data) else None,
              request.forget_file, request.retain_file]
    try:
        if request.resume:
            if not trainer:
                raise UserError(f"--resume applies to trainer methods, not {method}.")
            if not (out.is_dir() and any(p.is_dir() for p in out.glob("checkpoint-*"))):
                raise UserError(f"--resume: no checkpoint-* folder in {out} to resume from.")
            check_output_dir(out, inputs, overwrite=True)
        else:
            if request.checkpointing and request.overwrite and out.is_dir() and any(out.iterdir()):
                raise UserError(f"With save_strategy={request.settings['save_strategy']} the run writes its "
                                f"checkpoints into {out}; choose an empty folder, or --resume a run that stopped.")
            check_output_dir(out, inputs, overwrite=request.overwrite, siblings=(FAILED_SUFFIX,))
    except OutputDirError as err:
        raise UserError(str(err)) from None
    if (evaluation := request.evaluation) is not None:
        check_retain_reference(evaluation.retain_reference, request.forget_split, request.data)
        if evaluation.max_new_tokens < 1:
            raise UserError(f"--max-new-tokens must be >= 1, got {evaluation.max_new_tokens}.")
        check_eval_configs(request.data, request.forget_split)
    return config


def selection_criterion(selection: SelectionRequest, data: str, forget: list[dict[str, Any]],
                        retain: list[dict[str, Any]], template: Any = None,
                        device: str | None = None) -> tuple[Any, list[dict[str, Any]]]:
    """The ``SelectionCriterion`` of ``selection`` and the retain rows the method sees (without the
    validation rows when they are split off the retain rows)."""
    from .data.overlap import overlapping_examples
    from .selection import SelectionCriterion

    holdout = rows_from_spec(selection.holdout, data, "--holdout")
    if overlapping_examples(forget, holdout):
        raise UserError(f"--holdout {selection.holdout} shares rows with the forget set; holdout rows must be unseen.")
    if selection.retain_validation:
        validation = rows_from_spec(selection.retain_validation, data, "--retain-validation")
        if overlapping_examples(validation, retain):
            raise UserError(f"--retain-validation {selection.retain_validation} shares rows with the retain rows the "
                            "method unlearns with; pass rows it does not see (or omit it to split them off).")
    else:
        if len(retain) < 2:
            raise UserError("--select splits validation rows off the retain rows, but there is only one; pass "
                            "--retain-validation.")
        n = max(1, min(100, len(retain) // 10))
        retain, validation = retain[:-n], retain[-n:]
    reference_model = reference_tokenizer = None
    if selection.reference_model:
        reference_model, reference_tokenizer = load_model(selection.reference_model, device)
    criterion = SelectionCriterion(
        forget, holdout, validation, template=template, groups=None if selection.groups == "rows" else selection.groups,
        reference_model=reference_model, reference_tokenizer=reference_tokenizer,
    )
    return criterion, retain


def load_inputs(request: UnlearnRequest, config: Any) -> tuple[Inputs, Any]:
    """The rows, the selection criterion (or ``None``), the resume check, the memory plan (on a CUDA device,
    unless sharded: the longest row sets the sequence length), the model and what the method would refuse with it;
    returns the :class:`Inputs` and the criterion."""
    from .data import RETAIN_FOR_FORGET
    from .memory_plan import check_run_memory, device_capacity, dtype_bytes, sharded_launch

    forget = load_rows(request.forget_split, request.data, request.forget_file)
    retain = load_rows(RETAIN_FOR_FORGET[request.forget_split], request.data, request.retain_file)
    criterion = None
    if request.selection is not None:
        criterion, retain = selection_criterion(request.selection, request.data, forget, retain,
                                                request.settings.get("prompt_template"), request.device)
    if request.resume:
        check_resume_request(request.folder, run_request(request.method, config, forget, retain))
    options = request.model_options
    if device_capacity(request.device) is not None and not sharded_launch():
        from transformers import AutoConfig, AutoTokenizer

        model_config = AutoConfig.from_pretrained(request.model, trust_remote_code=False)
        texts = [r.get("text") or f"{r.get('question', '')} {r.get('answer', '')}" if isinstance(r, dict) else str(r)
                 for r in [*forget, *(retain or [])]]
        ids = AutoTokenizer.from_pretrained(request.model, trust_remote_code=False)(texts)["input_ids"]
        longest = max((len(i) for i in ids), default=1) + 32  # + the prompt template
        seq_len = min(longest, getattr(config, "max_length", None) or longest)
        weight_bytes = dtype_bytes(options.dtype if options is not None else "auto", model_config)
        check_run_memory(request.method, config, model_config, options, request.device, seq_len, weight_bytes)
    model, tokenizer = load_model(request.model, request.device, dtype=None if options is None else options.torch_dtype())
    check_run_preconditions(request.method, config, model, tokenizer, forget, retain)
    inputs = Inputs(request.method, model, tokenizer, forget, retain, dict(request.settings), config, request.folder)
    return inputs, criterion


def evaluate(result: Unlearned, inputs: Inputs, folder: Path, request: UnlearnRequest, phases: Any) -> Any:
    """``--eval``: the TOFU report, written to ``folder / "tofu_report.json"``; with ``nf4_check`` and changed
    weights also the NF4 copy's forget ROUGE-L (``extra["forget_rouge_l_nf4"]``)."""
    from .evaluation import evaluate_tofu

    evaluation = request.evaluation
    phases.start("evaluation")
    report = evaluate_tofu(
        result.model, inputs.tokenizer, source=request.data, forget_split=request.forget_split,
        retain_reference=evaluation.retain_reference, scorer=result.scorer,
        generation_kwargs=result.generation_kwargs, progress=request.verbose,
        output_path=folder / "tofu_report.json", max_new_tokens=evaluation.max_new_tokens,
        template=inputs.settings.get("prompt_template"),
    )
    phases.done()
    if evaluation.nf4_check and result.weights_changed:
        phases.start("NF4 re-check")
        rows = report_forget_rows(report, request.data, request.forget_split)
        nf4_rouge = nf4_forget_rouge(result.model, inputs.tokenizer, rows, {"max_new_tokens": evaluation.max_new_tokens})
        report.extra["forget_rouge_l_nf4"] = nf4_rouge
        phases.done(f"forget ROUGE-L {nf4_rouge:.3f}")
    return report


@dataclass
class _Phases:
    """The phase a run is in, told to a ``PhaseReporter``, and where its log is."""

    reporter: Any
    label: str
    name: str = "training"
    log: Path | None = None
    failed: bool = False

    def start(self, name: str) -> None:
        self.name = name
        self.reporter.start(self.label, name)

    def done(self, note: str = "") -> None:
        self.reporter.done(note)


def _run_in(folder: Path, request: UnlearnRequest, inputs: Inputs, options: TrainOptions, phases: _Phases) -> RunOutput:
    """Fit or train, save and evaluate in ``folder``; a failure is logged with its phase."""
    from .console import log_exception

    phases.log = log_path = folder / "logs" / f"{request.method}.jsonl"
    try:
        phases.start("training")
        inputs = dataclasses.replace(inputs, output_dir=folder,
                                     config=validate_settings(request.method, inputs.settings, folder))
        options = dataclasses.replace(options, callbacks=[JsonlLogCallback(log_path, echo=request.verbose)])
        result = fit_or_train(inputs, options)
        phases.name = "training (saving the result)"
        save(result, inputs, folder, log_path=log_path)
        phases.done(f"{result.info['global_step']} steps" if result.info.get("global_step") else "")
        report = evaluate(result, inputs, folder, request, phases) if request.evaluation is not None else None
    except Exception as err:
        log_exception(log_path, phases.name, err)
        phases.failed = True
        raise
    return RunOutput(result, inputs.tokenizer, report)


def unlearn(request: UnlearnRequest, reporter: Any = None) -> RunOutput:
    """The run of ``hf-unlearn unlearn`` (see the module docstring). A failure is written to
    ``logs/<method>.jsonl`` with its phase and the run's folder kept as ``<output>.failed``; with a ``reporter`` it is
    raised as :class:`~hf_unlearn.options.RunFailure` (one line printed), else as it was raised."""
    from .console import PhaseReporter
    from .safe_output import atomic_directory, atomic_write_json, keep_failed

    config = check_request(request)
    inputs, criterion = load_inputs(request, config)
    options = TrainOptions(resume_from_checkpoint=True if request.resume else None, criterion=criterion,
                           peft_config=None if request.model_options is None else request.model_options.peft_config(),
                           selection_steps=request.selection.selection_steps if request.selection else 50)
    say = reporter or PhaseReporter(enabled=False)
    phases = _Phases(say, request.method)
    out = request.folder
    try:
        if request.checkpointing or request.resume:  # checkpoints must outlive an interrupted run: train in place
            gated_path(out).mkdir(parents=True, exist_ok=True)
            if not request.resume and os.environ.get("RANK", "0") == "0":  # one writer under a launch
                from .methods.base.checkpoints import RUN_REQUEST_NAME

                atomic_write_json(out / "logs" / RUN_REQUEST_NAME,
                                  run_request(request.method, config, inputs.forget, inputs.retain))
            return _run_in(out, request, inputs, options, phases)
        with atomic_directory(out, overwrite=request.overwrite, all_ranks=True) as work:
            try:
                return _run_in(Path(work), request, inputs, options, phases)
            except BaseException:
                # keep the log (and anything written) to inspect, under a name nothing else has
                phases.log = keep_failed(work, out) / "logs" / f"{request.method}.jsonl"
                raise
    except Exception as err:
        if reporter is None:
            raise
        phase = phases.name if phases.failed else "its run"
        raise RunFailure(say.fail(err, phases.log, phase=phase), printed=True) from err
