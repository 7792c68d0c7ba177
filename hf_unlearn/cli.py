"""The `hf-unlearn` command line: `demo`, `unlearn`, `eval`, `bench` and `tiny`.

Console: one progress line per method and phase (training, evaluation, NF4 re-check), then the table. The
Trainer's per-step logs go to ``<output>/logs/<method>.jsonl`` (``--verbose`` also prints them).
Third-party chatter a user cannot act on (library log messages, progress bars, deprecation notices raised
inside transformers/TRL/PEFT/bitsandbytes) is silenced here, in the CLI only: importing ``hf_unlearn``
changes no global logging or warning state.

`unlearn` takes the method's own config fields as options, generated from its config dataclass with
:class:`transformers.HfArgumentParser` (``hf-unlearn unlearn --method masc --help`` lists every field).

``--data`` (``unlearn``, ``eval``, ``tiny``, ``bench``) defaults to the folder in ``$HF_UNLEARN_TOFU_DIR`` when
set, else the Hub dataset ``locuslab/TOFU``.

Bad input ends with one ``hf-unlearn: error: ...`` line and exit status 2, before any training step and before
any output folder is created: an unknown method or option, a value of the wrong type or one the method's config
refuses (for the trainers: a learning rate that is not a finite number > 0, zero or negative epochs,
``--max_steps 0``, a batch size below 1, ``--max_length`` below 2, any NaN or infinite value, a value outside
its range, ``trust_remote_code``), an output folder that is unsafe or not writable, a model path that does not
exist, a model folder without weights or without a tokenizer, or with pickle-only, damaged, non-finite or
mismatched weights (:mod:`hf_unlearn.model_files`), a rows file or TOFU config with a missing, empty, null,
non-string or not valid Unicode question or answer, forget rows that also occur in the retain rows, a forget prompt
that leaves no room for an answer token, a prompt template the tokenizer cannot render, a T3 ``--layer`` outside
the model, a GROM ``--target_modules`` entry the model does not have, a retain reference that is missing,
unreadable or (with ``--eval``) made on other rows, TOFU configs that ``--eval`` needs but the data source lacks,
an invalid repo id, a missing token when pushing (:func:`check_run_preconditions` holds the checks that need the
model). A failure during a run prints one line naming the method, the phase and the log file (exit status 1).
"""

from __future__ import annotations

import argparse
import os
import sys
import typing
from pathlib import Path
from typing import Any

from .console import THIRD_PARTY, quiet_console
from .devices import DEVICE_HELP
from .options import (
    CLI_OWNED_FIELDS,
    TRAINER_CLASSES,
    UserError,
    config_kwargs,
    config_parser,
    join_negative_values,
    method_config_class,
    option_fields,
    options_dataclass,
    parse_method_settings,
    validate_settings,
)
from .preconditions import (
    TOKENIZER_FILES,
    WEIGHT_FILES,
    check_eval_configs,
    check_output_parent,
    check_push_target,
    check_retain_reference,
    check_run_preconditions,
    load_model,
    load_rows,
    rows_from_spec,
)
from .registry import method_names

__all__ = [
    "CLI_OWNED_FIELDS", "THIRD_PARTY", "TOKENIZER_FILES", "TRAINER_CLASSES", "WEIGHT_FILES", "RunFailure",
    "UserError", "build_parser", "check_eval_configs", "check_push_target", "check_retain_reference",
    "check_run_preconditions", "config_kwargs", "config_parser", "default_data_source", "main", "method_config_class",
    "method_help", "option_fields", "options_dataclass", "parse_method_settings", "quiet_console",
    "validate_settings",
]

DEFAULT_DEMO_DIR = "hf_unlearn_demo"


def method_help() -> str:
    """The ``--method`` help: the registered methods (:func:`hf_unlearn.registry.method_names`)."""
    names = method_names()
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else "".join(names)


class _UnlearnHelpFormatter(argparse.HelpFormatter):
    """Writes the ``--method`` help from the registry when the help is shown (the lookup imports the method
    packages, which the other commands do not need)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return method_help() if action.dest == "method" else super()._get_help_string(action)


class RunFailure(Exception):
    """A method failed during a phase: reported as one line (method, phase, log file), exit status 1.

    ``printed`` is true when the progress line already showed it (then :func:`main` prints nothing more)."""

    def __init__(self, message: str, printed: bool = False):
        super().__init__(message)
        self.printed = printed


class _ArgumentParser(argparse.ArgumentParser):
    """argparse that raises :class:`UserError` (one line) instead of printing usage and exiting."""

    def error(self, message: str) -> typing.NoReturn:
        raise UserError(message)


def _checkpoints(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("checkpoint-*") if p.is_dir()) if folder.is_dir() else []


# ---------------------------------------------------------------------------------------------- commands
def cmd_demo(args: argparse.Namespace) -> int:
    from .bench.registry import METHODS
    from .bench.report import write_results
    from .bench.runner import run_comparison
    from .bench.subjects import build_tiny_pair, recipe_for

    methods = args.methods or list(METHODS)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise UserError(f"Unknown method(s) {unknown}; choose from {', '.join(sorted(METHODS))}.")
    out = Path(args.output)
    print(f"hf-unlearn demo: synthetic fictitious authors, tiny Llama models, methods: {', '.join(methods)}")
    print(f"per-step training logs: {out / 'logs'}/<method>.jsonl")
    pair = _tiny_pair(build_tiny_pair, "synthetic", "forget10", recipe_for("test"), args.cache_dir)
    results = run_comparison(
        pair, methods, grid=False, source="synthetic", forget_split="forget10",
        eval_kwargs={"max_new_tokens": 40}, quantization_check=not args.no_quantization, progress=True,
        log_dir=out / "logs", verbose=args.verbose,
    )
    paths = write_results(results, out, "demo", {"source": "synthetic", "forget_split": "forget10", "mode": "demo"})
    print()
    print(paths["markdown"].read_text())
    print(f"Results: {paths['json']}  table: {paths['markdown']}  plot: {paths['png']}")
    return _report_failures(results, out / "logs")


def _tiny_pair(build, source, split, recipe, cache_dir):
    from .console import PhaseReporter

    say = PhaseReporter()
    say.start("tiny models", "preparing")
    pair = build(source, split, recipe, cache_dir=cache_dir, progress=False)
    say.done("cached after the first run")
    return pair


def _report_failures(results: dict[str, Any], log_dir: Path) -> int:
    """Exit status of a comparison: 1 when a method failed (its progress line already named the phase and log)."""
    return 1 if any(r.get("error") for r in results["rows"].values()) else 0


def _unlearn_help(parser: argparse.ArgumentParser, method: str | None) -> int:
    print(parser.format_help())
    if method:
        print(config_parser(method).format_help())
    else:
        print("Method options: every field of the method's config is an option. List them with\n"
              "  hf-unlearn unlearn --method METHOD --help\n")
        for name in method_names():
            try:
                cls = method_config_class(name)
            except UserError:
                continue
            print(f"  {name:12s} {cls.__module__}.{cls.__name__}")
    return 0


def _groups_option(value: str) -> str | int:
    """``--groups``: ``rows``, ``tofu_authors`` or a whole number of consecutive rows per group (>= 1)."""
    if value in ("rows", "tofu_authors"):
        return value
    if value.isdigit() and int(value) >= 1:
        return int(value)
    raise argparse.ArgumentTypeError(f"expected rows, tofu_authors or a whole number >= 1, got {value!r}")


def _check_selection_flags(args: argparse.Namespace) -> None:
    """``--select`` needs ``--holdout``; ``--holdout`` / ``--retain-validation`` need ``--select`` (one line, before
    any work)."""
    if args.select and not args.holdout:
        raise UserError("--select needs --holdout SPLIT_OR_FILE: rows of the same kind the model never saw (TOFU's "
                        "holdout01/05/10, or a JSON Lines file of question/answer rows).")
    if not args.select and (args.holdout or args.retain_validation or args.reference_model
                            or args.groups != "rows"):
        raise UserError("--holdout, --retain-validation, --groups and --reference-model apply with --select only.")
    if args.select and args.selection_steps < 1:
        raise UserError(f"--selection-steps must be >= 1, got {args.selection_steps}.")


def _selection_setup(args: argparse.Namespace, forget: list[dict[str, Any]], retain: list[dict[str, Any]],
                     settings: dict[str, Any], device: str | None = None) -> tuple[Any, list[dict[str, Any]]]:
    """The :class:`~hf_unlearn.selection.SelectionCriterion` of ``--select`` and the retain rows the method sees
    (without the validation rows when they are split off the retain rows); ``--reference-model`` is loaded on
    ``device``."""
    from .data.pairing import overlapping_examples
    from .selection import SelectionCriterion

    def rows(spec: str, flag: str = "--holdout") -> list[dict[str, Any]]:
        return rows_from_spec(spec, args.data, flag)

    holdout = rows(args.holdout)
    if overlapping_examples(forget, holdout):
        raise UserError(f"--holdout {args.holdout} shares rows with the forget set; holdout rows must be unseen.")
    if args.retain_validation:
        validation = rows(args.retain_validation, "--retain-validation")
        if overlapping_examples(validation, retain):
            raise UserError(f"--retain-validation {args.retain_validation} shares rows with the retain rows the "
                            "method unlearns with; pass rows it does not see (or omit it to split them off).")
    else:
        if len(retain) < 2:
            raise UserError("--select splits validation rows off the retain rows, but there is only one; pass "
                            "--retain-validation.")
        n = max(1, min(100, len(retain) // 10))
        retain, validation = retain[:-n], retain[-n:]
    reference_model = reference_tokenizer = None
    if args.reference_model:
        reference_model, reference_tokenizer = load_model(args.reference_model, device)
    criterion = SelectionCriterion(
        forget, holdout, validation, template=settings.get("prompt_template"),
        groups=None if args.groups == "rows" else args.groups,
        reference_model=reference_model, reference_tokenizer=reference_tokenizer,
    )
    return criterion, retain


def _device(args: argparse.Namespace, method: str | None = None, settings: dict[str, Any] | None = None) -> str:
    """``--device`` resolved (:func:`hf_unlearn.devices.resolve_device`), refused in one line before any work.
    A trainer method runs on the Trainer's device: ``--device cpu`` on a machine with CUDA sets the Trainer's
    ``use_cpu`` in ``settings``; a contradicting ``--use_cpu`` or a GPU other than the Trainer's is refused."""
    from .devices import resolve_device

    try:
        device = resolve_device(args.device)
    except ValueError as err:
        raise UserError(str(err)) from None
    if settings is None or method not in TRAINER_CLASSES:
        return device
    use_cpu = settings.get("use_cpu")
    if device == "cpu":
        if use_cpu is False:
            raise UserError("--device cpu contradicts --use_cpu False; pass one of them.")
        if use_cpu is None and device != resolve_device(None):  # a GPU machine asked to stay on the CPU
            settings["use_cpu"] = True
        return device
    if use_cpu:
        raise UserError(f"--device {args.device} contradicts --use_cpu True; pass one of them.")
    trainer_gpu = f"cuda:{os.environ.get('LOCAL_RANK', '0')}"
    if ":" in device and device != trainer_gpu:
        raise UserError(f"--device {device}: {method} trains on the Trainer's GPU ({trainer_gpu} in this process); "
                        f"choose the GPU with CUDA_VISIBLE_DEVICES={device.split(':')[1]} and --device cuda.")
    return device


def _demo_preset(method: str) -> dict[str, Any]:
    """``unlearn --preset demo``: the method's TOFU-tiny demo setting, which the benchmark's subject file holds
    (``benchmarks/configs/tofu_tiny.toml``); ``{}`` for a method it has no table for."""
    from .bench.registry import METHODS

    return dict(METHODS[method].demo) if method in METHODS else {}


def cmd_unlearn(args: argparse.Namespace, extra: list[str]) -> int:
    from .console import PhaseReporter, log_exception
    from .data import RETAIN_FOR_FORGET
    from .run import nf4_forget_rouge, unlearn
    from .safe_output import FAILED_SUFFIX, OutputDirError, atomic_directory, check_output_dir, keep_failed

    if args.help:
        return _unlearn_help(args.subparser, args.method)
    names = method_names()
    if not args.method:
        raise UserError(f"--method is required; choose from {', '.join(sorted(names))}.")
    if args.method not in names:
        raise UserError(f"Unknown method {args.method!r}; choose from {', '.join(sorted(names))}.")
    for flag, value in (("--model", args.model), ("--output", args.output)):
        if not value:
            raise UserError(f"{flag} is required.")
    _check_selection_flags(args)
    method = args.method
    preset = _demo_preset(method) if args.preset == "demo" else {}
    settings = parse_method_settings(method, extra, preset)
    device = _device(args, method, settings)
    out = Path(args.output).expanduser()
    config = validate_settings(method, settings, out)
    is_trainer = method in TRAINER_CLASSES
    checkpointing = is_trainer and str(settings.get("save_strategy", "no")).lower().split(".")[-1] != "no"
    inputs = [args.model, args.data if args.data and os.path.isdir(args.data) else None,
              args.forget_file, args.retain_file]
    try:
        if args.resume:
            if not is_trainer:
                raise UserError(f"--resume applies to trainer methods ({', '.join(TRAINER_CLASSES)}), not {method}.")
            if not _checkpoints(out):
                raise UserError(f"--resume: no checkpoint-* folder in {out} to resume from.")
            check_output_dir(out, inputs, overwrite=True)
        else:
            if checkpointing and args.overwrite and out.is_dir() and any(out.iterdir()):
                raise UserError(f"With save_strategy={settings['save_strategy']} the run writes its checkpoints "
                                f"into {out}; choose an empty folder, or --resume a run that stopped.")
            check_output_dir(out, inputs, overwrite=args.overwrite, siblings=(FAILED_SUFFIX,))
    except OutputDirError as err:
        raise UserError(str(err)) from None
    forget = load_rows(args.forget_split, args.data, args.forget_file)
    retain = load_rows(RETAIN_FOR_FORGET[args.forget_split], args.data, args.retain_file)
    criterion, retain = _selection_setup(args, forget, retain, settings, device) if args.select else (None, retain)
    check_retain_reference(args.retain_reference, args.forget_split, args.data if args.eval else None)
    if args.eval:
        if args.max_new_tokens < 1:
            raise UserError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}.")
        check_eval_configs(args.data, args.forget_split)
    token = check_push_target(args.push_to_hub, args.hub_token)
    model, tokenizer = load_model(args.model, device)
    check_run_preconditions(method, config, model, tokenizer, forget, retain)

    say = PhaseReporter(inline=not args.verbose)
    state: dict[str, Any] = {}

    def run(work: Path) -> None:
        log_path = work / "logs" / f"{method}.jsonl"
        state["log"] = log_path
        phase = "training"

        def entered(name: str) -> None:
            nonlocal phase
            phase = name

        try:
            say.start(method, phase)
            result = unlearn(method, model, tokenizer, forget, retain, work, settings, log_path=log_path,
                             echo_logs=args.verbose, quiet=True, resume_from_checkpoint=True if args.resume else None,
                             criterion=criterion, selection_steps=args.selection_steps, on_phase=entered)
            state["result"] = result
            say.done(f"{result.info['global_step']} steps" if result.info.get("global_step") else "")
            if args.eval:
                from .evaluation import evaluate_tofu

                phase = "evaluation"
                say.start(method, phase)
                state["report"] = evaluate_tofu(
                    result.model, tokenizer, source=args.data, forget_split=args.forget_split,
                    retain_reference=args.retain_reference, scorer=result.scorer,
                    generation_kwargs=result.generation_kwargs, progress=args.verbose,
                    output_path=work / "tofu_report.json", max_new_tokens=args.max_new_tokens,
                    template=settings.get("prompt_template"),
                )
                say.done()
                if args.nf4_check and result.weights_changed:
                    from .data import load_tofu_rows

                    phase = "NF4 re-check"
                    say.start(method, phase)
                    n = state["report"]["splits"]["forget"]["num_examples"]
                    rows = load_tofu_rows(f"{args.forget_split}_perturbed", args.data)[:n]
                    nf4_rouge = nf4_forget_rouge(result.model, tokenizer, rows, {"max_new_tokens": args.max_new_tokens})
                    state["report"]["forget_rouge_l_nf4"] = nf4_rouge
                    say.done(f"forget ROUGE-L {nf4_rouge:.3f}")
        except Exception as err:
            log_exception(log_path, phase, err)
            state["failure"] = (phase, err)
            raise

    try:
        if checkpointing or args.resume:  # checkpoints must outlive an interrupted run: train in place
            out.mkdir(parents=True, exist_ok=True)
            run(out)
        else:
            with atomic_directory(out, overwrite=args.overwrite, all_ranks=True) as work:
                try:
                    run(work)
                except BaseException:
                    # keep the log (and anything written) to inspect, under a name nothing else has
                    kept = keep_failed(work, out)
                    state["log"] = kept / "logs" / f"{method}.jsonl"
                    raise
    except Exception as err:
        phase = state.get("failure", ("its run", err))[0]
        raise RunFailure(say.fail(err, state.get("log"), phase=phase), printed=True) from err

    result = state["result"]
    log_path = out / "logs" / f"{method}.jsonl"
    print(f"{method}: unlearned in {result.seconds:.1f}s, saved to {out}  (log: {log_path})")
    report = state.get("report")
    if report is not None:
        from .evaluation import format_report_table

        print(format_report_table({method: report}))
    if args.push_to_hub:
        say.start(method, "push")
        try:
            commit = result.push_to_hub(
                args.push_to_hub, report=report, token=token, forget_split=args.forget_split,
                dataset=args.data, base_model=args.model, selection=result.info.get("selection"),
                tokenizer=tokenizer if result.artifact is result.model else None,
            )
        except Exception as err:
            raise RunFailure(say.fail(err), printed=True) from err
        say.done(str(getattr(commit, "commit_url", commit)))
    return 0


AUTOCAST_CHOICES = ["none", "bfloat16", "float16"]
"""``--autocast-dtype`` / ``--eval-autocast`` values: ``evaluate_tofu``'s ``autocast_dtype`` options, ``none`` for ``None``."""


def _autocast_dtype(choice: str | None, default: str | None = None) -> str | None:
    """``evaluate_tofu``'s ``autocast_dtype`` from a CLI choice (``None``: the option was not given)."""
    choice = default if choice is None else choice
    return None if choice in (None, "none") else choice


def _muse_retain_reference(value: str | None) -> float | str | None:
    """``eval --benchmark muse --retain-reference``: an AUC (a number) or the path of a retain model's MUSE report."""
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    if not os.path.isfile(value):
        raise UserError(f"--retain-reference {value}: neither an AUC nor a MUSE report file.")
    return value


def cmd_eval_muse(args: argparse.Namespace) -> int:
    """``eval --benchmark muse``: :func:`hf_unlearn.evaluation.evaluate_muse` on ``--data`` (a MUSE-News folder or
    Hub id), its report printed and written to ``--output``."""
    from .console import PhaseReporter
    from .evaluation import MUSE_HUB_ID, evaluate_muse, render_muse_report

    unused = [flag for flag, value in (("--attacks", args.attacks), ("--save-truth-ratios", args.save_truth_ratios),
                                       ("--template", args.template), ("--attack-original", args.attack_original))
              if value]
    if args.forget_split != "forget10" or args.autocast_dtype not in (None, "none"):
        unused.append("--forget-split/--autocast-dtype")
    if unused:
        raise UserError(f"{', '.join(unused)}: TOFU options, not used by --benchmark muse.")
    for name in ("batch_size", "max_examples"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UserError(f"--{name.replace('_', '-')} must be >= 1, got {value}.")
    device = _device(args)
    reference = _muse_retain_reference(args.retain_reference)
    _check_eval_report_paths(args)
    source = args.data or MUSE_HUB_ID
    model, tokenizer = load_model(args.model, device)
    say = PhaseReporter(inline=not args.verbose)
    say.start(Path(args.model).name, "MUSE evaluation")
    try:
        report = evaluate_muse(model, tokenizer, source=source, retain_reference=reference,
                               max_examples=args.max_examples, batch_size=args.batch_size, progress=args.verbose,
                               output_path=args.output)
    except Exception as err:
        raise RunFailure(say.fail(err), printed=True) from err
    say.done()
    print(render_muse_report(report))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from .console import PhaseReporter
    from .evaluation import evaluate_tofu, render_report, save_truth_ratios

    if getattr(args, "benchmark", "tofu") == "muse":
        return cmd_eval_muse(args)
    device = _device(args)
    for name in ("batch_size", "max_new_tokens", "max_examples"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UserError(f"--{name.replace('_', '-')} must be >= 1, got {value}.")
    check_eval_configs(args.data, args.forget_split)
    check_retain_reference(args.retain_reference, args.forget_split, args.data, args.max_examples)
    _check_eval_report_paths(args)
    attacks = _eval_attacks(args)
    model, tokenizer = load_model(args.model, device)
    if args.attack_original:  # the model before unlearning: the attacks' recovered fractions
        original, _ = load_model(args.attack_original, device)
        for options in attacks.values():
            options["original"] = original
    name = Path(args.model).name
    say = PhaseReporter(inline=not args.verbose)
    say.start(name, "evaluation" + (" and attacks" if attacks else ""))
    try:
        report = evaluate_tofu(
            model, tokenizer, source=args.data, forget_split=args.forget_split,
            retain_reference=args.retain_reference, batch_size=args.batch_size,
            max_new_tokens=args.max_new_tokens, max_examples=args.max_examples, output_path=args.output,
            progress=args.verbose, template=args.template,
            autocast_dtype=_autocast_dtype(args.autocast_dtype), attacks=attacks or None,
        )
    except Exception as err:
        raise RunFailure(say.fail(err), printed=True) from err
    say.done()
    if args.save_truth_ratios:
        save_truth_ratios(report, args.save_truth_ratios)
    print(render_report(report))
    if report.attacks:
        from .evaluation import format_attacks

        print(format_attacks(report.attacks))
    return 0


def _check_eval_report_paths(args: argparse.Namespace) -> None:
    """``eval --output`` / ``--save-truth-ratios``: file paths outside every input (the model folder, the model
    before unlearning, a data folder, the retain reference), no link, no folder, writable, and not the same file
    (:func:`hf_unlearn.safe_output.check_report_path`); one line before any model loads."""
    from .safe_output import OutputDirError, check_report_path

    inputs = [args.model, args.attack_original, args.retain_reference,
              args.data if args.data and os.path.isdir(args.data) else None]
    targets = []
    for path in (args.output, args.save_truth_ratios):
        if path:
            try:
                targets.append(check_report_path(path, inputs))
            except OutputDirError as err:
                raise UserError(str(err)) from None
    if len(targets) == 2 and targets[0] == targets[1]:
        raise UserError(f"--output and --save-truth-ratios name the same file {targets[0]}; give two paths.")


def _eval_attacks(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """``evaluate_tofu``'s ``attacks`` from ``--attacks`` / ``--relearn-*``, checked before any model loads."""
    from .evaluation.attacks import check_attack_options, parse_attacks

    if not args.attacks:
        if args.attack_original:
            raise UserError("--attack-original needs --attacks.")
        return {}
    try:
        attacks = parse_attacks(args.attacks)
        if "relearn" in attacks:
            attacks["relearn"].update(steps=args.relearn_steps, learning_rate=args.relearn_lr)
        check_attack_options(attacks)
    except ValueError as err:
        raise UserError(str(err)) from None
    if args.relearn_lr < 0:
        raise UserError(f"--relearn-lr must be >= 0, got {args.relearn_lr}.")
    return attacks


def _bench_subject(args: argparse.Namespace, methods: list[str]) -> int:
    """``bench --subject NAME``: TOFU-small on a pretrained subject (:func:`hf_unlearn.bench.runner.run_subject_bench`)."""
    from .bench.report import markdown_table
    from .bench.runner import format_gate, run_subject_bench
    from .bench.subjects import SUBJECTS

    if args.subject not in SUBJECTS:
        raise UserError(f"Unknown subject {args.subject!r}; choose from tofu_tiny, {', '.join(sorted(SUBJECTS))}.")
    if args.model or args.retain_model or args.split != "forget10":
        raise UserError("--subject builds its own TOFU-small pair (forget10 authors); drop --model/--retain-model/--split.")
    eval_kwargs: dict[str, Any] = {"max_new_tokens": args.max_new_tokens}
    if args.max_examples is not None:
        eval_kwargs["max_examples"] = args.max_examples
    from .bench.subjects import default_eval_autocast

    autocast = _autocast_dtype(args.eval_autocast, default=default_eval_autocast())
    if autocast is not None:
        eval_kwargs["autocast_dtype"] = autocast
    results, paths = run_subject_bench(
        args.subject, methods, source=args.data, output_dir=args.output_dir, cache_dir=args.cache_dir,
        build_only=args.build_only, grid=not args.no_grid, eval_kwargs=eval_kwargs,
        quantization_check=not args.no_quantization, progress=True, verbose=args.verbose,
        attacks=args.attacks, layout=args.layout, bar=args.bar, resume=args.resume, select=args.select,
        selection_steps=args.selection_steps,
    )
    if paths is None:
        print(format_gate(results))
        print(f"target: {results['target']}\nretain reference: {results['retain_reference']}")
        return 0 if results["passed"] else 1
    print()
    print(markdown_table(results))
    print(format_gate(results["sanity_gate"]))
    print(f"Results: {paths['json']}  plot: {paths['png']}")
    return _report_failures(results, Path(args.output_dir) / "logs" / args.subject)


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench.registry import METHODS
    from .bench.report import write_results
    from .bench.runner import run_comparison
    from .bench.subjects import TinyPair, build_tiny_pair, recipe_for

    methods = args.methods or list(METHODS)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise UserError(f"Unknown method(s) {unknown}; choose from {', '.join(sorted(METHODS))}.")
    if args.attacks:
        from .evaluation.attacks import check_attack_options, parse_attacks

        try:
            check_attack_options(parse_attacks(args.attacks))
        except ValueError as err:
            raise UserError(str(err)) from None
    if args.subject not in (None, "tofu_tiny"):
        return _bench_subject(args, methods)
    if args.build_only:
        raise UserError("--build-only needs --subject (e.g. --subject smollm2-135m); for TOFU-tiny use `hf-unlearn tiny`.")
    if args.model:
        if not args.retain_model:
            raise UserError("--model needs --retain-model (the model fine-tuned on the retain split only).")
        pair = TinyPair(Path(args.model), Path(args.retain_model), args.data, args.split)
    else:
        pair = _tiny_pair(build_tiny_pair, args.data, args.split, recipe_for(args.size), args.cache_dir)
    out = Path(args.output_dir)
    eval_kwargs: dict[str, Any] = {"max_new_tokens": args.max_new_tokens, "max_examples": args.max_examples}
    autocast = _autocast_dtype(args.eval_autocast)
    if autocast is not None:
        eval_kwargs["autocast_dtype"] = autocast
    results = run_comparison(
        pair, methods, grid=not args.no_grid, source=args.data, forget_split=args.split,
        eval_kwargs=eval_kwargs,
        quantization_check=not args.no_quantization, progress=True, log_dir=out / "logs", verbose=args.verbose,
        attacks=args.attacks,
    )
    name = f"tofu_tiny_{args.split}" if not args.model else f"bench_{args.split}"
    meta = {"source": args.data, "forget_split": args.split, "size": args.size, "mode": "bench",
            "target": str(pair.target), "retain_reference_model": str(pair.retain), "seed": 0}
    paths = write_results(results, out, name, meta)
    print()
    print(paths["markdown"].read_text())
    print(f"Results: {paths['json']}  plot: {paths['png']}")
    return _report_failures(results, out / "logs")


def cmd_tiny(args: argparse.Namespace) -> int:
    from .bench.runner import format_gate, reference_rows, sanity_gate
    from .bench.subjects import build_tiny_pair, recipe_for
    from .evaluation import write_json_atomic

    pair = _tiny_pair(build_tiny_pair, args.data, args.split, recipe_for(args.size), args.cache_dir)
    target_report, retain_report = reference_rows(pair, args.data, args.split, {"max_examples": args.max_examples})
    gate = sanity_gate(target_report, retain_report)
    gate.update(target=str(pair.target), retain_reference=str(pair.retain), source=args.data, forget_split=args.split, size=args.size)
    write_json_atomic(gate, Path(pair.target) / "sanity_gate.json")
    print(format_gate(gate))
    print(f"target: {pair.target}\nretain reference: {pair.retain}")
    return 0 if gate["passed"] else 1


#: Environment variable naming a local folder of TOFU ``<config>.jsonl`` files: the default of ``--data``.
TOFU_DIR_ENV = "HF_UNLEARN_TOFU_DIR"
DATA_HELP = (f"TOFU source: a local folder of <config>.jsonl files, 'synthetic', or a Hub dataset id (default: "
             f"${TOFU_DIR_ENV} when set, else the Hub dataset locuslab/TOFU)")


def default_data_source() -> str:
    """``--data`` when not given: the folder in ``$HF_UNLEARN_TOFU_DIR`` when set, else the Hub id ``locuslab/TOFU``."""
    from .data import TOFU_HUB_ID

    folder = os.environ.get(TOFU_DIR_ENV, "").strip()
    if not folder:
        return TOFU_HUB_ID
    if not os.path.isdir(os.path.expanduser(folder)):
        raise UserError(f"{TOFU_DIR_ENV}={folder} is not a folder; point it at a folder of TOFU <config>.jsonl files, "
                        "or unset it to use the Hub dataset.")
    return os.path.expanduser(folder)


RETAIN_REFERENCE_HELP = (
    "the retain model's numbers for forget quality: our report or saved truth ratios, open-unlearning's "
    "TOFU_EVAL.json, or TOFU's eval_log_forget.json (or its results folder)"
)


def build_parser() -> argparse.ArgumentParser:
    from .data import FORGET_SPLITS
    from .data.prompts import PROMPT_TEMPLATES
    from .evaluation.generation import DEFAULT_MAX_NEW_TOKENS
    from .evaluation.report import metric_definitions_text

    parser = _ArgumentParser(prog="hf-unlearn", allow_abbrev=False,
                             description="Machine unlearning for causal LMs on the Hugging Face stack.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_ArgumentParser)

    def add(name: str, **kwargs: Any) -> argparse.ArgumentParser:
        return sub.add_parser(name, allow_abbrev=False, **kwargs)

    demo = add("demo", help="every method on the embedded synthetic set with tiny models (offline)")
    demo.add_argument("--output", default=DEFAULT_DEMO_DIR, help="folder for demo.json / demo.md / demo.png and logs/")
    demo.add_argument("--methods", nargs="+", help="subset of methods (default: all)")
    demo.add_argument("--cache-dir", default=None, help="model cache (default $HF_UNLEARN_CACHE or ~/.cache/hf_unlearn)")
    demo.add_argument("--no-quantization", action="store_true", help="skip the 4-bit NF4 re-check")
    demo.add_argument("--verbose", action="store_true", help="also print the per-step training logs")
    demo.set_defaults(func=cmd_demo)

    un = add("unlearn", add_help=False, formatter_class=_UnlearnHelpFormatter, help="unlearn a forget split from a model and save the result",
             description="Unlearn a forget split and save the method's native artifact (weights, LoRA adapter or "
                         "T3 head). Every field of the method's config is also an option: "
                         "`hf-unlearn unlearn --method METHOD --help` lists them.")
    un.add_argument("-h", "--help", action="store_true", help="show this help (with --method: its config options)")
    un.add_argument("--method", help="the registered methods (hf_unlearn.registry)")
    un.add_argument("--model", help="model folder or Hub id")
    un.add_argument("--data", default=None, help=DATA_HELP)
    un.add_argument("--forget-split", default="forget10", choices=FORGET_SPLITS)
    un.add_argument("--forget-file", help="JSON Lines file of question/answer rows to forget (instead of --forget-split)")
    un.add_argument("--retain-file", help="JSON Lines file of question/answer rows to keep (instead of the retain split)")
    un.add_argument("--output", help="output folder (refused when it overlaps the model folder)")
    un.add_argument("--overwrite", action="store_true", help="replace a non-empty output folder (swapped in when complete)")
    un.add_argument("--resume", action="store_true", help="resume from the latest checkpoint-* in --output (trainer methods)")
    un.add_argument("--preset", choices=("none", "demo"), default="none",
                    help="start from the config defaults (none) or the method's TOFU-tiny demo setting; options override")
    un.add_argument("--eval", action="store_true", help="run the TOFU evaluator on the result")
    un.add_argument("--nf4-check", action="store_true", help="with --eval: forget ROUGE-L again after NF4 quantization")
    un.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS,
                    help=f"generated answer length for --eval (TOFU's {DEFAULT_MAX_NEW_TOKENS})")
    un.add_argument("--retain-reference", help=RETAIN_REFERENCE_HELP)
    un.add_argument("--push-to-hub", metavar="REPO", help="push the result with a model card")
    un.add_argument("--hub-token", help="token for --push-to-hub (default: HF_TOKEN or the saved login)")
    un.add_argument("--select", action="store_true",
                    help="choose the method's strength by the reference-free criterion (hf_unlearn.selection): GROM's "
                         "exact strength path, T3's (T, w) calibration, the best checkpoint of a trainer; needs "
                         "--holdout; the record is saved as selection_record.json and shown in the model card")
    un.add_argument("--holdout", metavar="SPLIT_OR_FILE",
                    help="with --select: rows of the same kind the model never saw (TOFU holdout01/05/10 of --data, "
                         "or a JSON Lines file of question/answer rows)")
    un.add_argument("--retain-validation", metavar="SPLIT_OR_FILE",
                    help="with --select: retain rows not used for unlearning (default: the last 10%%, at most 100, of "
                         "the retain rows, which the method then does not see)")
    un.add_argument("--groups", type=_groups_option, default="rows", metavar="rows|tofu_authors|N",
                    help="with --select: how rows are grouped for the forget-vs-holdout test: every row its own group "
                         "(default), TOFU's authors (20 consecutive rows each), or N consecutive rows each")
    un.add_argument("--reference-model", metavar="PATH_OR_ID",
                    help="with --select: a model that saw neither the forget nor the holdout rows, e.g. the pretrained "
                         "base before fine-tuning; each row's NLL under it is subtracted, so authors of different "
                         "difficulty compare fairly (measured once)")
    un.add_argument("--selection-steps", type=int, default=50,
                    help="with --select, trainer methods: measure the criterion every this many optimizer steps")
    un.add_argument("--device", default="auto", help=DEVICE_HELP)
    un.add_argument("--verbose", action="store_true", help="also print the per-step training logs")
    un.set_defaults(func=cmd_unlearn, subparser=un)

    ev = add("eval", help="TOFU (or MUSE) evaluation of a model", epilog=metric_definitions_text(),
             formatter_class=argparse.RawDescriptionHelpFormatter)
    ev.add_argument("--model", required=True, help="model folder or Hub id")
    ev.add_argument("--benchmark", choices=("tofu", "muse"), default="tofu",
                    help="tofu (default), or muse: MUSE-News VerbMem, KnowMem and PrivLeak (--data: a folder laid out "
                         "like MUSE-News or a Hub id, default muse-bench/MUSE-News; --retain-reference: a retain "
                         "model's MUSE report or its AUC; MUSE's own 128/32 new tokens)")
    ev.add_argument("--data", default=None, help=DATA_HELP)
    ev.add_argument("--forget-split", default="forget10", choices=FORGET_SPLITS)
    ev.add_argument("--retain-reference", help=RETAIN_REFERENCE_HELP)
    ev.add_argument("--template", choices=sorted(PROMPT_TEMPLATES), default=None,
                    help="prompt template the model was fine-tuned with (default: its chat template, else plain)")
    ev.add_argument("--save-truth-ratios", help="write this model's forget truth ratios (use for a retain model)")
    ev.add_argument("--output", help="report JSON path")
    ev.add_argument("--batch-size", type=int, default=16)
    ev.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS,
                    help=f"generated answer length (TOFU's {DEFAULT_MAX_NEW_TOKENS})")
    ev.add_argument("--max-examples", type=int, default=None)
    ev.add_argument("--autocast-dtype", choices=AUTOCAST_CHOICES, default="none",
                    help="score and generate under torch.autocast with this dtype (weights untouched; recorded in "
                         "the report, and a retain reference must match it)")
    ev.add_argument("--attacks", default=None, metavar="quant,relearn",
                    help="after the evaluation, try to bring the forget rows back: quant (4-bit NF4 and 8-bit "
                         "copies), relearn (a few fine-tuning steps on 10%% of the forget rows, and on retain rows)")
    ev.add_argument("--attack-original", default=None, metavar="MODEL",
                    help="the model before unlearning (folder or Hub id): report the share of the gap each attack "
                         "recovered")
    ev.add_argument("--relearn-steps", type=int, default=10, help="relearning attack: fine-tuning steps (10)")
    ev.add_argument("--relearn-lr", type=float, default=1e-4,
                    help="relearning attack: learning rate (1e-4; use the target's fine-tuning rate)")
    ev.add_argument("--device", default="auto", help=DEVICE_HELP)
    ev.add_argument("--verbose", action="store_true", help="show the evaluator's progress bars")
    ev.set_defaults(func=cmd_eval)

    tiny = add("tiny", help="build (or reuse) the TOFU-tiny target and retain reference, run the sanity gate")
    tiny.add_argument("--data", default=None, help=DATA_HELP)
    tiny.add_argument("--split", default="forget10", choices=FORGET_SPLITS)
    tiny.add_argument("--size", default="bench", help="bench, tofu-test or test")
    tiny.add_argument("--max-examples", type=int, default=None)
    tiny.add_argument("--cache-dir", default=None)
    tiny.set_defaults(func=cmd_tiny)

    be = add("bench", help="every method side by side on TOFU-tiny (or a given model pair)")
    be.add_argument("--split", default="forget10", choices=FORGET_SPLITS)
    be.add_argument("--data", default=None, help=DATA_HELP)
    be.add_argument("--size", default="bench", help="TOFU-tiny size: bench or tofu-test")
    be.add_argument("--model", help="target model (Hub id or folder) instead of TOFU-tiny")
    be.add_argument("--retain-model", help="retain reference model, with --model")
    be.add_argument("--methods", nargs="+")
    be.add_argument("--no-grid", action="store_true", help="one (default) setting per method instead of the grid")
    be.add_argument("--no-quantization", action="store_true")
    be.add_argument("--attacks", default=None, metavar="quant,relearn",
                    help="also attack the target, the retain reference and each method's chosen setting: quant (4-bit "
                         "and 8-bit copies), relearn (10 fine-tuning steps on 10%% of the forget rows, and on retain "
                         "rows; with --subject at the target's fine-tuning learning rate)")
    be.add_argument("--max-examples", type=int, default=None)
    be.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS,
                    help=f"generated answer length (TOFU's {DEFAULT_MAX_NEW_TOKENS}; recorded in the results)")
    be.add_argument("--output-dir", default="benchmarks/results")
    be.add_argument("--cache-dir", default=None)
    be.add_argument("--subject", default=None,
                    help="benchmark subject: tofu_tiny (default) or a pretrained model, smollm2-135m (TOFU-small on "
                         "SmolLM2-135M-Instruct, presets in benchmarks/configs/smollm2-135m.toml)")
    be.add_argument("--eval-autocast", choices=AUTOCAST_CHOICES, default=None,
                    help="evaluate under torch.autocast with this dtype (default with --subject: bfloat16 where bf16 is "
                         "native, a bf16 GPU or a CPU with AVX512-BF16/AMX, else none; none on TOFU-tiny); recorded "
                         "in the results")
    be.add_argument("--layout", choices=("v1", "v2"), default="v2",
                    help="with --subject: the TOFU-small layout; v2 (default) sets apart retain-train, retain-validation "
                         "and holdout authors, v1 unlearns on the evaluated retain rows")
    be.add_argument("--bar", choices=("single", "split"), default="split",
                    help="utility bar a setting must meet: split (retain side and general side each within 10%% of "
                         "the target's) or single (model utility >= 90%% of the target's)")
    be.add_argument("--select", action="store_true",
                    help="with --subject and --layout v2: every method picks its own strength with the reference-free "
                         "criterion (forget vs holdout10, retain-validation rows); rows say what was chosen and why")
    be.add_argument("--selection-steps", type=int, default=8,
                    help="with --select: trainers measure the criterion every this many optimizer steps")
    be.add_argument("--resume", action="store_true",
                    help="with --subject: keep the rows an interrupted run of the same comparison finished")
    be.add_argument("--build-only", action="store_true",
                    help="with --subject: build (or reuse) the target / retain reference pair and run its sanity gate")
    be.add_argument("--verbose", action="store_true", help="also print the per-step training logs")
    be.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 1 a run failed, 2 bad input)."""
    argv = join_negative_values(list(sys.argv[1:] if argv is None else argv))
    data_hint = ""
    try:
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        if args.command != "unlearn" and extra:
            raise UserError(f"unrecognized arguments: {' '.join(extra)}")
        if hasattr(args, "data") and not getattr(args, "help", False) and getattr(args, "benchmark", None) != "muse":
            given = args.data is not None
            args.data = args.data if given else default_data_source()
            if not os.path.isdir(args.data) and not str(args.data).startswith("synthetic"):
                data_hint = (f"Could not load the TOFU data from the Hub dataset {args.data} ({{cause}}); offline, "
                             f"pass --data with a local folder of TOFU <config>.jsonl files (or --data synthetic)"
                             f"{'' if given else ', or set ' + TOFU_DIR_ENV}.")
        restore = quiet_console(getattr(args, "verbose", False))
        try:
            if args.command == "unlearn":
                from .safe_output import output_lock

                if not getattr(args, "help", False):
                    check_output_parent(getattr(args, "output", None))  # `--output afile/sub`: name the file
                # the output folder is this run's alone from its first check to the end; a second run is refused
                with output_lock(getattr(args, "output", None) if not getattr(args, "help", False) else None):
                    return int(cmd_unlearn(args, extra) or 0)
            return int(args.func(args) or 0)
        finally:
            restore()
    except UserError as err:
        print(f"hf-unlearn: error: {err}", file=sys.stderr)
        return 2
    except RunFailure as err:
        if not err.printed:
            print(f"hf-unlearn: error: {err}", file=sys.stderr)
        return 1
    except ConnectionError as err:
        message = " ".join(str(err).split())
        if data_hint:
            message = data_hint.format(cause=type(err.__cause__ or err).__name__)
        print(f"hf-unlearn: error: {message}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError) as err:
        print(f"hf-unlearn: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hf-unlearn: interrupted (a run with save_strategy=steps can continue with --resume)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
