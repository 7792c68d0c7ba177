"""The `hf-unlearn` command line: `demo`, `unlearn`, `eval` and `bench`.

User mistakes (unknown method, missing path, unreachable Hub) end with one clear error line and
exit status 2, not a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

DEFAULT_DEMO_DIR = "hf_unlearn_demo"


class UserError(Exception):
    """A mistake in the command line or its inputs: reported as one line."""


def _parse_set(values: list[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in values or []:
        if "=" not in item:
            raise UserError(f"--set expects KEY=VALUE, got {item!r}.")
        key, raw = item.split("=", 1)
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def _load_model(name_or_path: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not os.path.isdir(name_or_path) and (name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1):
        raise UserError(f"Model folder {name_or_path} does not exist.")
    try:
        return AutoModelForCausalLM.from_pretrained(name_or_path), AutoTokenizer.from_pretrained(name_or_path)
    except OSError as err:
        raise UserError(
            f"Could not load model {name_or_path!r} ({err.__class__.__name__}). Without network access, "
            "pass a local model folder."
        ) from err


def cmd_demo(args: argparse.Namespace) -> int:
    from .bench.registry import METHODS
    from .bench.runner import run_comparison, write_results
    from .bench.subjects import build_tiny_pair, recipe_for

    methods = args.methods or list(METHODS)
    print(f"hf-unlearn demo: synthetic fictitious authors, tiny Llama models, methods: {', '.join(methods) or 'none'}")
    pair = build_tiny_pair("synthetic", "forget10", recipe_for("test"), cache_dir=args.cache_dir, progress=True)
    results = run_comparison(
        pair, methods, grid=False, source="synthetic", forget_split="forget10",
        eval_kwargs={"max_new_tokens": 40}, quantization_check=not args.no_quantization, progress=True,
    )
    paths = write_results(results, args.output, "demo", {"source": "synthetic", "forget_split": "forget10", "mode": "demo"})
    print()
    print(paths["markdown"].read_text())
    failed = [m for m, r in results["rows"].items() if r.get("error")]
    print(f"Results: {paths['json']}  table: {paths['markdown']}  plot: {paths['png']}")
    if failed:
        print(f"Failed methods: {', '.join(failed)} (see 'error' in {paths['json']})", file=sys.stderr)
        return 1
    return 0


def cmd_unlearn(args: argparse.Namespace) -> int:
    from .bench.registry import METHODS, run_method
    from .data import RETAIN_FOR_FORGET, load_tofu_rows

    if args.method not in METHODS:
        raise UserError(f"Unknown method {args.method!r}; choose from {', '.join(sorted(METHODS))}.")
    settings = dict(METHODS[args.method].demo)
    settings.update(_parse_set(args.set))
    model, tokenizer = _load_model(args.model)
    forget = load_tofu_rows(args.forget_split, args.data)
    retain = load_tofu_rows(RETAIN_FOR_FORGET[args.forget_split], args.data)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    result = run_method(args.method, model, tokenizer, forget, retain, out, settings)
    result.save_pretrained(out)
    if result.weights_changed and result.artifact is result.model:
        tokenizer.save_pretrained(out)
    print(f"{args.method}: unlearned in {result.seconds:.1f}s, saved to {out}")
    report = None
    if args.eval:
        from .evaluation import evaluate_tofu

        report = evaluate_tofu(
            result.model, tokenizer, source=args.data, forget_split=args.forget_split,
            retain_reference=args.retain_reference, scorer=result.scorer, generation_kwargs=result.generation_kwargs,
            output_path=out / "tofu_report.json",
        )
        from .evaluation import format_report_table

        print(format_report_table({args.method: report}))
    if args.push_to_hub:
        from .hub import push_unlearned

        commit = push_unlearned(
            result, args.push_to_hub, report=report, forget_split=args.forget_split, dataset=args.data,
            base_model=args.model, tokenizer=tokenizer if result.artifact is result.model else None,
        )
        print(f"pushed to {args.push_to_hub}: {getattr(commit, 'commit_url', commit)}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from .evaluation import evaluate_tofu, format_report_table, save_truth_ratios

    if args.retain_reference and not os.path.isfile(args.retain_reference):
        raise UserError(f"Retain reference {args.retain_reference} does not exist.")
    model, tokenizer = _load_model(args.model)
    report = evaluate_tofu(
        model, tokenizer, source=args.data, forget_split=args.forget_split, retain_reference=args.retain_reference,
        batch_size=args.batch_size, max_new_tokens=args.max_new_tokens, max_examples=args.max_examples,
        output_path=args.output,
    )
    if args.save_truth_ratios:
        save_truth_ratios(report, args.save_truth_ratios)
    print(format_report_table({Path(args.model).name: report}))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench.registry import METHODS
    from .bench.runner import run_comparison, write_results
    from .bench.subjects import TinyPair, build_tiny_pair, recipe_for

    methods = args.methods or list(METHODS)
    if args.model:
        if not args.retain_model:
            raise UserError("--model needs --retain-model (the model fine-tuned on the retain split only).")
        pair = TinyPair(Path(args.model), Path(args.retain_model), args.data, args.split)
    else:
        pair = build_tiny_pair(args.data, args.split, recipe_for(args.size), cache_dir=args.cache_dir, progress=True)
    results = run_comparison(
        pair, methods, grid=not args.no_grid, source=args.data, forget_split=args.split,
        eval_kwargs={"max_new_tokens": args.max_new_tokens, "max_examples": args.max_examples},
        quantization_check=not args.no_quantization, progress=True,
    )
    name = f"tofu_tiny_{args.split}" if not args.model else f"bench_{args.split}"
    meta = {"source": args.data, "forget_split": args.split, "size": args.size, "mode": "bench",
            "target": str(pair.target), "retain_reference_model": str(pair.retain), "seed": 0}
    paths = write_results(results, args.output_dir, name, meta)
    print(paths["markdown"].read_text())
    print(f"Results: {paths['json']}  plot: {paths['png']}")
    return 0


def cmd_tiny(args: argparse.Namespace) -> int:
    from .bench.runner import format_gate, reference_rows, sanity_gate
    from .bench.subjects import build_tiny_pair, recipe_for
    from .evaluation import write_json_atomic

    pair = build_tiny_pair(args.data, args.split, recipe_for(args.size), cache_dir=args.cache_dir, progress=True)
    target_report, retain_report = reference_rows(pair, args.data, args.split, {"max_examples": args.max_examples})
    gate = sanity_gate(target_report, retain_report)
    gate.update(target=str(pair.target), retain_reference=str(pair.retain), source=args.data, forget_split=args.split, size=args.size)
    write_json_atomic(gate, Path(pair.target) / "sanity_gate.json")
    print(format_gate(gate))
    print(f"target: {pair.target}\nretain reference: {pair.retain}")
    return 0 if gate["passed"] else 1


def build_parser() -> argparse.ArgumentParser:
    from .data import FORGET_SPLITS, TOFU_HUB_ID

    parser = argparse.ArgumentParser(prog="hf-unlearn", description="Machine unlearning for causal LMs on the Hugging Face stack.")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="every method on the embedded synthetic set with tiny models (offline)")
    demo.add_argument("--output", default=DEFAULT_DEMO_DIR, help="folder for demo.json / demo.md / demo.png")
    demo.add_argument("--methods", nargs="+", help="subset of methods (default: all)")
    demo.add_argument("--cache-dir", default=None, help="model cache (default $HF_UNLEARN_CACHE or ~/.cache/hf_unlearn)")
    demo.add_argument("--no-quantization", action="store_true", help="skip the 4-bit NF4 re-check")
    demo.set_defaults(func=cmd_demo)

    un = sub.add_parser("unlearn", help="unlearn a forget split from a model and save the result")
    un.add_argument("--method", required=True, help="grom, t3, masc, atwu, grad_ascent, grad_diff, npo or simnpo")
    un.add_argument("--model", required=True, help="model folder or Hub id")
    un.add_argument("--data", default=TOFU_HUB_ID, help=f"Hub id ({TOFU_HUB_ID}), local folder of <config>.jsonl, or 'synthetic'")
    un.add_argument("--forget-split", default="forget10", choices=FORGET_SPLITS)
    un.add_argument("--output", required=True, help="output folder")
    un.add_argument("--set", nargs="*", metavar="KEY=VALUE", help="method settings (JSON values), e.g. learning_rate=1e-5")
    un.add_argument("--eval", action="store_true", help="run the TOFU evaluator on the result")
    un.add_argument("--retain-reference", help="JSON of the retain model's forget truth ratios (for forget quality)")
    un.add_argument("--push-to-hub", metavar="REPO", help="push the result with a model card")
    un.set_defaults(func=cmd_unlearn)

    ev = sub.add_parser("eval", help="TOFU evaluation of a model")
    ev.add_argument("--model", required=True, help="model folder or Hub id")
    ev.add_argument("--data", default=TOFU_HUB_ID)
    ev.add_argument("--forget-split", default="forget10", choices=FORGET_SPLITS)
    ev.add_argument("--retain-reference", help="JSON of the retain model's forget truth ratios")
    ev.add_argument("--save-truth-ratios", help="write this model's forget truth ratios (use for a retain model)")
    ev.add_argument("--output", help="report JSON path")
    ev.add_argument("--batch-size", type=int, default=16)
    ev.add_argument("--max-new-tokens", type=int, default=64)
    ev.add_argument("--max-examples", type=int, default=None)
    ev.set_defaults(func=cmd_eval)

    tiny = sub.add_parser("tiny", help="build (or reuse) the TOFU-tiny target and retain reference, run the sanity gate")
    tiny.add_argument("--data", default=None, help="TOFU source (default: ../shared/data/tofu if present, else locuslab/TOFU)")
    tiny.add_argument("--split", default="forget10", choices=FORGET_SPLITS)
    tiny.add_argument("--size", default="bench", help="bench, tofu-test or test")
    tiny.add_argument("--max-examples", type=int, default=None)
    tiny.add_argument("--cache-dir", default=None)
    tiny.set_defaults(func=cmd_tiny)

    be = sub.add_parser("bench", help="every method side by side on TOFU-tiny (or a given model pair)")
    be.add_argument("--split", default="forget10", choices=FORGET_SPLITS)
    be.add_argument("--data", default=None, help="TOFU source: Hub id or local folder (default: ../shared/data/tofu if present, else locuslab/TOFU)")
    be.add_argument("--size", default="bench", help="TOFU-tiny size: bench or tofu-test")
    be.add_argument("--model", help="target model (Hub id or folder) instead of TOFU-tiny")
    be.add_argument("--retain-model", help="retain reference model, with --model")
    be.add_argument("--methods", nargs="+")
    be.add_argument("--no-grid", action="store_true", help="one (default) setting per method instead of the grid")
    be.add_argument("--no-quantization", action="store_true")
    be.add_argument("--max-examples", type=int, default=None)
    be.add_argument("--max-new-tokens", type=int, default=64)
    be.add_argument("--output-dir", default="benchmarks/results")
    be.add_argument("--cache-dir", default=None)
    be.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "command", None) in ("bench", "tiny") and args.data is None:
        local = Path.cwd().parent / "shared" / "data" / "tofu"
        args.data = str(local) if local.is_dir() else "locuslab/TOFU"
    try:
        return int(args.func(args) or 0)
    except UserError as err:
        print(f"hf-unlearn: error: {err}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError, ConnectionError) as err:
        print(f"hf-unlearn: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
