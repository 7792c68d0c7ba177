"""Running one registered method: :func:`run_method` (apply it, timed) and :func:`unlearn` (apply it and save the
result into a folder), with their result type :class:`Unlearned`.

Every way in goes through these two functions: ``hf-unlearn unlearn``, the per-method scripts in
``examples/scripts`` (both through :func:`unlearn`) and the benchmark harness (through :func:`run_method`), so a
method is applied, seeded, timed and saved the same way everywhere. The method comes from the core registry
(:mod:`hf_unlearn.registry`), and this module knows it only by its spec: a trainer method runs its trainer with
its config, any other method the runner it registered; with a criterion, its spec's ``selection`` picks the
strength (:func:`run_with_selection`). Seeding and the run options (callbacks, console quietness, resuming) are
explicit arguments.

    from hf_unlearn.run import unlearn
    result = unlearn("npo", model, tokenizer, forget_rows, retain_rows, "outputs/npo", {"learning_rate": 1e-4})
    result.model          # what to evaluate; the folder holds the saved artifact and logs/npo.jsonl
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from . import registry
from .locking import _is_secondary_rank
from .result import Unlearned, num_params
from .safe_output import append_text, gated_path
from .selection import SelectionCallback, SelectionRecord

__all__ = ["JsonlLogCallback", "check_inputs", "check_rows_given", "nf4_forget_rouge", "release_training_state",
           "run_method", "run_with_selection", "runner_for", "unlearn"]

#: The seed :func:`run_method` sets (``torch.manual_seed``) before a method runs, unless told otherwise.
DEFAULT_SEED = 0


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
        append_text(self.path, line + "\n")
        if self.echo:
            print(line, flush=True)


def _as_dataset(rows: Any, columns: Sequence[str] = ()) -> Any:
    """Rows as a ``datasets.Dataset`` of their ``question``, ``answer`` and ``columns`` (``None`` where a row has
    none of a column); documents (:func:`~hf_unlearn.data.documents.as_documents`: strings, ``{"text"}`` rows, a
    file or folder) as a dataset of their ``text``; a dataset as it is."""
    import datasets

    from .data.documents import as_documents

    if isinstance(rows, datasets.Dataset):
        return rows
    documents = as_documents(rows)
    if documents is not None:
        return datasets.Dataset.from_dict({"text": list(documents)})
    extra = [c for c in columns if c not in ("question", "answer")]
    return datasets.Dataset.from_list(
        [{"question": r["question"], "answer": r["answer"], **{c: r.get(c) for c in extra}} for r in rows])


def _trainer_runner(info: registry.MethodInfo) -> Callable[..., Unlearned]:
    """The runner of a trainer method: its spec's trainer class and config (imported when it runs) and, after
    training, its ``metrics`` hook. Besides the six arguments of every runner it takes the run options
    ``callbacks`` (extra ``TrainerCallback``s), ``quiet`` (drop the Trainer's console progress bar and log
    printing), ``resume_from_checkpoint`` (passed to ``trainer.train``), ``config`` (the config built from
    the settings by the checks before work, so that it is built once) and ``peft_config`` (the trainer's
    ``peft_config=``: a LoRA adapter on the frozen base, whose disabled adapter is then the reference)."""

    def run(model, tokenizer, forget, retain, output_dir, settings, *, callbacks: Sequence[Any] = (),
            quiet: bool = False, resume_from_checkpoint: str | bool | None = None, config: Any = None,
            peft_config: Any = None) -> Unlearned:
        trainer_cls = info.load_trainer_class()
        # The settings may override the run defaults (e.g. save_strategy="steps" to checkpoint and resume); a
        # config already built from them (by the checks before work) is used as it is.
        args = config if config is not None else info.load_config_class()(
            **{"output_dir": str(output_dir), "report_to": "none", "save_strategy": "no", **settings})
        # GradAscent's objective has no retain term, but its divergence guard watches a retain set when given one
        needs_retain = getattr(trainer_cls, "needs_retain", lambda _: True)(args) or getattr(
            trainer_cls, "watches_retain", lambda _: False)(args)
        # a trainer that reads more of a forget row than its question and answer names those columns
        forget_columns = trainer_cls.forget_columns(args)
        trainer = trainer_cls(
            model=model, args=args, train_dataset=_as_dataset(forget, forget_columns),
            retain_dataset=_as_dataset(retain) if needs_retain else None,
            processing_class=tokenizer, callbacks=list(callbacks) or None,
            **({} if peft_config is None else {"peft_config": peft_config}),
        )
        if quiet:  # the console shows one line per phase; the per-step logs go to callbacks
            from transformers.trainer_callback import PrinterCallback, ProgressCallback

            trainer.remove_callback(ProgressCallback)
            trainer.remove_callback(PrinterCallback)
        trainer.train(resume_from_checkpoint=resume_from_checkpoint)
        trained = trainer.model
        trained.eval()
        run_info = trainer.training_outcome().as_info()
        trainable = sum(p.numel() for p in trained.parameters() if p.requires_grad)
        result = Unlearned(
            method="", model=trained, artifact=trained, settings=dict(settings),
            trainable_params=trainable, total_params=num_params(trained), info=run_info,
        )
        metrics = info.hook("metrics")
        if metrics is not None:  # numbers only the method can measure
            result.metrics.update(metrics(trainer, tokenizer, _as_dataset(forget), retain))
        result.info["trainer"] = trainer
        return result

    run.takes_run_options = run.takes_config = True
    return run


def runner_for(info: registry.MethodInfo) -> Callable[..., Unlearned]:
    """The runner ``run(model, tokenizer, forget, retain, output_dir, settings) -> Unlearned`` of a registered
    method: the trainer runner for a trainer method, else the registered entry point itself (a runner). A runner
    whose ``takes_run_options`` attribute is true (the trainer runner's) is also given the run options of
    :func:`run_method` as keywords (``callbacks``, ``quiet``, ``resume_from_checkpoint``)."""
    if info.is_trainer:
        return _trainer_runner(info)
    return info.load()


def run_with_selection(
    method: str,
    model: Any,
    tokenizer: Any,
    forget: Any,
    retain: Any,
    output_dir: str | os.PathLike,
    settings: Mapping[str, Any],
    criterion: Any,
    *,
    selection_steps: int = 50,
    keep: str = "memory",
    **run_options: Any,
) -> Unlearned:
    """Run ``method`` with its strength chosen by ``criterion`` (a
    :class:`~hf_unlearn.selection.SelectionCriterion`), as its spec's ``selection`` says; returns the result with
    ``info["selection"]`` (the record as a dict) and ``seconds`` the whole run (fit, search and measurements).

    * ``"best_checkpoint"`` (trainers): a :class:`~hf_unlearn.selection.SelectionCallback` joins the run's
      callbacks, measures the criterion every ``selection_steps`` optimizer steps (``keep``: where the best
      weights are kept) and restores the chosen step's weights;
    * ``"own_stop"`` (a trainer with its own stopping rule): the criterion is recorded beside it, nothing restored;
    * a selector (dotted path): ``select(run, model, tokenizer, forget, retain, output_dir, settings, criterion)``,
      where ``run`` is the plain, seeded run with these run options (an edit's exact path, a head's calibration).
    """
    info = registry.get_method(method)
    start = time.perf_counter()
    if info.selection in (registry.BEST_CHECKPOINT, registry.OWN_STOP):
        callback = SelectionCallback(criterion, selection_steps=selection_steps, keep=keep,
                                     restore=info.selection == registry.BEST_CHECKPOINT)
        options = {**run_options, "callbacks": [*run_options.get("callbacks", ()), callback]}
        result = run_method(method, model, tokenizer, forget, retain, output_dir, dict(settings), **options)
        if callback.record is None:
            raise RuntimeError(f"{method}: the selection callback did not run (no training happened).")
        result.info["selection"] = callback.record.to_dict()
    else:
        select = info.hook("selection")
        if select is None:
            raise ValueError(f"Method {method!r} has no strength selection; run it without a criterion.")

        def run(*args: Any) -> Unlearned:
            return run_method(method, *args, **run_options)

        seed = run_options.get("seed", DEFAULT_SEED)
        if seed is not None:
            import torch

            torch.manual_seed(seed)
        result = select(run, model, tokenizer, forget, retain, output_dir, dict(settings), criterion)
        result.method = method
    result.seconds = time.perf_counter() - start
    return result


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
                 settings: dict[str, Any] | None = None) -> Any:
    """What ``hf-unlearn unlearn`` refuses before any work, for the Python API (a ``ValueError`` with the same
    one-line message): bad rows (:func:`check_rows_given`), settings the method's config refuses
    (:func:`~hf_unlearn.options.validate_settings`), and, with question/answer forget and retain rows and a loaded
    model, what the method would refuse with them (:func:`~hf_unlearn.preconditions.check_run_preconditions`:
    forget/retain overlap, prompts that leave no room for an answer, settings that do not fit the model).
    Returns the method's config built from ``settings`` (``None`` for a runner without a config)."""
    from .options import UserError, validate_settings
    from .preconditions import check_run_preconditions

    qa_rows = check_rows_given(forget, "forget") & check_rows_given(retain, "retain")
    if not registry.get_method(method).config_class:
        return None  # a registered runner without a config checks its own settings
    try:
        config = validate_settings(method, dict(settings or {}), output_dir)
        if qa_rows and hasattr(model, "config") and tokenizer is not None:
            check_run_preconditions(method, config, model, tokenizer, list(forget), list(retain))
    except UserError as err:
        raise ValueError(str(err)) from None
    return config


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
    config: Any = None,
    peft_config: Any = None,
    runner: Callable[..., Unlearned] | None = None,
) -> Unlearned:
    """Run the registered method ``name`` on ``model`` with ``settings`` (fields of its config; default: the
    config's defaults), timed; returns its :class:`Unlearned` with ``seconds`` and ``method`` filled in.

    ``seed`` is set with ``torch.manual_seed`` first (``None``: left as it is). ``callbacks`` (extra
    ``TrainerCallback``s, e.g. a :class:`JsonlLogCallback`), ``quiet`` (no Trainer progress bar or log printing),
    ``resume_from_checkpoint``, ``config`` (the method's config already built from ``settings``) and
    ``peft_config`` (a ``peft.LoraConfig``: train an adapter, the base frozen) apply to the trainer methods; a
    ``peft_config`` for any other method is refused (``ValueError``). ``runner`` replaces the registry's runner (:func:`runner_for`), for a caller that keeps its
    own. Question/answer rows are checked first
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
    if peft_config is not None and not getattr(run, "takes_run_options", False):
        raise ValueError(f"{name} is not trained by a trainer; a LoRA adapter (peft_config, --use_peft) applies to "
                         "the trainer methods only.")
    if getattr(run, "takes_run_options", False):
        built = {"config": config} if getattr(run, "takes_config", False) else {}
        if peft_config is not None:
            built["peft_config"] = peft_config
        result = run(model, tokenizer, forget, retain, output_dir, settings, callbacks=tuple(callbacks), quiet=quiet,
                     resume_from_checkpoint=resume_from_checkpoint, **built)
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
    peft_config: Any = None,
) -> Unlearned:
    """Run ``method`` (:func:`run_method`) and save what it produced into ``output_dir``: the native artifact
    (:meth:`Unlearned.save_pretrained`), the tokenizer beside changed weights, and the selection record when a
    ``criterion`` chose the strength. What ``hf-unlearn unlearn`` and ``examples/scripts/<method>.py`` run.

    ``output_dir`` must be writable now (the caller checks it and, for an atomic result, passes a temporary
    folder that it swaps in). With ``log_path`` the Trainer's per-step logs go to that JSON Lines file
    (``echo_logs`` also prints them) followed by one ``trained`` record (with the device the result is on). With a ``criterion``
    (:class:`~hf_unlearn.selection.SelectionCriterion`) the method picks its own strength
    (:func:`~hf_unlearn.selection.run_with_selection`, measured every ``selection_steps`` optimizer steps for the
    trainers). ``peft_config`` (a ``peft.LoraConfig``, a trainer method only) trains a LoRA adapter on the frozen
    base. ``on_phase`` is told ``"training"`` and then ``"training (saving the result)"`` as they begin.

    Before any work, what the command line refuses is refused here too, as a ``ValueError`` with the same
    message (:func:`check_inputs`): a bad row, a setting the method's config refuses, forget rows that occur in
    the retain rows, a prompt that leaves no room for an answer token.
    """
    from .console import log_event
    from .devices import device_of

    folder = Path(output_dir)
    config = check_inputs(method, model, tokenizer, forget, retain, folder, settings)
    if on_phase is not None:
        on_phase("training")
    callbacks = [JsonlLogCallback(log_path, echo=echo_logs)] if log_path is not None else []
    options: dict[str, Any] = dict(seed=seed, callbacks=callbacks, quiet=quiet,
                                   resume_from_checkpoint=resume_from_checkpoint, config=config)
    if peft_config is not None:
        options["peft_config"] = peft_config
    if criterion is None:
        result = run_method(method, model, tokenizer, forget, retain, folder, settings, **options)
    else:
        result = run_with_selection(method, model, tokenizer, forget, retain, folder, dict(settings or {}),
                                    criterion, selection_steps=selection_steps, **options)
    if on_phase is not None:
        on_phase("training (saving the result)")
    folder = gated_path(folder)
    result.save_pretrained(folder)  # a trainer's save_model writes from the main process of a launch
    release_training_state(result)
    main = not _is_secondary_rank()  # under torchrun / accelerate launch every process shares ``folder``
    if main and result.info.get("selection"):
        SelectionRecord.from_dict(result.info["selection"]).save(folder)
    if main and result.weights_changed and result.artifact is result.model:
        tokenizer.save_pretrained(folder)
    if main and log_path is not None:
        log_event(log_path, "trained", method=method, seconds=result.seconds, settings=dict(settings or {}),
                  device=device_of(result.model))
    return result


def release_training_state(result: Unlearned) -> None:
    """Free what only the run's training needed (a trainer's optimizer states, its frozen reference model;
    ``release_training_state`` of the trainer in ``result.info["trainer"]``), before the evaluation, the NF4
    re-check and the attacks use the memory. The trainer stays, for a later ``save_pretrained``."""
    trainer = result.info.get("trainer")
    release = getattr(trainer, "release_training_state", None)
    if release is not None:
        release()


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
