"""``hf-unlearn eval``: the TOFU evaluation of a model, with the attacks on request, or MUSE-News."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from ..console import PhaseReporter
from ..devices import DEVICE_HELP
from ..options import UserError
from ..preconditions import check_eval_configs, check_retain_reference, load_model
from .common import (
    AUTOCAST_CHOICES,
    DATA_HELP,
    RETAIN_REFERENCE_HELP,
    autocast_dtype,
    in_phase,
    resolve_cli_device,
)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    from ..data import FORGET_SPLITS
    from ..data.prompts import PROMPT_TEMPLATES
    from ..evaluation.generation import DEFAULT_MAX_NEW_TOKENS
    from ..evaluation.report import metric_definitions_text

    ev = sub.add_parser("eval", allow_abbrev=False, help="TOFU (or MUSE) evaluation of a model",
                        epilog=metric_definitions_text(), formatter_class=argparse.RawDescriptionHelpFormatter)
    ev.add_argument("--model", required=True, help="model folder or Hub id")
    ev.add_argument("--benchmark", choices=("tofu", "muse"), default="tofu",
                    help="tofu (default), or muse: MUSE-News VerbMem, KnowMem and PrivLeak (--retain-reference: a "
                         "retain model's MUSE report or its AUC)")
    ev.add_argument("--data", default=None, help=DATA_HELP)
    ev.add_argument("--forget-split", default="forget10", choices=FORGET_SPLITS)
    ev.add_argument("--retain-reference", help=RETAIN_REFERENCE_HELP)
    ev.add_argument("--template", choices=sorted(PROMPT_TEMPLATES), default=None,
                    help="prompt template the model was fine-tuned with (default: its chat template, else plain)")
    ev.add_argument("--save-truth-ratios", help="write this model's forget truth ratios (use for a retain model)")
    ev.add_argument("--output", help="report JSON path")
    ev.add_argument("--overwrite", action="store_true",
                    help="replace an existing --output / --save-truth-ratios file (refused without it)")
    ev.add_argument("--batch-size", type=int, default=16)
    ev.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS,
                    help=f"generated answer length (TOFU's {DEFAULT_MAX_NEW_TOKENS})")
    ev.add_argument("--max-examples", type=int, default=None)
    ev.add_argument("--autocast-dtype", choices=AUTOCAST_CHOICES, default="none",
                    help="score and generate under torch.autocast with this dtype (recorded in the report)")
    ev.add_argument("--attacks", default=None, metavar="quant,relearn",
                    help="after the evaluation, try to bring the forget rows back: quant (4-bit and 8-bit copies), "
                         "relearn (a few fine-tuning steps)")
    ev.add_argument("--attack-original", default=None, metavar="MODEL",
                    help="the model before unlearning: report the share of the gap each attack recovered")
    ev.add_argument("--relearn-steps", type=int, default=10, help="relearning attack: fine-tuning steps (10)")
    ev.add_argument("--relearn-lr", type=float, default=1e-4,
                    help="relearning attack: learning rate (1e-4; use the target's fine-tuning rate)")
    ev.add_argument("--device", default="auto", help=DEVICE_HELP)
    ev.add_argument("--verbose", action="store_true", help="show the evaluator's progress bars")
    ev.set_defaults(func=cmd_eval)
    return ev


def cmd_eval_muse(args: argparse.Namespace) -> int:
    """``eval --benchmark muse``: ``evaluate_muse`` on ``--data``, its report printed and written."""
    from ..evaluation import MUSE_HUB_ID, evaluate_muse, render_muse_report

    unused = [flag for flag, value in (("--attacks", args.attacks), ("--save-truth-ratios", args.save_truth_ratios),
                                       ("--template", args.template), ("--attack-original", args.attack_original))
              if value]
    if args.forget_split != "forget10" or args.autocast_dtype != "none":
        unused.append("--forget-split/--autocast-dtype")
    if unused:
        raise UserError(f"{', '.join(unused)}: TOFU options, not used by --benchmark muse.")
    _check_positive(args, "batch_size", "max_examples")
    device = resolve_cli_device(args)
    reference = args.retain_reference  # an AUC or the path of a retain model's MUSE report
    try:
        reference = None if reference is None else float(reference)
    except ValueError:
        if not os.path.isfile(reference):
            raise UserError(f"--retain-reference {reference}: neither an AUC nor a MUSE report file.") from None
    _check_eval_report_paths(args)
    model, tokenizer = load_model(args.model, device)
    say = PhaseReporter(inline=not args.verbose)
    report = in_phase(say, Path(args.model).name, "MUSE evaluation", lambda: evaluate_muse(
        model, tokenizer, source=args.data or MUSE_HUB_ID, retain_reference=reference,
        max_examples=args.max_examples, batch_size=args.batch_size, progress=args.verbose, output_path=args.output))
    print(render_muse_report(report))
    return 0


def _check_positive(args: argparse.Namespace, *names: str) -> None:
    for name in names:
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UserError(f"--{name.replace('_', '-')} must be >= 1, got {value}.")


def cmd_eval(args: argparse.Namespace) -> int:
    from ..evaluation import evaluate_tofu, render_report, save_truth_ratios
    from ..evaluation.attacks import check_attack_options, parse_attacks

    if getattr(args, "benchmark", "tofu") == "muse":
        return cmd_eval_muse(args)
    device = resolve_cli_device(args)
    _check_positive(args, "batch_size", "max_new_tokens", "max_examples")
    check_eval_configs(args.data, args.forget_split)
    check_retain_reference(args.retain_reference, args.forget_split, args.data, args.max_examples)
    _check_eval_report_paths(args)
    attacks = {}  # evaluate_tofu's attacks= from --attacks / --relearn-*
    if args.attacks:
        try:
            attacks = parse_attacks(args.attacks)
            if "relearn" in attacks:
                attacks["relearn"].update(steps=args.relearn_steps, learning_rate=args.relearn_lr)
            check_attack_options(attacks)
        except ValueError as err:
            raise UserError(str(err)) from None
        if args.relearn_lr < 0:
            raise UserError(f"--relearn-lr must be >= 0, got {args.relearn_lr}.")
    elif args.attack_original:
        raise UserError("--attack-original needs --attacks.")
    model, tokenizer = load_model(args.model, device)
    if args.attack_original:  # the model before unlearning: the attacks' recovered fractions
        original, _ = load_model(args.attack_original, device)
        for options in attacks.values():
            options["original"] = original
    phase, say = "evaluation" + (" and attacks" if attacks else ""), PhaseReporter(inline=not args.verbose)
    report = in_phase(say, Path(args.model).name, phase, lambda: evaluate_tofu(
        model, tokenizer, source=args.data, forget_split=args.forget_split, retain_reference=args.retain_reference,
        batch_size=args.batch_size, max_new_tokens=args.max_new_tokens, max_examples=args.max_examples,
        output_path=args.output, progress=args.verbose, template=args.template,
        autocast_dtype=autocast_dtype(args.autocast_dtype), attacks=attacks or None))
    if args.save_truth_ratios:
        save_truth_ratios(report, args.save_truth_ratios)
    print(render_report(report))
    if report.attacks:
        from ..evaluation import format_attacks

        print(format_attacks(report.attacks))
    return 0


def _check_eval_report_paths(args: argparse.Namespace) -> None:
    """``--output`` / ``--save-truth-ratios``: refused before any model loads when inside an input,
    through a link, a folder, not writable, existing without ``--overwrite``, or the same file."""
    from ..safe_output import OutputDirError, check_report_path

    inputs = [args.model, args.attack_original, args.retain_reference,
              args.data if args.data and os.path.isdir(args.data) else None]
    targets = []
    for path in (args.output, args.save_truth_ratios):
        if path:
            try:
                targets.append(check_report_path(path, inputs, overwrite=args.overwrite))
            except OutputDirError as err:
                raise UserError(str(err)) from None
    if len(targets) == 2 and targets[0] == targets[1]:
        raise UserError(f"--output and --save-truth-ratios name the same file {targets[0]}; give two paths.")
