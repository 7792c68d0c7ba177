"""Selection cost: every candidate of T3's calibration and of GROM's strength path against one criterion pass.

One :class:`~hf_unlearn.selection.SelectionCriterion` over ``--rows`` forget, holdout and retain-validation rows
each. The unit is one plain criterion pass (``criterion.measure(model, tokenizer)``: four scoring passes over the
rows; median of ``--repeats`` after a warm-up). Then, in the same process and with a fresh criterion each time
(so the original model's figures are part of the work):

* T3: the head is fitted once (not counted), then :func:`~hf_unlearn.methods.t3.calibrate_t3` scores its default
  grid (16 points) from one pass of the frozen base (``cached``), and with one tilted pass per point
  (``uncached``);
* GROM: :func:`~hf_unlearn.methods.grom.fit_grom_path` fits once and solves the default 9 points (fit reported
  apart), then :meth:`~hf_unlearn.methods.grom.GROMPath.select` measures them from the hidden states cached at the
  edited band (``cached``: one caching pass, whole only where the original's figures need it, then per point the
  blocks from the band on and the head on the scored tokens), and with one full pass per point (``uncached``).
  ``points_over_plain`` is the points' share alone, beyond the caching pass.

Reported per method: seconds and the ratio to the plain pass, the resident memory each adds over the loaded model
(:class:`~unlearn_bench.measure.PeakMemory`) and its ratio to the plain pass's, and for GROM the bytes of the
band cache and of the kept unit edits. ``--shape smollm2-135m`` runs on a randomly initialised model of
SmolLM2-135M's shape (30 layers, hidden 576, vocabulary 49,152; the cost structure of the real model without its
weights) with the tiny tokenizer; combine it with ``--layers 27 28 29`` (the band the v2 run selected).

    python benchmarks/selection_cost.py --out runs/selection_cost.json
    python benchmarks/selection_cost.py --shape smollm2-135m --rows 24 --layers 27 28 29 --skip-uncached --threads 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SMOLLM2_135M_SHAPE = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                          num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                          tie_word_embeddings=True, rope_theta=100000.0)


def _subject(args: argparse.Namespace) -> tuple[Any, Any, list, list, list]:
    import torch
    from unlearn_bench.measure import load_speed_subject

    from hf_unlearn.data import HOLDOUT_FOR_FORGET, load_tofu_rows

    model, tokenizer, forget, retain, device = load_speed_subject(
        None if args.shape else args.model, args.cache_dir, args.device, args.source, args.forget_split)
    if args.shape:
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(args.seed)
        model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M_SHAPE, pad_token_id=tokenizer.pad_token_id)).to(device)
        model.eval()
    holdout = load_tofu_rows(HOLDOUT_FOR_FORGET[args.forget_split], args.source)
    return model, tokenizer, forget, retain, holdout


def _timed(fn, memory: bool = True) -> tuple[float, float | None, Any]:
    """``(seconds, MB added over what the process held, result)`` of ``fn()``."""
    from unlearn_bench.measure import PeakMemory

    with PeakMemory() as mem:
        start = time.perf_counter()
        out = fn()
        seconds = time.perf_counter() - start
    return seconds, mem.added_mb if memory else None, out


def _quiet(fn):
    def run():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the rule's fall-back warnings
            return fn()

    return run


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    import hf_unlearn  # noqa: F401
    from hf_unlearn.methods.grom import GROMConfig, fit_grom_path
    from hf_unlearn.methods.t3 import T3ClassifierConfig, calibrate_t3, fit_t3
    from hf_unlearn.selection import SelectionCriterion

    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer, forget, retain, holdout = _subject(args)
    n = args.rows
    rows = {"forget": forget[:n], "holdout": holdout[:n], "retain_validation": retain[-n:]}
    fit_retain = retain[: min(4 * n, max(1, len(retain) - n))]  # the fits are not what is measured

    def criterion() -> SelectionCriterion:
        return SelectionCriterion(rows["forget"], rows["holdout"], rows["retain_validation"],
                                  batch_size=args.batch_size)

    criterion().measure(model, tokenizer)  # warm-up
    plain = [_timed(lambda: criterion().measure(model, tokenizer)) for _ in range(args.repeats)]
    plain_s = statistics.median(p[0] for p in plain)
    plain_mb = max(p[1] for p in plain)
    out: dict[str, Any] = {
        "model": args.model or ("random-init " + args.shape if args.shape else "tofu-tiny (test recipe)"),
        "device": str(next(model.parameters()).device), "torch_threads": torch.get_num_threads(),
        "rows_per_set": {k: len(v) for k, v in rows.items()}, "batch_size": args.batch_size,
        "plain_pass_seconds": plain_s, "plain_pass_added_mb": plain_mb, "repeats": args.repeats,
        "targets": {"seconds_ratio": 1.5, "memory_ratio": 2.0},
    }

    def ratios(row: dict[str, Any]) -> dict[str, Any]:
        for mode in ("cached", "uncached"):
            if row.get(f"{mode}_seconds") is not None:
                row[f"{mode}_over_plain"] = row[f"{mode}_seconds"] / plain_s
                row[f"{mode}_memory_over_plain"] = row[f"{mode}_added_mb"] / max(plain_mb, 1e-9)
        return row

    if "t3" in args.methods:
        fit_s, _, head = _timed(lambda: fit_t3(model, tokenizer, rows["forget"], fit_retain,
                                               T3ClassifierConfig(rank=args.rank), steps=args.fit_steps,
                                               progress=False), memory=False)
        t3: dict[str, Any] = {"fit_seconds": fit_s}
        t3["cached_seconds"], t3["cached_added_mb"], record = _timed(
            _quiet(lambda: calibrate_t3(model, tokenizer, head, criterion())))
        t3["num_candidates"] = len(record.candidates)
        if not args.skip_uncached:
            t3["uncached_seconds"], t3["uncached_added_mb"], slow = _timed(
                _quiet(lambda: calibrate_t3(model, tokenizer, head, criterion(), cached=False)))
            t3["same_choice"] = slow.index == record.index
        out["t3"] = ratios(t3)

    if "grom" in args.methods:
        config = GROMConfig(target_modules=args.target_modules, layers="auto" if args.layers is None else args.layers,
                            retain_sample=args.retain_sample, batch_size=args.batch_size, progress=False,
                            seed=args.seed)
        fit_s, _, path = _timed(lambda: fit_grom_path(model, tokenizer, rows["forget"], fit_retain, config),
                                memory=False)
        grom: dict[str, Any] = {
            "fit_seconds": fit_s, "num_candidates": len(path), "edited_modules": sorted(path.unit_deltas[0]),
            "selected_layers": path.base.selected_layers,
            "unit_deltas_mb": sum(t.numel() * t.element_size() for u in path.unit_deltas for t in u.values()) / 2**20,
        }
        grom["cached_seconds"], grom["cached_added_mb"], _ = _timed(
            _quiet(lambda: path.select(criterion(), model, tokenizer, cache_device=args.cache_device)))
        grom["band_cache_mb"] = (path.cache_bytes or 0) / 2**20
        grom["caching_pass_seconds"] = path.cache_seconds
        if path.cache_seconds is not None:  # the points alone, beyond the pass that caches the band and the original
            grom["points_over_plain"] = (grom["cached_seconds"] - path.cache_seconds) / plain_s
        cached_index = path.record.index
        if not args.skip_uncached:
            grom["uncached_seconds"], grom["uncached_added_mb"], _ = _timed(
                _quiet(lambda: path.select(criterion(), model, tokenizer, cached=False)))
            grom["same_choice"] = path.record.index == cached_index
        out["grom"] = ratios(grom)
    return out


def _table(r: dict[str, Any]) -> str:
    lines = [
        f"Selection cost on {r['model']} ({r['device']}, {r['torch_threads']} threads), rows per set "
        f"{r['rows_per_set']}: one plain criterion pass {r['plain_pass_seconds']:.3f} s, "
        f"+{r['plain_pass_added_mb']:.1f} MB",
        "",
        "| method | candidates | mode | seconds | / plain pass | added MB | / plain pass |",
        "|:-------|-----------:|:-----|--------:|-------------:|---------:|-------------:|",
    ]
    for method in ("t3", "grom"):
        row = r.get(method)
        if not row:
            continue
        for mode in ("cached", "uncached"):
            if row.get(f"{mode}_seconds") is None:
                continue
            lines.append(
                f"| {method} | {row['num_candidates']} | {mode} | {row[f'{mode}_seconds']:.3f} | "
                f"{row[f'{mode}_over_plain']:.2f} | {row[f'{mode}_added_mb']:.1f} | "
                f"{row[f'{mode}_memory_over_plain']:.2f} |")
    if r.get("grom"):
        g = r["grom"]
        lines += ["", f"GROM edits {g['edited_modules']} (layers {g['selected_layers']}); band cache "
                      f"{g['band_cache_mb']:.1f} MB, kept unit edits {g['unit_deltas_mb']:.1f} MB"]
        if g.get("caching_pass_seconds") is not None:
            lines.append(f"GROM's caching pass (band inputs and the original's figures) "
                         f"{g['caching_pass_seconds']:.3f} s; its {g['num_candidates']} points beyond it "
                         f"{g['points_over_plain']:.2f} plain passes")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from unlearn_bench.measure import add_speed_subject_arguments
    from unlearn_bench.report import run_speed_script

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_speed_subject_arguments(parser)
    parser.add_argument("--shape", choices=["smollm2-135m"], default=None,
                        help="a randomly initialised model of this shape instead of --model")
    parser.add_argument("--methods", nargs="+", default=["t3", "grom"], choices=["t3", "grom"])
    parser.add_argument("--rows", type=int, default=20, help="rows in each of the criterion's three sets")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3, help="timed plain passes (median)")
    parser.add_argument("--rank", type=int, default=20, help="T3 head rank")
    parser.add_argument("--fit-steps", type=int, default=30, help="T3 head optimizer steps (the fit is not timed)")
    parser.add_argument("--target-modules", nargs="+", default=["down_proj"])
    parser.add_argument("--layers", type=int, nargs="+", default=None, help="GROM's band (default: auto)")
    parser.add_argument("--retain-sample", type=int, default=64, help="retain rows GROM reads")
    parser.add_argument("--cache-device", default=None, help="where GROM keeps the band inputs (default: the model's)")
    parser.add_argument("--skip-uncached", action="store_true", help="time only the cached selection")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    return run_speed_script(parser, run, _table, argv)


if __name__ == "__main__":
    main()
