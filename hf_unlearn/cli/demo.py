"""``hf-unlearn demo``: every method on the embedded synthetic set with tiny models (offline), side by side."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..options import UserError
from .common import report_failures, tiny_pair

DEFAULT_DEMO_DIR = "hf_unlearn_demo"


def add_parser(sub: Any) -> argparse.ArgumentParser:
    demo = sub.add_parser("demo", allow_abbrev=False,
                          help="every method on the embedded synthetic set with tiny models (offline)")
    demo.add_argument("--output", default=DEFAULT_DEMO_DIR, help="folder for demo.json / demo.md and logs/")
    demo.add_argument("--methods", nargs="+", help="subset of methods (default: all)")
    demo.add_argument("--cache-dir", default=None, help="model cache (default $HF_UNLEARN_CACHE or ~/.cache/hf_unlearn)")
    demo.add_argument("--no-quantization", action="store_true", help="skip the 4-bit NF4 re-check")
    demo.add_argument("--verbose", action="store_true", help="also print the per-step training logs")
    demo.set_defaults(func=cmd_demo)
    return demo


def cmd_demo(args: argparse.Namespace) -> int:
    from ..demo import build_tiny_pair, demo_methods, recipe_for, run_demo, write_demo_results

    known = demo_methods()
    methods = args.methods or known
    unknown = [m for m in methods if m not in known]
    if unknown:
        raise UserError(f"Unknown method(s) {unknown}; choose from {', '.join(sorted(known))}.")
    out = Path(args.output)
    print(f"hf-unlearn demo: synthetic fictitious authors, tiny Llama models, methods: {', '.join(methods)}")
    print(f"per-step training logs: {out / 'logs'}/<method>.jsonl")
    pair = tiny_pair(build_tiny_pair, "synthetic", "forget10", recipe_for("test"), args.cache_dir)
    results = run_demo(pair, methods, eval_kwargs={"max_new_tokens": 40}, quantization_check=not args.no_quantization,
                       log_dir=out / "logs", verbose=args.verbose)
    paths = write_demo_results(results, out, {"source": "synthetic", "forget_split": "forget10", "mode": "demo"})
    print()
    print(paths["markdown"].read_text())
    print(f"Results: {paths['json']}  table: {paths['markdown']}")
    return report_failures(results)
