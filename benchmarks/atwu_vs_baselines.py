"""ATWU against GradDiff and NPO on the TOFU-tiny target, side by side in one run, with token-score quality.

Each method unlearns a fresh copy of the cached tiny target on synthetic ``forget10`` (retain90 as the retain set)
for the same budget of ``--epochs`` epochs at the same learning rate. Reported per method: wall seconds of
``trainer.train()`` and their ratio to GradDiff's, average answer NLL on forget10 / retain90, and (unless
``--no-eval``) the TOFU scores of :func:`hf_unlearn.evaluation.evaluate_tofu` (forget quality against the retain
reference, model utility, forget ROUGE-L, forget truth ratio).

Token-score quality: the AUROC of per-token scores on the forget answers against *forget-specific* tokens, i.e.
tokens whose id never occurs in the retain split's answers (a proxy for the ground-truth forget spans of the ATWU
paper, which TOFU does not ship). Compared: ATWU's learned scores, and two heuristic token weightings: uniform
(every token the same weight: AUROC 0.5 by construction) and the target model's own token NLL (before
unlearning), plus, for reference, the token NLL of the ATWU-unlearned model.

Results land in ``<out>/atwu_vs_baselines.json`` and a printed (and saved) markdown table.

    python benchmarks/atwu_vs_baselines.py --out runs/atwu_bench                 # full
    python benchmarks/atwu_vs_baselines.py --epochs 2 --no-eval --out /tmp/x     # smoke
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")

METHODS = ("GradDiff", "NPO", "ATWU")


def _common_args(output_dir: str, args: argparse.Namespace) -> dict[str, Any]:
    return dict(
        output_dir=output_dir, report_to="none", save_strategy="no", gradient_checkpointing=False,
        disable_tqdm=True, logging_steps=5, seed=args.seed, per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr, num_train_epochs=args.epochs, weight_decay=0.0,
    )


def _scores(report: dict[str, Any]) -> dict[str, Any]:
    keys = ("forget_quality", "model_utility", "forget_rouge_l", "forget_truth_ratio")
    return {k: report.get(k) for k in keys}


def token_score_quality(
    model: Any, tokenizer: Any, scorer: Any, forget: list[dict[str, str]], retain: list[dict[str, str]],
    target_token_nll: list[dict[str, Any]],
) -> dict[str, Any]:
    """AUROCs against forget-specific tokens: learned scores, uniform, target NLL, unlearned-model NLL."""
    from hf_unlearn.trainers.atwu.weighter import answer_token_ids, auroc, score_tokens

    retain_ids = answer_token_ids(tokenizer, retain)
    scored = score_tokens(model, tokenizer, scorer, forget)
    labels = [t not in retain_ids for ex in scored for t in ex["token_ids"]]
    target_labels = [t not in retain_ids for ex in target_token_nll for t in ex["token_ids"]]
    return {
        "num_tokens": len(labels),
        "num_forget_specific": int(sum(labels)),
        "auroc_learned": auroc([s for ex in scored for s in ex["scores"]], labels),
        "auroc_uniform": auroc([1.0] * len(labels), labels),
        "auroc_target_nll": auroc([v for ex in target_token_nll for v in ex["token_nll"]], target_labels),
        "auroc_unlearned_nll": auroc([v for ex in scored for v in ex["token_nll"]], labels),
        "selected_fraction": sum(s > 0.5 for ex in scored for s in ex["scores"]) / max(len(labels), 1),
        "examples": [
            {"tokens": ex["tokens"], "scores": [round(s, 4) for s in ex["scores"]]} for ex in scored[: 3]
        ],
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run every method and return the results (also written as JSON and a markdown table)."""
    import torch

    from hf_unlearn.bench.subjects import load_tiny, tiny_models
    from hf_unlearn.data import synthetic_tofu
    from hf_unlearn.logprobs import mean_answer_nll
    from hf_unlearn.trainers import (
        ATWUConfig,
        ATWUTokenWeighter,
        ATWUTrainer,
        GradDiffTrainer,
        NPOTrainer,
        UnlearningConfig,
    )

    torch.manual_seed(args.seed)
    pair = tiny_models(cache_dir=args.cache_dir, progress=not args.quiet)
    data = synthetic_tofu()
    forget = [{"question": r["question"], "answer": r["answer"]} for r in data["forget10"]]
    retain = [{"question": r["question"], "answer": r["answer"]} for r in data["retain90"]]
    work = tempfile.mkdtemp(prefix="atwu_bench_")

    methods = {
        "GradDiff": (GradDiffTrainer, UnlearningConfig(**_common_args(os.path.join(work, "graddiff"), args))),
        "NPO": (NPOTrainer, UnlearningConfig(**_common_args(os.path.join(work, "npo"), args))),
        "ATWU": (ATWUTrainer, ATWUConfig(
            **_common_args(os.path.join(work, "atwu"), args), forget_loss=args.forget_loss, budget=args.budget,
            budget_weight=args.budget_weight, entropy_weight=args.entropy_weight, scorer_lr=args.scorer_lr,
            scorer_every=args.scorer_every, saturation_beta=args.saturation_beta, saturation_c=args.saturation_c)),
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
    # the target's own token NLL, for the NLL heuristic (a zero scorer only fills the unused score field)
    from hf_unlearn.trainers.atwu.weighter import score_tokens

    target_token_nll = score_tokens(target, tok, ATWUTokenWeighter.for_model(target), forget)
    if evaluate is not None:
        rows["target"].update(_scores(evaluate(target, tok, "target", reference)))
    token_quality = None
    for name in args.methods:
        trainer_cls, config = methods[name]
        model, tok = load_tiny(pair.target)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = trainer_cls(model, config, train_dataset=forget, retain_dataset=retain, processing_class=tok)
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
        model = trainer.accelerator.unwrap_model(trainer.model)
        model.eval()
        row: dict[str, Any] = {
            "seconds": seconds, "steps": trainer.state.global_step,
            "forget_nll": mean_answer_nll(model, tok, forget), "retain_nll": mean_answer_nll(model, tok, retain),
        }
        if isinstance(trainer, ATWUTrainer):
            token_quality = token_score_quality(model, tok, trainer.scorer, forget, retain, target_token_nll)
            row["token_auroc"] = token_quality["auroc_learned"]
            row["selected_fraction"] = token_quality["selected_fraction"]
        if evaluate is not None:
            row.update(_scores(evaluate(model, tok, name, reference)))
        rows[name] = row
        if not args.quiet:
            print(f"{name}: {seconds:.1f} s, {row['steps']} steps", flush=True)
    if "GradDiff" in rows:
        for row in rows.values():
            if "seconds" in row:
                row["time_vs_grad_diff"] = row["seconds"] / rows["GradDiff"]["seconds"]

    result = {
        "settings": vars(args),
        "results": rows,
        "token_scores": token_quality,
        "forget_specific_definition": "token id never occurs in the retain90 answers (proxy for forget spans)",
        "retain_reference": _scores(reference) if reference else None,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "atwu_vs_baselines.json").write_text(json.dumps(result, indent=2, default=str))
    table = format_table(rows) + "\n\n" + format_token_table(token_quality)
    (out / "atwu_vs_baselines.md").write_text(table + "\n")
    print(table)
    return result


def format_table(rows: dict[str, dict[str, Any]]) -> str:
    """Markdown table of the per-method results (missing cells as ``-``)."""
    columns = [
        ("seconds", "wall s", ".1f"), ("time_vs_grad_diff", "time / GradDiff", ".3f"), ("steps", "steps", "d"),
        ("forget_nll", "forget NLL", ".3f"), ("retain_nll", "retain NLL", ".3f"),
        ("forget_quality", "forget quality", ".3g"), ("model_utility", "model utility", ".3f"),
        ("forget_rouge_l", "forget ROUGE-L", ".3f"), ("forget_truth_ratio", "forget truth ratio", ".3f"),
        ("token_auroc", "token AUROC", ".3f"),
    ]
    present = [c for c in columns if any(r.get(c[0]) is not None for r in rows.values())]
    lines = ["| method | " + " | ".join(c[1] for c in present) + " |", "|---" * (len(present) + 1) + "|"]
    for name, row in rows.items():
        cells = []
        for key, _, fmt in present:
            value = row.get(key)
            cells.append("-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, fmt))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_token_table(quality: dict[str, Any] | None) -> str:
    """Markdown table of token-score AUROCs against forget-specific tokens."""
    if quality is None:
        return "(ATWU not run: no token scores)"
    head = (f"Token-score AUROC vs forget-specific tokens (id never in a retain answer; "
            f"{quality['num_forget_specific']} of {quality['num_tokens']} forget answer tokens)")
    lines = [head, "", "| token weighting | AUROC |", "|---|---|"]
    for key, label in (("auroc_learned", "ATWU learned scores"), ("auroc_uniform", "uniform (heuristic)"),
                       ("auroc_target_nll", "target model's token NLL (heuristic)"),
                       ("auroc_unlearned_nll", "ATWU-unlearned model's token NLL")):
        lines.append(f"| {label} | {quality[key]:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/atwu_vs_baselines")
    p.add_argument("--cache-dir", default=None, help="tiny-model cache (default: hf_unlearn's cache)")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--epochs", type=float, default=6.0, help="every method's budget (TOFU: fixed epochs)")
    p.add_argument("--lr", type=float, default=5e-4, help="every method's learning rate (tiny model)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--forget-loss", default="satga", choices=["satga", "npo", "simnpo"])
    p.add_argument("--budget", type=float, default=0.2)
    p.add_argument("--budget-weight", type=float, default=50.0)
    p.add_argument("--entropy-weight", type=float, default=0.01)
    p.add_argument("--scorer-lr", type=float, default=1e-2)
    p.add_argument("--scorer-every", type=int, default=1)
    p.add_argument("--saturation-beta", type=float, default=0.2)
    p.add_argument("--saturation-c", type=float, default=20.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-eval", action="store_true", help="skip evaluate_tofu (NLLs and token AUROC only)")
    p.add_argument("--max-examples", type=int, default=None, help="cap rows per evaluation split")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    return run(p.parse_args(argv))


if __name__ == "__main__":
    main()
