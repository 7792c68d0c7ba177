"""The four baselines (GradAscent, GradDiff, NPO, SimNPO) on TOFU-tiny forget10: the rows every method is compared to.

Budget (open-unlearning's TOFU defaults scaled to the tiny model): a fixed number of epochs over the forget set
(``--epochs``, default 10, no early stopping), AdamW with weight decay 0.01, linear decay, batch ``--batch-size``
(default 8) forget examples each paired with a retain90 example, and a small learning-rate grid (``--lrs``, default
``1e-4 3e-4 1e-3``: the tiny model was trained from scratch at 3e-3, so the 1e-5 of 7B models moves it too little).
Method hyperparameters are the trainers' defaults (open-unlearning's): GradDiff gamma=alpha=1 with retain NLL;
NPO beta=0.1, gamma=alpha=1; SimNPO beta=4.5, delta=0, gamma=0.125, alpha=1.

Every setting unlearns a fresh copy of the cached target; reported per setting: forget quality (KS test against the
retain reference), model utility, forget ROUGE-L, forget truth ratio (from
:func:`hf_unlearn.evaluation.evaluate_tofu`), average answer NLL on forget10 and retain90, wall seconds of
``trainer.train()`` and peak memory (resident set; GPU allocator peak on CUDA). The chosen setting of each method
is the one with the highest forget quality keeping >= 90% of the target's model utility
(:func:`hf_unlearn.bench.runner.choose_setting`). Results: ``<out>/baselines.json``, ``baselines.md``, ``baselines.png``.

    python benchmarks/baselines.py --out runs/baselines                                   # full grid
    python benchmarks/baselines.py --methods grad_diff --lrs 3e-4 --epochs 1 --out /tmp/b  # smoke
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")

METHODS = {
    "grad_ascent": "GradAscentTrainer",
    "grad_diff": "GradDiffTrainer",
    "npo": "NPOTrainer",
    "simnpo": "SimNPOTrainer",
}
DEFAULT_LRS = (1e-4, 3e-4, 1e-3)
RETAIN_NLL_SLACK = 0.5  # --no-eval selection: allowed rise of the retain answer NLL (nats/token)


def run_setting(
    method: str,
    learning_rate: float,
    args: argparse.Namespace,
    pair: Any,
    forget_rows: list[dict[str, Any]],
    retain_rows: list[dict[str, Any]],
    reference: dict[str, Any] | None,
) -> dict[str, Any]:
    """Unlearn a fresh target copy with one method and learning rate; evaluate it; one result row."""
    import torch

    from hf_unlearn import trainers
    from hf_unlearn.bench.runner import PeakMemory
    from hf_unlearn.bench.subjects import load_tiny
    from hf_unlearn.logprobs import mean_answer_nll

    row: dict[str, Any] = {"method": method, "settings": {"learning_rate": learning_rate}, "error": None}
    try:
        model, tokenizer = load_tiny(pair.target)
        with tempfile.TemporaryDirectory() as work:
            config = trainers.UnlearningConfig(
                output_dir=work, report_to="none", save_strategy="no", gradient_checkpointing=False,
                disable_tqdm=not args.progress, logging_steps=5, seed=args.seed, learning_rate=learning_rate,
                num_train_epochs=args.epochs, per_device_train_batch_size=args.batch_size,
            )
            trainer_cls = getattr(trainers, METHODS[method])
            retain = retain_rows if trainer_cls.needs_retain(config) else None
            trainer = trainer_cls(model=model, args=config, train_dataset=forget_rows, retain_dataset=retain,
                                  processing_class=tokenizer)
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            with PeakMemory() as mem:
                start = time.perf_counter()
                trainer.train()
                seconds = time.perf_counter() - start
        model.eval()
        row.update(
            settings={"learning_rate": learning_rate, "epochs": args.epochs, "batch_size": args.batch_size,
                      **{k: getattr(trainer.args, k) for k in ("beta", "delta", "gamma", "alpha", "retain_loss")}},
            steps=trainer.state.global_step, seconds=seconds, peak_rss_mb=mem.peak_mb,
            peak_gpu_mb=torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None,
            forget_nll=mean_answer_nll(model, tokenizer, forget_rows), retain_nll=mean_answer_nll(model, tokenizer, retain_rows),
            trainable_share=1.0,
        )
        if reference is not None:
            from hf_unlearn.evaluation import evaluate_tofu

            report = evaluate_tofu(model, tokenizer, source=pair.source, forget_split=pair.forget_split,
                                   retain_reference=reference, progress=False, **args.eval_kwargs)
            row.update({k: report.get(k) for k in ("forget_quality", "model_utility", "forget_rouge_l",
                                                   "forget_truth_ratio", "forget_prob")})
    except Exception as err:  # one failing setting must not stop the others
        row["error"] = f"{type(err).__name__}: {err}"
        row["traceback"] = traceback.format_exc(limit=8)
    return row


def grid_table(results: dict[str, Any]) -> str:
    """Every grid setting with its answer NLLs and cost (the chosen setting of each method marked with *)."""
    lines = ["| method | lr | forget NLL | retain NLL | forget quality | model utility | steps | wall s | peak RSS MB |",
             "|---|---|---|---|---|---|---|---|---|"]

    def fmt(value: Any, spec: str) -> str:
        return "n/a" if value is None else format(value, spec)

    for name in ("target",):
        row = results[name]
        lines.append(f"| {name} | | {fmt(row.get('forget_nll'), '.3f')} | {fmt(row.get('retain_nll'), '.3f')} | "
                     f"{fmt(row.get('forget_quality'), '.3g')} | {fmt(row.get('model_utility'), '.3f')} | | | |")
    for method, grid_rows in results["grid"].items():
        chosen = results["rows"][method].get("chosen_index")
        for i, row in enumerate(grid_rows):
            mark = "*" if i == chosen else ""
            if row.get("error"):
                lines.append(f"| {method}{mark} | {row['settings']['learning_rate']:g} | failed: {row['error'][:60]} |"
                             + " |" * 6)
                continue
            lines.append(
                f"| {method}{mark} | {row['settings']['learning_rate']:g} | {fmt(row.get('forget_nll'), '.3f')} | "
                f"{fmt(row.get('retain_nll'), '.3f')} | {fmt(row.get('forget_quality'), '.3g')} | "
                f"{fmt(row.get('model_utility'), '.3f')} | {row.get('steps')} | {fmt(row.get('seconds'), '.2f')} | "
                f"{fmt(row.get('peak_rss_mb'), '.0f')} |"
            )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the grid of every requested baseline and write JSON + markdown (+ plot when evaluated)."""
    import torch
    from tqdm.auto import tqdm

    from hf_unlearn.bench.runner import choose_setting, markdown_table, reference_rows, write_results
    from hf_unlearn.bench.subjects import load_tiny, recipe_for, tiny_models
    from hf_unlearn.data import RETAIN_FOR_FORGET, load_tofu_rows
    from hf_unlearn.logprobs import mean_answer_nll

    if args.threads:
        torch.set_num_threads(args.threads)
    args.eval_kwargs = {"max_examples": args.max_eval_examples} if args.max_eval_examples else {}
    pair = tiny_models(source=args.source, forget_split="forget10", recipe=recipe_for(args.size),
                       cache_dir=args.cache_dir, progress=args.progress)
    forget_rows = load_tofu_rows("forget10", args.source)
    retain_rows = load_tofu_rows(RETAIN_FOR_FORGET["forget10"], args.source)

    target_model, tokenizer = load_tiny(pair.target)
    target_row: dict[str, Any] = {"method": "target", "error": None, "forget_nll": mean_answer_nll(target_model, tokenizer, forget_rows),
                                  "retain_nll": mean_answer_nll(target_model, tokenizer, retain_rows)}
    retain_row: dict[str, Any] = {"method": "retain reference", "error": None}
    reference = None
    if not args.no_eval:
        target_report, reference = reference_rows(pair, args.source, "forget10", args.eval_kwargs)
        for row, report in ((target_row, target_report), (retain_row, reference)):
            row.update({k: report.get(k) for k in ("forget_quality", "model_utility", "forget_rouge_l",
                                                   "forget_truth_ratio", "forget_prob")})

    jobs = [(m, lr) for m in args.methods for lr in args.lrs]
    grids: dict[str, list[dict[str, Any]]] = {m: [] for m in args.methods}
    for method, lr in tqdm(jobs, desc="baselines", disable=not args.progress):
        row = run_setting(method, lr, args, pair, forget_rows, retain_rows, reference)
        grids[method].append(row)
        status = row["error"] or ", ".join(f"{k}={row.get(k):.4g}" for k in
                                           ("forget_nll", "retain_nll", "forget_quality", "model_utility", "seconds")
                                           if row.get(k) is not None)
        print(f"{method:12s} lr={lr:g}: {status}", flush=True)

    rows = {}
    for method, grid_rows in grids.items():
        if args.no_eval:
            # without TOFU scores: the highest forget NLL among settings whose retain NLL rose by < RETAIN_NLL_SLACK
            # nats (else the setting with the lowest retain NLL)
            ok = [i for i, r in enumerate(grid_rows) if r["error"] is None]
            keep = [i for i in ok if grid_rows[i]["retain_nll"] < target_row["retain_nll"] + RETAIN_NLL_SLACK]
            if keep:
                idx = max(keep, key=lambda i: grid_rows[i]["forget_nll"])
            else:
                idx = min(ok, key=lambda i: grid_rows[i]["retain_nll"]) if ok else None
        else:
            idx = choose_setting(grid_rows, target_row["model_utility"])
        rows[method] = dict(grid_rows[idx if idx is not None else 0], chosen_index=idx)
    base = rows.get("grad_diff", {}).get("seconds")
    for row in [r for g in grids.values() for r in g] + list(rows.values()):
        row["time_vs_grad_diff"] = row["seconds"] / base if base and row.get("seconds") else None
    results = {"target": target_row, "retain_reference": retain_row, "rows": rows, "grid": grids}
    meta = {"benchmark": "baselines", "source": args.source, "forget_split": "forget10", "size": args.size,
            "epochs": args.epochs, "batch_size": args.batch_size, "learning_rates": list(args.lrs), "seed": args.seed,
            "evaluated": not args.no_eval}
    if args.no_eval:
        from hf_unlearn.evaluation import write_json_atomic

        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        table = markdown_table(results)
        write_json_atomic({**meta, **results, "table_markdown": table}, out / "baselines.json")
        (out / "baselines.md").write_text(table + "\n")
        paths = {"json": out / "baselines.json", "markdown": out / "baselines.md"}
    else:
        paths = write_results(results, args.out, "baselines", meta)
    with open(paths["markdown"], "a") as fh:
        fh.write("\n" + grid_table(results) + "\n")
    print(markdown_table(results) + "\n\n" + grid_table(results))
    print("\n".join(f"wrote {p}" for p in paths.values()))
    return results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/baselines", help="output folder")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--lrs", nargs="+", type=float, default=list(DEFAULT_LRS), help="learning-rate grid")
    parser.add_argument("--epochs", type=float, default=10.0, help="fixed unlearning epochs (no early stop)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", default="test", choices=["test", "bench"], help="TOFU-tiny recipe size")
    parser.add_argument("--source", default="synthetic", help="TOFU source of the tiny models ('synthetic' or a folder)")
    parser.add_argument("--cache-dir", default=None, help="where the tiny models are cached")
    parser.add_argument("--max-eval-examples", type=int, default=None, help="evaluate on the first N rows per split")
    parser.add_argument("--no-eval", action="store_true", help="skip the TOFU evaluator (forget/retain NLL only)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (1 is fastest for tiny models)")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="hide progress bars")
    return parser.parse_args(argv)


if __name__ == "__main__":
    run(parse_args())
