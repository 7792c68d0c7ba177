"""T3 speed: classifier fit seconds and generation tokens/s of T3 against plain ``generate``.

Fits a T3 guidance head on the TOFU-tiny target (synthetic ``forget10`` vs ``retain90``; or ``--model``
/ ``--source`` for a real model and TOFU copy), reporting its fit time in two parts (caching the pooled
states, training the head), then times greedy generation of ``--max-new-tokens`` tokens (EOS
suppressed until then, so both runs produce the same number of tokens) for forget and retain
questions at each batch size, plain and with :class:`~hf_unlearn.methods.t3.T3LogitsProcessor`, in the same
process (one warm-up each, then plain and T3 alternately ``--repeats`` times; medians). The
processor reads the hidden states of generate's own forward passes, so the target is >= 0.9x plain.
Prints a table and writes JSON.

    python benchmarks/t3_speed.py --out runs/t3_speed.json
    python benchmarks/t3_speed.py --repeats 1 --batch-sizes 1 4 --max-new-tokens 16   # smoke
"""

from __future__ import annotations

import argparse
import os
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import LogitsProcessorList
    from unlearn_bench.measure import generation_speed, load_speed_subject

    import hf_unlearn  # noqa: F401
    from hf_unlearn.methods.t3 import T3ClassifierConfig, T3LogitsProcessor, fit_t3

    torch.manual_seed(args.seed)
    model, tokenizer, forget, retain, device = load_speed_subject(
        args.model, args.cache_dir, args.device, args.source, args.forget_split)

    config = T3ClassifierConfig(rank=args.rank, layer=args.layer, steps=args.fit_steps,
                                temperature=args.temperature, tilt_weight=args.tilt_weight)
    clf = fit_t3(model, tokenizer, forget, retain, config, progress=not args.quiet)
    fit = {k: clf.fit_report[k] for k in (
        "fit_seconds", "cache_seconds", "train_seconds", "heldout_balanced_accuracy", "trainable_parameters",
        "parameter_share", "n_forget_positions", "n_retain_positions")}

    questions = [r["question"] for pair in zip(forget, retain) for r in pair]
    rows = []
    for batch_size in args.batch_sizes:
        with T3LogitsProcessor(model, clf) as t3:
            speed = generation_speed(model, tokenizer, questions[:batch_size], LogitsProcessorList([t3]),
                                     args.max_new_tokens, args.repeats)
        n_tokens = batch_size * args.max_new_tokens
        rows.append({
            "batch_size": batch_size,
            "plain_tokens_per_s": speed["plain_tokens_per_s"],
            "t3_tokens_per_s": speed["tokens_per_s"],
            "t3_speed_ratio": speed["speed_ratio"],
            "plain_seconds": n_tokens / speed["plain_tokens_per_s"],
            "t3_seconds": n_tokens / speed["tokens_per_s"],
        })
    return {
        "model": args.model or "tofu-tiny (test recipe)",
        "device": str(device),
        "torch_threads": torch.get_num_threads(),
        "settings": {k: getattr(args, k) for k in (
            "forget_split", "source", "rank", "layer", "temperature", "tilt_weight", "max_new_tokens",
            "repeats", "fit_steps")},
        "fit": fit,
        "generation": rows,
    }


def _table(result: dict[str, Any]) -> str:
    fit = result["fit"]
    lines = [
        f"T3 fit: {fit['fit_seconds']:.2f} s (cache {fit['cache_seconds']:.2f} s + head {fit['train_seconds']:.2f} s), "
        f"held-out balanced accuracy {fit['heldout_balanced_accuracy']:.3f}, "
        f"{fit['trainable_parameters']} parameters ({100 * fit['parameter_share']:.3f}% of the base)",
        "",
        "| batch | plain tok/s | T3 tok/s | T3 / plain |",
        "|------:|------------:|---------:|-----------:|",
    ]
    for r in result["generation"]:
        lines.append(
            f"| {r['batch_size']} | {r['plain_tokens_per_s']:.1f} | {r['t3_tokens_per_s']:.1f} | {r['t3_speed_ratio']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from unlearn_bench.measure import add_speed_subject_arguments
    from unlearn_bench.report import run_speed_script

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_speed_subject_arguments(parser)
    parser.add_argument("--rank", type=int, default=20)
    parser.add_argument("--layer", type=int, default=-1)
    parser.add_argument("--fit-steps", type=int, default=None,
                        help="cap on the head's optimizer steps (default: none; early stopping decides)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--tilt-weight", type=float, default=1.0)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[16, 1])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    return run_speed_script(parser, run, _table, argv)


if __name__ == "__main__":
    main()
