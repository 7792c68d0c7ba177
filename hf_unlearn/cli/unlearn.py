"""``hf-unlearn unlearn``: unlearn a forget split from a model and save the method's native artifact. The method's
config fields are options (``HfArgumentParser``); the run is :func:`hf_unlearn.run.unlearn`."""

from __future__ import annotations

import argparse
from typing import Any

from ..devices import DEVICE_HELP
from ..model_options import parse_model_options
from ..options import UserError, config_parser, method_config_class, parse_method_settings
from ..preconditions import check_output_parent, check_push_target, check_retain_reference
from ..registry import method_names
from ..scripts import method_option_names
from .common import DATA_HELP, RETAIN_REFERENCE_HELP, in_phase, resolve_cli_device


def method_help() -> str:
    names = method_names()
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else "".join(names)


class _UnlearnHelpFormatter(argparse.HelpFormatter):
    """Writes the ``--method`` help from the registry only when the help is shown."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return method_help() if action.dest == "method" else super()._get_help_string(action)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    from ..data import FORGET_SPLITS
    from ..evaluation.generation import DEFAULT_MAX_NEW_TOKENS

    un = sub.add_parser(
        "unlearn", allow_abbrev=False, add_help=False, formatter_class=_UnlearnHelpFormatter,
        help="unlearn a forget split from a model and save the result",
        description="Unlearn a forget split and save the method's native artifact (weights, LoRA adapter or T3 "
                    "head). Every field of the method's config is also an option: "
                    "`hf-unlearn unlearn --method METHOD --help` lists them.")
    un.add_argument("-h", "--help", action="store_true", help="show this help (with --method: its config options)")
    un.add_argument("--method", help="the registered methods (hf_unlearn.registry)")
    un.add_argument("--model", help="model folder or Hub id")
    un.add_argument("--data", default=None, help=DATA_HELP)
    un.add_argument("--forget-split", default="forget10", choices=FORGET_SPLITS)
    un.add_argument("--forget-file", help="what to forget instead of --forget-split: JSON Lines of question/answer "
                                           "rows, or documents (a .txt file, a folder of them, JSON Lines of texts)")
    un.add_argument("--retain-file", help="what to keep instead of the retain split: question/answer rows or "
                                           "documents, as --forget-file")
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
                    help="choose the method's strength by the reference-free criterion (needs --holdout); the record "
                         "is saved as selection_record.json and shown in the model card")
    un.add_argument("--holdout", metavar="SPLIT_OR_FILE",
                    help="with --select: rows of the same kind the model never saw (a TOFU holdout config or a file)")
    un.add_argument("--retain-validation", metavar="SPLIT_OR_FILE",
                    help="with --select: retain rows not used for unlearning (default: the last 10%%, at most 100)")
    un.add_argument("--groups", type=groups_option, default="rows", metavar="rows|tofu_authors|N",
                    help="with --select: rows per group of the forget-vs-holdout test (default: one row each)")
    un.add_argument("--reference-model", metavar="PATH_OR_ID",
                    help="with --select: a model that saw neither forget nor holdout rows; its NLL is subtracted per row")
    un.add_argument("--selection-steps", type=int, default=50,
                    help="with --select, trainer methods: measure the criterion every this many optimizer steps")
    un.add_argument("--device", default="auto", help=DEVICE_HELP)
    un.add_argument("--verbose", action="store_true", help="also print the per-step training logs")
    un.set_defaults(func=run, takes_method_options=True, subparser=un)
    return un


def groups_option(value: str) -> str | int:
    """``--groups``: ``rows``, ``tofu_authors`` or a whole number >= 1 of consecutive rows per group."""
    if value in ("rows", "tofu_authors"):
        return value
    if value.isdigit() and int(value) >= 1:
        return int(value)
    raise argparse.ArgumentTypeError(f"expected rows, tofu_authors or a whole number >= 1, got {value!r}")


def run(args: argparse.Namespace, extra: list[str]) -> int:
    """:func:`cmd_unlearn` holding the output folder's lock from its first check to the end."""
    from ..safe_output import output_lock

    if args.help:
        return unlearn_help(args.subparser, args.method)
    check_output_parent(args.output)  # `--output afile/sub`: name the file
    with output_lock(args.output):
        return cmd_unlearn(args, extra)


def cmd_unlearn(args: argparse.Namespace, extra: list[str]) -> int:
    """Parse the method's options, build the :class:`~hf_unlearn.run.UnlearnRequest`, run it, then push."""
    from ..console import PhaseReporter
    from ..demo import demo_settings
    from ..run import EvaluationRequest, SelectionRequest, UnlearnRequest, unlearn

    names = method_names()
    if not args.method:
        raise UserError(f"--method is required; choose from {', '.join(sorted(names))}.")
    if args.method not in names:
        raise UserError(f"Unknown method {args.method!r}; choose from {', '.join(sorted(names))}.")
    for flag, value in (("--model", args.model), ("--output", args.output)):
        if not value:
            raise UserError(f"{flag} is required.")
    method = args.method
    if args.select and not args.holdout:
        raise UserError("--select needs --holdout SPLIT_OR_FILE: rows of the same kind the model never saw (TOFU's "
                        "holdout01/05/10, or a JSON Lines file of question/answer rows).")
    if not args.select and (args.holdout or args.retain_validation or args.reference_model
                            or args.groups != "rows"):
        raise UserError("--holdout, --retain-validation, --groups and --reference-model apply with --select only.")
    if args.select and args.selection_steps < 1:
        raise UserError(f"--selection-steps must be >= 1, got {args.selection_steps}.")
    model_options, extra = parse_model_options(extra, method_option_names(method))
    settings = parse_method_settings(method, extra, demo_settings(method) if args.preset == "demo" else {})
    device = resolve_cli_device(args, method, settings)
    selection = SelectionRequest(args.holdout, args.retain_validation, args.groups, args.reference_model,
                                 args.selection_steps) if args.select else None
    evaluation = EvaluationRequest(args.retain_reference, args.max_new_tokens, args.nf4_check) if args.eval else None
    if not args.eval:
        check_retain_reference(args.retain_reference, args.forget_split)
    token = check_push_target(args.push_to_hub, args.hub_token)
    request = UnlearnRequest(method, args.model, args.output, settings, args.data, forget_split=args.forget_split,
                             forget_file=args.forget_file, retain_file=args.retain_file, overwrite=args.overwrite,
                             resume=args.resume, verbose=args.verbose, device=device, model_options=model_options,
                             selection=selection, evaluation=evaluation)
    say = PhaseReporter(inline=not args.verbose)
    done = unlearn(request, reporter=say)
    print(f"{method}: unlearned in {done.result.seconds:.1f}s, saved to {request.folder}  "
          f"(log: {request.folder / 'logs' / f'{method}.jsonl'})")
    if done.report is not None:
        from ..evaluation import format_report_table

        print(format_report_table({method: done.report}))
    if args.push_to_hub:
        _push(args, done, token, say)
    return 0


def unlearn_help(parser: argparse.ArgumentParser, method: str | None) -> int:
    """``unlearn --help``: the command's options, then the method's (or each method's config class)."""
    print(parser.format_help())
    if method:
        from transformers import HfArgumentParser

        from ..model_options import model_options_dataclass

        print(HfArgumentParser(model_options_dataclass(method_option_names(method)), add_help=False,
                               prog=f"hf-unlearn unlearn --method {method}",
                               description="Model options (trl.ModelConfig's): the dtype the model loads in and the "
                                           "LoRA adapter a trainer trains (its reference is then the base with the "
                                           "adapter disabled).").format_help())
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


def _push(args: argparse.Namespace, done: Any, token: str | None, say: Any) -> None:
    """``--push-to-hub``: the result with its model card (and the tokenizer beside changed weights)."""
    from ..hub import push_unlearned

    result = done.result
    in_phase(say, result.method, "push", lambda: push_unlearned(
        result, args.push_to_hub, report=done.report, token=token, forget_split=args.forget_split,
        dataset=args.data, base_model=args.model, selection=result.info.get("selection"),
        tokenizer=done.tokenizer if result.artifact is result.model else None,
    ), note=lambda commit: str(getattr(commit, "commit_url", commit)))
