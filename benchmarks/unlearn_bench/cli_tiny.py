"""``unlearn-bench tiny``: build (or reuse) the TOFU-tiny target and retain reference, and run the sanity gate."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from hf_unlearn.cli.common import DATA_HELP, tiny_pair


def add_parser(sub: Any) -> argparse.ArgumentParser:
    from hf_unlearn.data import FORGET_SPLITS

    tiny = sub.add_parser("tiny", allow_abbrev=False,
                          help="build (or reuse) the TOFU-tiny target and retain reference, run the sanity gate")
    tiny.add_argument("--data", default=None, help=DATA_HELP)
    tiny.add_argument("--split", default="forget10", choices=FORGET_SPLITS)
    tiny.add_argument("--size", default="bench", help="bench, tofu-test or test")
    tiny.add_argument("--max-examples", type=int, default=None)
    tiny.add_argument("--cache-dir", default=None)
    tiny.set_defaults(func=cmd_tiny)
    return tiny


def cmd_tiny(args: argparse.Namespace) -> int:
    from hf_unlearn.demo import build_tiny_pair, format_gate, recipe_for, reference_rows, sanity_gate
    from hf_unlearn.evaluation import write_json_atomic

    pair = tiny_pair(build_tiny_pair, args.data, args.split, recipe_for(args.size), args.cache_dir)
    target_report, retain_report = reference_rows(pair, args.data, args.split, {"max_examples": args.max_examples})
    gate = sanity_gate(target_report, retain_report)
    gate.update(target=str(pair.target), retain_reference=str(pair.retain), source=args.data, forget_split=args.split, size=args.size)
    write_json_atomic(gate, Path(pair.target) / "sanity_gate.json")
    print(format_gate(gate))
    print(f"target: {pair.target}\nretain reference: {pair.retain}")
    return 0 if gate["passed"] else 1
