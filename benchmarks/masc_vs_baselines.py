"""MASC against GradDiff and NPO+KL on the TOFU-tiny target, side by side in one run.

Each method unlearns a fresh copy of the cached tiny target on synthetic ``forget10`` (retain90 as the retain set):
the baselines for a fixed budget of ``--epochs`` epochs, MASC until its stopping rule fires (``--masc-max-steps``
is only its guard). Reported per method: wall seconds of ``trainer.train()`` and their ratio to GradDiff's, steps
run, MASC's stop step, average answer NLL on forget10 / retain90, and (unless ``--no-eval``) the TOFU scores of
:func:`hf_unlearn.evaluation.evaluate_tofu` (forget quality against the retain reference, model utility, forget
ROUGE-L, forget truth ratio). Results land in ``<out>/masc_vs_baselines.json`` and a printed table.

    python benchmarks/masc_vs_baselines.py --out runs/masc_bench            # full
    python benchmarks/masc_vs_baselines.py --epochs 2 --no-eval --out /tmp/x  # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")


def _common_args(output_dir: str, seed: int, batch_size: int) -> dict[str, Any]:
    return dict(
        output_dir=output_dir, report_to="none", save_strategy="no", gradient_checkpointing=False,
        disable_tqdm=True, logging_steps=5, seed=seed, per_device_train_batch_size=batch_size,
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run every method and return the results (also written as JSON)."""
    import torch

    from hf_unlearn.bench.subjects import load_tiny, tiny_models
    from hf_unlearn.data import synthetic_tofu
    from hf_unlearn.logprobs import mean_answer_nll
    from hf_unlearn.trainers import GradDiffTrainer, MASCConfig, MASCTrainer, NPOTrainer, UnlearningConfig

    torch.manual_seed(args.seed)
    pair = tiny_models(cache_dir=args.cache_dir, progress=not args.quiet)
    data = synthetic_tofu()
    forget, retain = data["forget10"], data["retain90"]
    work = tempfile.mkdtemp(prefix="masc_bench_")

    def common(name: str) -> dict[str, Any]:
        return _common_args(os.path.join(work, name), args.seed, args.batch_size)

    methods = {
        "GradDiff": (GradDiffTrainer, UnlearningConfig(
            **common("graddiff"), learning_rate=args.lr, num_train_epochs=args.epochs)),
        "NPO+KL": (NPOTrainer, UnlearningConfig(
            **common("npo"), learning_rate=args.lr, num_train_epochs=args.epochs, retain_loss="kl")),
        "MASC": (MASCTrainer, MASCConfig(
            **common("masc"), learning_rate=args.masc_lr, max_steps=args.masc_max_steps, top_k=args.top_k,
            margin_threshold=args.tau, stop_tolerance=args.alpha, kl_weight=args.kl_weight,
            validation_fraction=args.validation_fraction, check_every=args.check_every)),
    }

    evaluate = None
    reference = None
    if not args.no_eval:
        from hf_unlearn.evaluation import evaluate_tofu

        def evaluate(model, tokenizer, name, ref=None):
            return evaluate_tofu(model, tokenizer, source="synthetic", forget_split="forget10", retain_reference=ref,
                                 max_examples=args.max_examples, progress=not args.quiet, model_name=name)

        ret_model, ret_tok = load_tiny(pair.retain)
        reference = evaluate(ret_model, ret_tok, "retain reference")

    rows: dict[str, dict[str, Any]] = {}
    target, tok = load_tiny(pair.target)
    rows["target"] = {"forget_nll": mean_answer_nll(target, tok, forget), "retain_nll": mean_answer_nll(target, tok, retain)}
    if evaluate is not None:
        rows["target"].update(_scores(evaluate(target, tok, "target", reference)))
    for name in args.methods:
        trainer_cls, config = methods[name]
        model, tok = load_tiny(pair.target)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = trainer_cls(model, config, train_dataset=forget, retain_dataset=retain, processing_class=tok)
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
        model.eval()
        row: dict[str, Any] = {
            "seconds": seconds, "steps": trainer.state.global_step,
            "forget_nll": mean_answer_nll(model, tok, forget), "retain_nll": mean_answer_nll(model, tok, retain),
        }
        if isinstance(trainer, MASCTrainer):
            row["stop_step"] = trainer.stopped_at_step
            row["violation_history"] = trainer.violation_history
        if evaluate is not None:
            row.update(_scores(evaluate(model, tok, name, reference)))
        rows[name] = row
        if not args.quiet:
            print(f"{name}: {seconds:.1f} s, {row['steps']} steps", flush=True)
    if "GradDiff" in rows:
        for row in rows.values():
            if "seconds" in row:
                row["time_vs_grad_diff"] = row["seconds"] / rows["GradDiff"]["seconds"]

    result = {"settings": vars(args), "results": rows, "retain_reference": _scores(reference) if reference else None}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "masc_vs_baselines.json").write_text(json.dumps(result, indent=2, default=str))
    table = format_table(rows)
    (out / "masc_vs_baselines.md").write_text(table + "\n")
    print(table)
    return result


def _scores(report: dict[str, Any]) -> dict[str, Any]:
    keys = ("forget_quality", "model_utility", "forget_rouge_l", "forget_truth_ratio")
    return {k: report.get(k) for k in keys}


def format_table(rows: dict[str, dict[str, Any]]) -> str:
    """Markdown table of the results (missing cells as ``-``)."""
    columns = [
        ("seconds", "wall s", ".1f"), ("time_vs_grad_diff", "time / GradDiff", ".3f"), ("steps", "steps", "d"),
        ("stop_step", "stop step", "d"), ("forget_nll", "forget NLL", ".3f"), ("retain_nll", "retain NLL", ".3f"),
        ("forget_quality", "forget quality", ".3g"), ("model_utility", "model utility", ".3f"),
        ("forget_rouge_l", "forget ROUGE-L", ".3f"), ("forget_truth_ratio", "forget truth ratio", ".3f"),
    ]
    present = [c for c in columns if any(r.get(c[0]) is not None for r in rows.values())]
    lines = ["| method | " + " | ".join(c[1] for c in present) + " |", "|---" * (len(present) + 1) + "|"]
    for name, row in rows.items():
        cells = [format(row[k], f) if row.get(k) is not None else "-" for k, _, f in present]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/masc_vs_baselines")
    p.add_argument("--cache-dir", default=None, help="tiny-model cache (default: hf_unlearn's cache)")
    p.add_argument("--methods", nargs="+", default=["GradDiff", "NPO+KL", "MASC"],
                   choices=["GradDiff", "NPO+KL", "MASC"])
    p.add_argument("--epochs", type=float, default=10.0, help="baselines' budget (TOFU: fixed epochs)")
    p.add_argument("--lr", type=float, default=1e-4, help="baselines' learning rate")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--masc-lr", type=float, default=3e-4)
    p.add_argument("--masc-max-steps", type=int, default=200)
    p.add_argument("--top-k", type=int, default=10)
    p.add_argument("--tau", type=float, default=0.0)
    p.add_argument("--alpha", type=float, default=0.3, help="MASC stop tolerance")
    p.add_argument("--kl-weight", type=float, default=1.0)
    p.add_argument("--validation-fraction", type=float, default=0.1)
    p.add_argument("--check-every", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-eval", action="store_true", help="skip evaluate_tofu (NLLs only)")
    p.add_argument("--max-examples", type=int, default=None, help="cap rows per evaluation split")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    return run(p.parse_args(argv))


if __name__ == "__main__":
    main()
