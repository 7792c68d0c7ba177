"""GROM speed: ``fit_grom`` wall seconds against one plain forward pass over the rows GROM reads.

GROM reads every forget row and ``retain_sample`` retain rows (``--retain-sample``, default
``GROMConfig().retain_sample``; the same seeded sample ``fit_grom`` draws). The plain pass tokenizes
exactly those examples and runs the model once over them in batches of ``--batch-size`` (no hooks,
no gradients), the floor for any method that reads the data. GROM does the same tokenization and forward pass with key-collecting hooks, the layer
attribution, the float64 second moments and the Cholesky solve(s). One warm-up of each, then the
median of ``--repeats``, in wall and process-CPU seconds (on a shared machine use ``--threads 1``:
spinning OpenMP threads make both noisy); the target is GROM / plain <= 3. Prints a table and
writes JSON.

    python benchmarks/grom_speed.py --out runs/grom_speed.json
    python benchmarks/grom_speed.py --repeats 1 --threads 1 --target-modules lm_head   # smoke
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _median_seconds(fn, repeats: int) -> tuple[float, float, Any]:
    """Median wall and process-CPU seconds of ``fn()`` over ``repeats`` calls after one warm-up."""
    import torch

    wall, cpu, out = [], [], None
    for i in range(repeats + 1):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start, start_cpu = time.perf_counter(), time.process_time()
        out = fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        if i > 0:
            wall.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall), statistics.median(cpu), out


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from unlearn_bench.measure import load_speed_subject, plain_forward_seconds

    import hf_unlearn  # noqa: F401
    from hf_unlearn.methods.grom import GROMConfig, fit_grom, retain_subsample

    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer, forget, retain, device = load_speed_subject(
        args.model, args.cache_dir, args.device, args.source, args.forget_split)

    config = GROMConfig(
        target_modules=args.target_modules, layers="auto" if args.layers is None else args.layers,
        num_layers=args.num_layers, forget_weight=args.forget_weight, suppression_margin=args.suppression_margin,
        ridge=args.ridge, batch_size=args.batch_size, progress=False, seed=args.seed,
        retain_sample=None if args.retain_sample <= 0 else args.retain_sample,
    )
    read = [retain[i] for i in retain_subsample(len(retain), config.retain_sample, config.seed)]
    plain, plain_cpu, _ = _median_seconds(
        lambda: plain_forward_seconds(model, tokenizer, forget + read, args.batch_size), args.repeats
    )
    grom, grom_cpu, edit = _median_seconds(lambda: fit_grom(model, tokenizer, forget, retain, config), args.repeats)
    return {
        "model": args.model or "tofu-tiny (test recipe)",
        "device": str(device),
        "torch_threads": torch.get_num_threads(),
        "n_forget": len(forget),
        "n_retain": len(retain),
        "n_retain_read": len(read),
        "config": config.to_dict(),
        "edited_modules": list(edit.deltas),
        "selected_layers": edit.selected_layers,
        "num_forget_keys": edit.stats["num_forget_keys"],
        "num_retain_keys": edit.stats["num_retain_keys"],
        "forward_passes_over_data": edit.stats["forward_passes_over_data"],
        "plain_forward_seconds": plain,
        "grom_fit_seconds": grom,
        "grom_over_plain": grom / plain,
        "plain_forward_cpu_seconds": plain_cpu,
        "grom_fit_cpu_seconds": grom_cpu,
        "grom_over_plain_cpu": grom_cpu / plain_cpu,
        "target_ratio": 3.0,
        "repeats": args.repeats,
    }


def _table(r: dict[str, Any]) -> str:
    return "\n".join([
        f"GROM on {r['model']} ({r['device']}, {r['torch_threads']} threads): forget {r['n_forget']} / retain "
        f"{r['n_retain_read']} of {r['n_retain']} examples read, {r['num_forget_keys']} / {r['num_retain_keys']} keys, "
        f"edited {r['edited_modules']} (layers {r['selected_layers']})",
        "",
        "| clock | plain forward (s) | fit_grom (s) | GROM / plain | target |",
        "|:------|------------------:|-------------:|-------------:|-------:|",
        f"| wall | {r['plain_forward_seconds']:.3f} | {r['grom_fit_seconds']:.3f} | {r['grom_over_plain']:.2f} "
        f"| <= {r['target_ratio']:.0f} |",
        f"| process CPU | {r['plain_forward_cpu_seconds']:.3f} | {r['grom_fit_cpu_seconds']:.3f} "
        f"| {r['grom_over_plain_cpu']:.2f} | <= {r['target_ratio']:.0f} |",
    ])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from unlearn_bench.measure import add_speed_subject_arguments
    from unlearn_bench.report import run_speed_script

    from hf_unlearn.methods.grom import GROMConfig

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_speed_subject_arguments(parser)
    parser.add_argument("--target-modules", nargs="+", default=["down_proj"])
    parser.add_argument("--layers", type=int, nargs="+", default=None, help="explicit layers (default: auto)")
    parser.add_argument("--num-layers", type=int, default=None, help="auto band width (default: a tenth of the depth)")
    parser.add_argument("--retain-sample", type=int, default=GROMConfig().retain_sample,
                        help="retain rows read for X_r X_r^T (0: all)")
    parser.add_argument("--forget-weight", type=float, default=10.0)
    parser.add_argument("--suppression-margin", type=float, default=30.0)
    parser.add_argument("--ridge", type=float, default=1e-2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (1 gives stable timings on a busy machine)")
    return run_speed_script(parser, run, _table, argv)


if __name__ == "__main__":
    main()
