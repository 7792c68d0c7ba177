"""MUSE-News-small: every method on a MUSE-News subset, each picking its own strength, scored by MUSE (C1-C4).

The subject's pair (:mod:`unlearn_bench.subjects.muse_news`) is built once and cached: ``tiny`` trains two small
Llama models from scratch (about a minute on 2 CPU cores), ``smollm2-135m`` fine-tunes SmolLM2-135M (for a machine
with native bfloat16 or a GPU). Each method unlearns the forget articles while keeping the retain texts, its
strength chosen by the reference-free selection criterion on holdout documents; the runner
(:mod:`unlearn_bench.muse_runner`) writes ``<output>.json``, ``<output>.md`` and ``<output>.png``.

    python benchmarks/muse_news.py --subject tiny --output benchmarks/results/muse_news_tiny
    python benchmarks/muse_news.py --subject tiny --methods grad_diff grom --output runs/muse_two
    python benchmarks/muse_news.py --subject smollm2-135m --data MUSE_NEWS_DIR --output benchmarks/results/muse_news_smollm2-135m

``--data`` is a local copy of MUSE-News (``raw/``, ``verbmem/``, ``knowmem/``, ``privleak/``); default
``$HF_UNLEARN_MUSE_DATA``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subject", choices=("tiny", "smollm2-135m"), default="tiny")
    parser.add_argument("--methods", nargs="+", default=None, help="registered method names (default: every one that takes documents)")
    parser.add_argument("--data", default=None, help="local MUSE-News folder (default: $HF_UNLEARN_MUSE_DATA)")
    parser.add_argument("--output", default=None, help="output path without suffix "
                        "(default: benchmarks/results/muse_news_<subject>)")
    parser.add_argument("--cache-dir", default=None, help="where the pair is cached (default: $HF_UNLEARN_CACHE)")
    parser.add_argument("--selection-steps", type=int, default=None, help="steps between criterion measurements")
    parser.add_argument("--retain-tolerance", type=float, default=None,
                        help="the selection criterion's retain tolerance (nats per token; default the criterion's)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    from unlearn_bench.muse_runner import run_muse_news
    from unlearn_bench.subjects.muse_news import format_muse_gate

    if args.threads:
        torch.set_num_threads(args.threads)
    command = "python benchmarks/muse_news.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    results, paths = run_muse_news(args.subject, args.methods, source=args.data, output=args.output,
                                   cache_dir=args.cache_dir, selection_steps=args.selection_steps,
                                   retain_tolerance=args.retain_tolerance, command=command)
    print(format_muse_gate(results["gate"]))
    print("\n".join(f"wrote {p}" for p in paths.values() if p is not None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
