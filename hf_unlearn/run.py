"""Running one registered method: :func:`run_method` (apply it, timed) and :func:`unlearn` (apply it and save the
result into a folder), with their result type :class:`Unlearned`.

Every way in goes through these two functions: ``hf-unlearn unlearn``, the per-method scripts in
``examples/scripts`` (both through :func:`unlearn`) and the benchmark harness (through :func:`run_method`), so a
method is applied, seeded, timed and saved the same way everywhere. The method comes from the core registry
(:mod:`hf_unlearn.registry`): a trainer method runs its trainer with its config, GROM and T3 their fit
function, any other method the runner it registered. Seeding and the run options (callbacks, console quietness,
resuming) are explicit arguments.

    from hf_unlearn.run import unlearn
    result = unlearn("npo", model, tokenizer, forget_rows, retain_rows, "outputs/npo", {"learning_rate": 1e-4})
    result.model          # what to evaluate; the folder holds the saved artifact and logs/npo.jsonl
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from . import registry
from .locking import _is_secondary_rank

__all__ = ["JsonlLogCallback", "Unlearned", "check_inputs", "check_rows_given", "nf4_forget_rouge", "run_method",
           "runner_for", "unlearn"]

#: The seed :func:`run_method` sets (``torch.manual_seed``) before a method runs, unless told otherwise.
DEFAULT_SEED = 0


@dataclass
class Unlearned:
    """What a method produced.

    ``model`` is what the evaluator scores and generates with (for GROM the merged model, for T3
    the untouched base); ``scorer`` and ``generation_kwargs`` are set for methods that change the
    decoding distribution rather than the weights (T3). ``artifact`` is the native object that
    ``save_pretrained`` / ``push_to_hub`` handle (a model, a ``GROMEdit``, a ``T3Classifier``).
    ``metrics`` holds numbers only the method can measure (ATWU's token AUROC); the benchmark runner
    copies them into the method's result row and table.
    """

    method: str
    model: Any
    artifact: Any
    settings: dict[str, Any]
    trainable_params: int
    total_params: int
    seconds: float = 0.0
    scorer: Callable | None = None
    generation_kwargs: dict[str, Any] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    weights_changed: bool = True
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def trainable_share(self) -> float:
        return self.trainable_params / max(1, self.total_params)

    def save_pretrained(self, path: str | os.PathLike) -> None:
        """Save the native artifact; trainer methods save through ``trainer.save_model`` so that
        what they keep beside the weights (MASC's stopping record, ATWU's token scorer) is written too."""
        trainer = self.info.get("trainer")
        if trainer is not None:
            trainer.save_model(str(path))
        elif not _is_secondary_rank():  # one writer per launch
            self.artifact.save_pretrained(path)

    def push_to_hub(self, repo_id: str, report: Any = None, **kwargs: Any) -> Any:
        """Push the native artifact with its card (:func:`hf_unlearn.hub.push_unlearned`), naming this
        result's method and settings; ``kwargs`` go to ``push_unlearned``."""
        from .hub import push_unlearned

        kwargs.setdefault("method", self.method)
        kwargs.setdefault("settings", dict(self.settings))
        return push_unlearned(self.artifact, repo_id, report, **kwargs)


class JsonlLogCallback(TrainerCallback):
    """Append every Trainer log (``on_log``) to a JSON Lines file, one object per line with ``step`` and
    ``epoch``; with ``echo`` the line is also printed (``--verbose``)."""

    def __init__(self, path: str | os.PathLike, echo: bool = False):
        self.path = Path(path)
        self.echo = echo

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        record = {"step": state.global_step, "epoch": state.epoch, **logs}
        line = json.dumps(record, default=lambda v: v.item() if hasattr(v, "item") else str(v))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
        if self.echo:
            print(line, flush=True)


def _num_params(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def _as_dataset(rows: Any, columns: Sequence[str] = ()) -> Any:
    """Rows as a ``datasets.Dataset`` of their ``question``, ``answer`` and ``columns`` (``None`` where a row has
    none of a column); a dataset as it is."""
    import datasets

    if isinstance(rows, datasets.Dataset):
        return rows
    extra = [c for c in columns if c not in ("question", "answer")]
    return datasets.Dataset.from_list(
        [{"question": r["question"], "answer": r["answer"], **{c: r.get(c) for c in extra}} for r in rows])


def _trainer_runner(trainer_path: str, config_path: str) -> Callable[..., Unlearned]:
    """The runner of a trainer method: ``trainer_path`` / ``config_path`` are the dotted paths of its trainer
    class and config (imported when it runs). Besides the six arguments of every runner it takes the run options
    ``callbacks`` (extra ``TrainerCallback``s), ``quiet`` (drop the Trainer's console progress bar and log
    printing) and ``resume_from_checkpoint`` (passed to ``trainer.train``)."""

    def run(model, tokenizer, forget, retain, output_dir, settings, *, callbacks: Sequence[Any] = (),
            quiet: bool = False, resume_from_checkpoint: str | bool | None = None) -> Unlearned:
        trainer_cls = registry.resolve(trainer_path)
        config_cls = registry.resolve(config_path)
        # The settings may override the run defaults (e.g. save_strategy="steps" to checkpoint and resume).
        args = config_cls(**{"output_dir": str(output_dir), "report_to": "none", "save_strategy": "no", **settings})
        # GradAscent's objective has no retain term, but its divergence guard watches a retain set when given one
        needs_retain = getattr(trainer_cls, "needs_retain", lambda _: True)(args) or getattr(
            trainer_cls, "watches_retain", lambda _: False)(args)
        # a trainer that reads more of a forget row than its question and answer names those columns
        forget_columns = getattr(trainer_cls, "forget_columns", lambda _: ())(args)
        trainer = trainer_cls(
            model=model, args=args, train_dataset=_as_dataset(forget, forget_columns),
            retain_dataset=_as_dataset(retain) if needs_retain else None,
            processing_class=tokenizer, callbacks=list(callbacks) or None,
        )
        if quiet:  # the console shows one line per phase; the per-step logs go to callbacks
            from transformers.trainer_callback import PrinterCallback, ProgressCallback

            trainer.remove_callback(ProgressCallback)
            trainer.remove_callback(PrinterCallback)
        trainer.train(resume_from_checkpoint=resume_from_checkpoint)
        trained = trainer.model
        trained.eval()
        info: dict[str, Any] = {"global_step": trainer.state.global_step}
        for attr in ("stopped_at_step", "violation_history", "stop_reason"):
            if hasattr(trainer, attr):
                info[attr] = getattr(trainer, attr)
        trainable = sum(p.numel() for p in trained.parameters() if p.requires_grad)
        result = Unlearned(
            method="", model=trained, artifact=trained, settings=dict(settings),
            trainable_params=trainable, total_params=_num_params(trained), info=info,
        )
        if hasattr(trainer, "token_scores"):  # ATWU: how well its token scores find the forget-specific tokens
            from .methods.atwu.weighter import answer_token_ids, forget_specific_auroc

            scores = trainer.token_scores(_as_dataset(forget))
            retain_ids = answer_token_ids(tokenizer, retain, template=trainer.args.prompt_template)
            result.metrics["token_auroc"] = forget_specific_auroc(scores, retain_ids)
        result.info["trainer"] = trainer
        return result

    run.takes_run_options = True
    return run


def _run_grom(model, tokenizer, forget, retain, output_dir, settings) -> Unlearned:
    from .methods.grom import GROMConfig, fit_grom

    edit = fit_grom(model, tokenizer, forget, retain, GROMConfig(progress=False, **settings))
    total = _num_params(model)
    # The adapter's size: the LoRA factors that reproduce each P (rank <= number of forget keys).
    delta_params = sum(f.lora_A.numel() + f.lora_B.numel() for f in edit.lora_factors().values())
    merged = edit.to_peft(model).merge_and_unload()
    merged.eval()
    info = {"selected_layers": list(edit.selected_layers), "truncation_errors": edit.truncation_errors(),
            "retain_rows_read": edit.stats["num_retain_rows_read"]}
    return Unlearned(
        method="grom", model=merged, artifact=edit, settings=dict(settings),
        trainable_params=delta_params, total_params=total, info=info,
    )


def _run_t3(model, tokenizer, forget, retain, output_dir, settings) -> Unlearned:
    """Fit the head (every setting is a ``T3ClassifierConfig`` field: head, fit, and the decoding defaults
    ``temperature`` / ``tilt_weight``); evaluation scores and generates with the tilted distribution."""
    from transformers import LogitsProcessorList

    from .methods.t3 import T3ClassifierConfig, T3LogitsProcessor, fit_t3, t3_scorer

    clf = fit_t3(model, tokenizer, forget, retain, T3ClassifierConfig(**settings), progress=False)
    processor = T3LogitsProcessor(model, clf)  # the head's own decoding defaults
    model.eval()
    # fit time in two parts: cache_seconds (one forward pass of the base) and train_seconds (the head)
    info = {k: v for k, v in (getattr(clf, "fit_report", None) or {}).items() if isinstance(v, (int, float, str))}
    return Unlearned(
        method="t3", model=model, artifact=clf, settings=dict(settings),
        trainable_params=_num_params(clf), total_params=_num_params(model),
        scorer=t3_scorer(model, clf),
        generation_kwargs={"logits_processor": LogitsProcessorList([processor])},
        weights_changed=False,
        info=info,
    )


def runner_for(info: registry.MethodInfo) -> Callable[..., Unlearned]:
    """The runner ``run(model, tokenizer, forget, retain, output_dir, settings) -> Unlearned`` of a registered
    method: the trainer runner for a trainer method, GROM's / T3's runner for their fit function, else the
    registered entry point itself (a runner). A runner whose ``takes_run_options`` attribute is true (the trainer
    runner's) is also given the run options of :func:`run_method` as keywords (``callbacks``, ``quiet``,
    ``resume_from_checkpoint``)."""
    if info.is_trainer:
        return _trainer_runner(info.trainer_class, info.config_class)
    entry = info.load()
    from .methods.grom import fit_grom
    from .methods.t3 import fit_t3

    if entry is fit_grom:
        return _run_grom
    if entry is fit_t3:
        return _run_t3
    return entry


def check_rows_given(rows: Any, what: str) -> bool:
    """Question/answer ``rows`` (a list of dicts or a ``datasets.Dataset``) are checked as the command line checks
    the rows it loads (:func:`~hf_unlearn.data.check_rows`): a ``ValueError`` names the first row whose question or
    answer is missing, empty, null, not a string or not valid Unicode. Returns whether ``rows`` were such rows;
    ``None``, other iterables and rows of another kind (documents) are left to the method."""
    from .data import check_rows

    if rows is None:
        return False
    columns = getattr(rows, "column_names", None)
    if columns is not None:  # a datasets.Dataset
        if not {"question", "answer"} & set(columns):
            return False
        items = list(rows)
    elif isinstance(rows, Sequence) and not isinstance(rows, (str, bytes)):
        items = list(rows)
        if not any(isinstance(r, Mapping) and ("question" in r or "answer" in r) for r in items):
            return False
    else:
        return False
    check_rows(items, f"the {what} rows")
    return True


def check_inputs(method: str, model: Any, tokenizer: Any, forget: Any, retain: Any, output_dir: str | os.PathLike,
                 settings: dict[str, Any] | None = None) -> None:
    """What ``hf-unlearn unlearn`` refuses before any work, for the Python API (a ``ValueError`` with the same
    one-line message): bad rows (:func:`check_rows_given`), settings the method's config refuses
    (:func:`~hf_unlearn.options.validate_settings`), and, with question/answer forget and retain rows and a loaded
    model, what the method would refuse with them (:func:`~hf_unlearn.preconditions.check_run_preconditions`:
    forget/retain overlap, prompts that leave no room for an answer, settings that do not fit the model)."""
    from .options import UserError, validate_settings
    from .preconditions import check_run_preconditions

    qa_rows = check_rows_given(forget, "forget") & check_rows_given(retain, "retain")
    if not registry.get_method(method).config_class:
        return  # a registered runner without a config checks its own settings
    try:
        config = validate_settings(method, dict(settings or {}), output_dir)
        if qa_rows and hasattr(model, "config") and tokenizer is not None:
            check_run_preconditions(method, config, model, tokenizer, list(forget), list(retain))
    except UserError as err:
        raise ValueError(str(err)) from None


def run_method(
    name: str,
    model: Any,
    tokenizer: Any,
    forget: Any,
    retain: Any,
    output_dir: str | os.PathLike,
    settings: dict[str, Any] | None = None,
    *,
    seed: int | None = DEFAULT_SEED,
    callbacks: Sequence[Any] = (),
    quiet: bool = False,
    resume_from_checkpoint: str | bool | None = None,
    runner: Callable[..., Unlearned] | None = None,
) -> Unlearned:
    """Run the registered method ``name`` on ``model`` with ``settings`` (fields of its config; default: the
    config's defaults), timed; returns its :class:`Unlearned` with ``seconds`` and ``method`` filled in.

    ``seed`` is set with ``torch.manual_seed`` first (``None``: left as it is). ``callbacks`` (extra
    ``TrainerCallback``s, e.g. a :class:`JsonlLogCallback`), ``quiet`` (no Trainer progress bar or log printing)
    and ``resume_from_checkpoint`` apply to the trainer methods. ``runner`` replaces the registry's runner
    (:func:`runner_for`), for a caller that keeps its own. Question/answer rows are checked first
    (:func:`check_rows_given`: a ``ValueError`` naming the first bad row).
    """
    import torch

    run = runner or runner_for(registry.get_method(name))
    settings = dict(settings or {})
    check_rows_given(forget, "forget")
    check_rows_given(retain, "retain")
    if seed is not None:
        torch.manual_seed(seed)
    start = time.perf_counter()
    if getattr(run, "takes_run_options", False):
        result = run(model, tokenizer, forget, retain, output_dir, settings, callbacks=tuple(callbacks), quiet=quiet,
                     resume_from_checkpoint=resume_from_checkpoint)
    else:
        result = run(model, tokenizer, forget, retain, output_dir, settings)
    result.seconds = time.perf_counter() - start
    result.method = name
    return result


def unlearn(
    method: str,
    model: Any,
    tokenizer: Any,
    forget: Any,
    retain: Any,
    output_dir: str | os.PathLike,
    settings: dict[str, Any] | None = None,
    *,
    seed: int | None = DEFAULT_SEED,
    log_path: str | os.PathLike | None = None,
    echo_logs: bool = False,
    quiet: bool = True,
    resume_from_checkpoint: str | bool | None = None,
    criterion: Any = None,
    selection_steps: int = 50,
    on_phase: Callable[[str], None] | None = None,
) -> Unlearned:
    """Run ``method`` (:func:`run_method`) and save what it produced into ``output_dir``: the native artifact
    (:meth:`Unlearned.save_pretrained`), the tokenizer beside changed weights, and the selection record when a
    ``criterion`` chose the strength. What ``hf-unlearn unlearn`` and ``examples/scripts/<method>.py`` run.

    ``output_dir`` must be writable now (the caller checks it and, for an atomic result, passes a temporary
    folder that it swaps in). With ``log_path`` the Trainer's per-step logs go to that JSON Lines file
    (``echo_logs`` also prints them) followed by one ``trained`` record (with the device the result is on). With a ``criterion``
    (:class:`~hf_unlearn.selection.SelectionCriterion`) the method picks its own strength
    (:func:`~hf_unlearn.selection.run_with_selection`, measured every ``selection_steps`` optimizer steps for the
    trainers). ``on_phase`` is told ``"training"`` and then ``"training (saving the result)"`` as they begin.

    Before any work, what the command line refuses is refused here too, as a ``ValueError`` with the same
    message (:func:`check_inputs`): a bad row, a setting the method's config refuses, forget rows that occur in
    the retain rows, a prompt that leaves no room for an answer token.
    """
    from .console import log_event
    from .devices import device_of

    folder = Path(output_dir)
    check_inputs(method, model, tokenizer, forget, retain, folder, settings)
    if on_phase is not None:
        on_phase("training")
    callbacks = [JsonlLogCallback(log_path, echo=echo_logs)] if log_path is not None else []
    options: dict[str, Any] = dict(seed=seed, callbacks=callbacks, quiet=quiet,
                                   resume_from_checkpoint=resume_from_checkpoint)
    if criterion is None:
        result = run_method(method, model, tokenizer, forget, retain, folder, settings, **options)
    else:
        from .selection import run_with_selection

        result = run_with_selection(run_method, Unlearned, method, model, tokenizer, forget, retain, folder,
                                    dict(settings or {}), criterion, selection_steps=selection_steps, **options)
    if on_phase is not None:
        on_phase("training (saving the result)")
    result.save_pretrained(folder)  # a trainer's save_model writes from the main process of a launch
    main = not _is_secondary_rank()  # under torchrun / accelerate launch every process shares ``folder``
    if main and result.info.get("selection"):
        from .selection import SelectionRecord

        SelectionRecord.from_dict(result.info["selection"]).save(folder)
    if main and result.weights_changed and result.artifact is result.model:
        tokenizer.save_pretrained(folder)
    if main and log_path is not None:
        log_event(log_path, "trained", method=method, seconds=result.seconds, settings=dict(settings or {}),
                  device=device_of(result.model))
    return result


def nf4_forget_rouge(model: Any, tokenizer: Any, forget_rows: list[dict[str, Any]],
                     eval_kwargs: dict[str, Any] | None = None) -> float:
    """Forget ROUGE-L recall of greedy answers from the NF4-quantized copy of ``model``: the mean over rows of
    ``LCS(answer, reference) / len(reference)`` in words (quantization can bring forgotten answers back).
    ``eval_kwargs`` may set ``batch_size`` (16) and ``max_new_tokens``."""
    from .evaluation import generate_answers, quantize_nf4, rouge_l_recall
    from .evaluation.generation import DEFAULT_MAX_NEW_TOKENS

    eval_kwargs = eval_kwargs or {}
    quantized = quantize_nf4(model)
    answers = generate_answers(
        quantized, tokenizer, [r["question"] for r in forget_rows], batch_size=eval_kwargs.get("batch_size", 16),
        max_new_tokens=eval_kwargs.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS),
    )
    scores = rouge_l_recall(answers, [r["answer"] for r in forget_rows])
    return float(sum(scores) / len(scores))
