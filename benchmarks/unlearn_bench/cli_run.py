"""``unlearn-bench run``: every method side by side on TOFU-tiny, on a given model pair, or on a pretrained benchmark
subject (``--subject``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from hf_unlearn.cli.common import (
    AUTOCAST_CHOICES,
    DATA_HELP,
    autocast_dtype,
    report_failures,
    resolve_cli_device,
    tiny_pair,
)
from hf_unlearn.options import UserError


def add_parser(sub: Any) -> argparse.ArgumentParser:
    from hf_unlearn.data import FORGET_SPLITS
    from hf_unlearn.evaluation.generation import DEFAULT_MAX_NEW_TOKENS

    be = sub.add_parser("run", allow_abbrev=False,
                        help="every method side by side on TOFU-tiny (or a given model pair)")
    be.add_argument("--benchmark", choices=("tofu", "muse"), default="tofu",
                    help="tofu (default): TOFU forget quality and utility; muse: MUSE-News-small (documents; VerbMem, "
                         "KnowMem, PrivLeak), on the tiny pair or with --subject smollm2-135m")
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
    be.add_argument("--device", default="auto", help="where the harness runs: the pair's fine-tuning, every model it "
                    "loads, trains and evaluates; auto (default: CUDA when available, else the CPU), cpu, cuda or "
                    "cuda:N; recorded in the results")
    _add_subject_options(be)
    be.add_argument("--verbose", action="store_true", help="also print the per-step training logs")
    be.set_defaults(func=cmd_bench)
    return be


def _add_subject_options(be: argparse.ArgumentParser) -> None:
    """The options of ``bench --subject`` (TOFU-small on a pretrained model)."""
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
    be.add_argument("--authors", choices=("reported", "tuning"), default="reported",
                    help="with --subject: the forget10 authors to unlearn; reported (default): authors 1-4, the "
                         "published benchmark; tuning: authors 5-8, the split grids and defaults are chosen on "
                         "(results <name>_tuning.*)")
    be.add_argument("--build-only", action="store_true",
                    help="with --subject: build (or reuse) the target / retain reference pair and run its sanity gate")


def harness_device(args: argparse.Namespace) -> dict[str, str]:
    """``{"device": ...}`` for the harness's ``eval_kwargs`` (:func:`unlearn_bench.runner.run_comparison`), from
    ``--device`` (refused in one line when the machine lacks it); empty on a CPU-only machine left at ``auto`` or
    ``cpu``, where the harness runs on the CPU as it always has (and its result keys stay those of earlier runs)."""
    from hf_unlearn.devices import resolve_device

    device = resolve_cli_device(args)
    return {} if device == "cpu" and resolve_device(None) == "cpu" else {"device": device}


def bench_subject(args: argparse.Namespace, methods: list[str]) -> int:
    """``bench --subject NAME``: TOFU-small on a pretrained subject (:func:`unlearn_bench.runner.run_subject_bench`)."""
    from hf_unlearn.demo import format_gate

    from .report import markdown_table
    from .runner import run_subject_bench
    from .subjects import SUBJECTS, default_eval_autocast

    if args.subject not in SUBJECTS:
        raise UserError(f"Unknown subject {args.subject!r}; choose from tofu_tiny, {', '.join(sorted(SUBJECTS))}.")
    if args.model or args.retain_model or args.split != "forget10":
        raise UserError("--subject builds its own TOFU-small pair (forget10 authors); drop --model/--retain-model/--split.")
    eval_kwargs: dict[str, Any] = {"max_new_tokens": args.max_new_tokens, **harness_device(args)}
    if args.max_examples is not None:
        eval_kwargs["max_examples"] = args.max_examples
    autocast = autocast_dtype(args.eval_autocast, default=default_eval_autocast())
    if autocast is not None:
        eval_kwargs["autocast_dtype"] = autocast
    results, paths = run_subject_bench(
        args.subject, methods, source=args.data, output_dir=args.output_dir, cache_dir=args.cache_dir,
        build_only=args.build_only, grid=not args.no_grid, eval_kwargs=eval_kwargs,
        quantization_check=not args.no_quantization, progress=True, verbose=args.verbose,
        attacks=args.attacks, layout=args.layout, bar=args.bar, resume=args.resume, select=args.select,
        selection_steps=args.selection_steps, authors=args.authors,
    )
    if paths is None:
        print(format_gate(results))
        print(f"target: {results['target']}\nretain reference: {results['retain_reference']}")
        return 0 if results["passed"] else 1
    print()
    print(markdown_table(results))
    print(format_gate(results["sanity_gate"]))
    print(f"Results: {paths['json']}  plot: {paths['png']}")
    return report_failures(results)


def bench_muse(args: argparse.Namespace, methods: list[str] | None) -> int:
    """``bench --benchmark muse``: MUSE-News-small (:func:`unlearn_bench.muse_runner.run_muse_news`), on the
    tiny pair (default) or ``--subject smollm2-135m``; ``--data`` is a local MUSE-News folder."""
    from .muse_runner import run_muse_news
    from .subjects.muse_news import format_muse_gate

    subject = "tiny" if args.subject in (None, "tofu_tiny") else args.subject
    if subject not in ("tiny", "smollm2-135m"):
        raise UserError(f"--benchmark muse runs on the tiny pair or --subject smollm2-135m, not {args.subject!r}.")
    if args.model or args.retain_model:
        raise UserError("--benchmark muse builds its own MUSE-News pair; drop --model/--retain-model.")
    output = Path(args.output_dir) / f"muse_news_{subject.replace('-', '_')}"
    results, paths = run_muse_news(subject, methods, source=args.data, output=output, cache_dir=args.cache_dir,
                                   selection_steps=args.selection_steps,
                                   command="unlearn-bench run --benchmark muse")
    print(format_muse_gate(results["gate"]))
    print(paths["markdown"].read_text())
    print(f"Results: {paths['json']}  plot: {paths['png']}")
    return report_failures(results)


def cmd_bench(args: argparse.Namespace) -> int:
    from hf_unlearn.demo import TinyPair, build_tiny_pair, recipe_for

    from .registry import PRESETS
    from .report import write_results
    from .runner import run_comparison

    methods = args.methods or list(PRESETS)
    unknown = [m for m in methods if m not in PRESETS]
    if unknown:
        raise UserError(f"Unknown method(s) {unknown}; choose from {', '.join(sorted(PRESETS))}.")
    if args.attacks:
        from hf_unlearn.evaluation.attacks import check_attack_options, parse_attacks

        try:
            check_attack_options(parse_attacks(args.attacks))
        except ValueError as err:
            raise UserError(str(err)) from None
    resolve_cli_device(args)  # a device the machine lacks is refused before any work
    if args.benchmark == "muse":
        return bench_muse(args, args.methods)
    if args.subject not in (None, "tofu_tiny"):
        return bench_subject(args, methods)
    if args.build_only:
        raise UserError("--build-only needs --subject (e.g. --subject smollm2-135m); for TOFU-tiny use `unlearn-bench tiny`.")
    if args.model:
        if not args.retain_model:
            raise UserError("--model needs --retain-model (the model fine-tuned on the retain split only).")
        pair = TinyPair(Path(args.model), Path(args.retain_model), args.data, args.split)
    else:
        pair = tiny_pair(build_tiny_pair, args.data, args.split, recipe_for(args.size), args.cache_dir)
    out = Path(args.output_dir)
    eval_kwargs: dict[str, Any] = {"max_new_tokens": args.max_new_tokens, "max_examples": args.max_examples,
                                   **harness_device(args)}
    autocast = autocast_dtype(args.eval_autocast)
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
            "device": resolve_cli_device(args),
            "target": str(pair.target), "retain_reference_model": str(pair.retain), "seed": 0}
    paths = write_results(results, out, name, meta)
    print()
    print(paths["markdown"].read_text())
    print(f"Results: {paths['json']}  plot: {paths['png']}")
    return report_failures(results)
