"""GROM end to end against one plain forward pass over the rows GROM reads, in one process.

``run`` (the tiny model, or any local model with ``--model``) times, in order::

    load    AutoModelForCausalLM.from_pretrained of the model saved to a temporary folder
    fit     fit_grom_path: the key collection, the solve and the exact strength path (default 9 points)
    select  GROMPath.select with a SelectionCriterion (forget rows, holdout rows, retain-validation rows)
    save    GROMEdit.save_pretrained of the chosen edit (LoRA factors, audit, metadata, digests)

and the plain pass: tokenizing exactly the rows the fit reads (every forget row and GROM's seeded retain sample)
and one no-grad forward over them in the same batches. The figure is ``(load + fit + select + save) / plain``;
the goal is <= 1.5. Forget rows: TOFU forget10 authors 1-4 (its first 80 rows) from ``--source``.

``--export-shape D_OUT D_IN S`` adds a real-width measurement of the export alone (no model): a random ``s``-key
problem on one ``d_out x d_in`` module (Llama-3.1-8B's ``down_proj`` is ``4096 x 14336``; TOFU forget10 authors
1-4 give about 3,200 answer-token keys), timing the solve (Cholesky of the ``d_in x d_in`` normal matrix and
``P``), the export from the low-rank form (:func:`~hf_unlearn.methods.grom.peft_export.lora_factors`) and, with
``--dense-svd``, the float64 SVD of the dense ``P`` it replaces.

    python benchmarks/grom_speed.py --source ../shared/data/tofu --threads 1 --out grom_speed.json
    python benchmarks/grom_speed.py --skip-run --export-shape 4096 14336 3200 --threads 2
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

FORGET_AUTHORS_1_TO_4 = slice(0, 80)  # TOFU forget10: 20 rows per author


def _seconds(fn, *args: Any) -> tuple[float, Any]:
    """``(wall seconds, fn(*args))``, the device synchronised before and after."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn(*args)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start, out


def _rows(source: str, n_holdout: int, n_validation: int) -> tuple[list, list, list, list]:
    from hf_unlearn.data import HOLDOUT_FOR_FORGET, RETAIN_FOR_FORGET, load_tofu_rows

    forget = load_tofu_rows("forget10", source)[FORGET_AUTHORS_1_TO_4]
    retain = load_tofu_rows(RETAIN_FOR_FORGET["forget10"], source)
    holdout = load_tofu_rows(HOLDOUT_FOR_FORGET["forget10"], source)[:n_holdout]
    fit_retain, validation = retain[:-n_validation], retain[-n_validation:]
    return forget, fit_retain, holdout, validation


def _load(folder: str, device: Any) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype="auto", trust_remote_code=False).to(device).eval()


def run_end_to_end(args: argparse.Namespace) -> dict[str, Any]:
    """The four timed steps and the plain pass (see the module docstring), ``args.repeats`` times each."""
    import warnings

    import torch
    from unlearn_bench.measure import load_speed_subject, plain_forward_seconds

    from hf_unlearn.methods.grom import GROMConfig, fit_grom_path
    from hf_unlearn.methods.grom.inputs import retain_subsample
    from hf_unlearn.selection import SelectionCriterion

    model, tokenizer, _, _, device = load_speed_subject(args.model, args.cache_dir, args.device, "synthetic",
                                                        "forget10")
    forget, retain, holdout, validation = _rows(args.source, args.criterion_rows, args.criterion_rows)
    config = GROMConfig(layers="auto" if args.layers is None else args.layers, target_modules=args.target_modules,
                        batch_size=args.batch_size, progress=False, seed=args.seed)
    read = [retain[i] for i in retain_subsample(len(retain), config.retain_sample, config.seed)]
    steps: dict[str, list[float]] = {"load": [], "fit": [], "select": [], "save": [], "plain": []}
    with tempfile.TemporaryDirectory(prefix="grom-speed-") as tmp:
        model.save_pretrained(f"{tmp}/model")
        for repeat in range(args.repeats + 1):  # the first round warms up and is not kept
            seconds = {}
            seconds["plain"], _ = _seconds(plain_forward_seconds, model, tokenizer, forget + read, args.batch_size)
            seconds["load"], loaded = _seconds(_load, f"{tmp}/model", device)
            seconds["fit"], path = _seconds(fit_grom_path, loaded, tokenizer, forget, retain, config)
            criterion = SelectionCriterion(forget, holdout, validation, batch_size=args.batch_size)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                seconds["select"], edit = _seconds(path.select, criterion, loaded, tokenizer)
            seconds["save"], _ = _seconds(edit.save_pretrained, f"{tmp}/adapter-{repeat}")
            if repeat:
                for k, v in seconds.items():
                    steps[k].append(v)
            n_points = len(path.points)
            del loaded, path
    median = {k: statistics.median(v) for k, v in steps.items()}
    total = median["load"] + median["fit"] + median["select"] + median["save"]
    return {
        "model": args.model or "tofu-tiny (test recipe)", "device": str(device),
        "torch_threads": torch.get_num_threads(), "forget_rows": "TOFU forget10 authors 1-4",
        "n_forget": len(forget), "n_retain_read": len(read), "criterion_rows_per_set": args.criterion_rows,
        "edited_modules": list(edit.deltas), "num_forget_keys": edit.stats["num_forget_keys"],
        "path_points": n_points,
        "export": {n: {"rank": f.rank, "truncated": f.truncated, "relative_frobenius_error": f.relative_error}
                   for n, f in edit.lora_factors().items()},
        "median_seconds": median, "total_seconds": total, "total_over_plain": total / median["plain"],
        "step_over_plain": {k: v / median["plain"] for k, v in median.items() if k != "plain"},
        "goal": "total_over_plain <= 1.5", "repeats": args.repeats,
    }


def _export(sol: Any, keys: Any, targets: Any) -> Any:
    from hf_unlearn.methods.grom.peft_export import lora_factors
    from hf_unlearn.methods.grom.solve import low_rank_form

    return lora_factors(sol.delta, low_rank=low_rank_form(sol, keys, targets))


def run_export_shape(d_out: int, d_in: int, s: int, dense_svd: bool, seed: int) -> dict[str, Any]:
    """The solve and the export of one random ``s``-key module of shape ``d_out x d_in`` (float64, CPU/GPU)."""
    import torch

    from hf_unlearn.methods.grom.solve import solve_grom

    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=device).manual_seed(seed)
    keys = torch.randn(s, d_in, generator=g, device=device)
    targets = torch.randn(s, d_out, generator=g, device=device, dtype=torch.float64)
    retain = torch.randn(2 * s, d_in, generator=g, device=device, dtype=torch.float64)
    moment = retain.T @ retain
    del retain
    solve_s, sol = _seconds(solve_grom, moment, 2 * s, keys, targets, 10.0, 1.0, 1e-2)
    del moment
    export_s, factors = _seconds(_export, sol, keys, targets)
    numbers = factors.lora_A.numel() + factors.lora_B.numel()
    out = {"d_out": d_out, "d_in": d_in, "num_forget_keys": s, "device": device,
           "torch_threads": torch.get_num_threads(), "solve_seconds": solve_s, "export_seconds": export_s,
           "export_over_solve": export_s / solve_s, "rank": factors.rank, "truncated": factors.truncated,
           "relative_frobenius_error": factors.relative_error, "factor_numbers": numbers,
           "dense_numbers": d_out * d_in, "factor_over_dense": numbers / (d_out * d_in)}
    if dense_svd:
        out["dense_svd_seconds"], _ = _seconds(functools.partial(torch.linalg.svd, full_matrices=False), sol.delta)
    return out


def _table(r: dict[str, Any]) -> str:
    lines = []
    e2e = r.get("end_to_end")
    if e2e:
        m = e2e["median_seconds"]
        lines += [
            f"GROM end to end on {e2e['model']} ({e2e['device']}, {e2e['torch_threads']} threads): {e2e['n_forget']} "
            f"forget rows ({e2e['forget_rows']}), {e2e['n_retain_read']} retain rows read, {e2e['num_forget_keys']} "
            f"forget keys, edited {e2e['edited_modules']}", "",
            "| step | seconds | / plain |", "|:--|--:|--:|",
            *(f"| {k} | {m[k]:.3f} | {e2e['step_over_plain'][k]:.2f} |" for k in ("load", "fit", "select", "save")),
            f"| **load + fit + select + save** | {e2e['total_seconds']:.3f} | **{e2e['total_over_plain']:.2f}** |",
            f"| plain forward over the rows read | {m['plain']:.3f} | 1.00 |", "",
        ]
    for x in r.get("export_shapes", []):
        dense = f", dense float64 SVD {x['dense_svd_seconds']:.2f} s" if "dense_svd_seconds" in x else ""
        lines.append(
            f"export {x['d_out']}x{x['d_in']}, {x['num_forget_keys']} keys ({x['device']}, {x['torch_threads']} "
            f"threads): solve {x['solve_seconds']:.2f} s, export {x['export_seconds']:.2f} s "
            f"({x['export_over_solve']:.2f} of the solve){dense}; rank {x['rank']}, truncated {x['truncated']}, "
            f"error {x['relative_frobenius_error']:.2g}, factors {x['factor_over_dense']:.3f} of the dense delta")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import torch
    from unlearn_bench.report import print_and_save

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="local causal LM folder (default: the TOFU-tiny target)")
    parser.add_argument("--source", default="synthetic", help="TOFU source: 'synthetic' or a local TOFU folder")
    parser.add_argument("--cache-dir", default=None, help="cache of the tiny models")
    parser.add_argument("--device", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target-modules", nargs="+", default=["down_proj"])
    parser.add_argument("--layers", type=int, nargs="+", default=None, help="explicit layers (default: auto)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--criterion-rows", type=int, default=40, help="holdout and retain-validation rows")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--skip-run", action="store_true", help="only the --export-shape measurements")
    parser.add_argument("--export-shape", type=int, nargs=3, action="append", default=[],
                        metavar=("D_OUT", "D_IN", "S"))
    parser.add_argument("--dense-svd", action="store_true", help="also time the dense float64 SVD of P")
    parser.add_argument("--out", default=None, help="write the JSON here as well")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    shown = [a for i, a in enumerate(sys.argv[1:]) if a != "--out" and (i == 0 or sys.argv[i] != "--out")]
    result: dict[str, Any] = {"command": "python " + " ".join(["benchmarks/grom_speed.py", *shown])}
    if not args.skip_run:
        result["end_to_end"] = run_end_to_end(args)
    result["export_shapes"] = [run_export_shape(*shape, args.dense_svd, args.seed) for shape in args.export_shape]
    print_and_save(result, _table(result), args.out)
    return result


if __name__ == "__main__":
    main()
