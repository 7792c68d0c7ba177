"""ATWU, MASC and T3 against their papers' claims on TOFU-tiny (real TOFU text, the test-size tiny Llama), on the
tuning authors only: TOFU forget10 authors 5-8 (rows 80-159) are forgotten; holdout10 authors 5-8 (rows 80-159) are
the never-seen rows; the first 80 retain90 rows (the ones the tiny model trained on) are the retain rows, the
last 20 of them held out as the criterion's retain-validation rows. No other forget10 author is used.

    python benchmarks/fidelity_tiny.py --data ../shared/data/tofu                  # all three, real TOFU text
    python benchmarks/fidelity_tiny.py --data ../shared/data/tofu --only masc,t3

    python benchmarks/fidelity_tiny.py --data synthetic --only masc              # the tests' cached tiny pair

    python benchmarks/fidelity_tiny.py --data ../shared/data/tofu --subject smollm2-135m ...  # see README.md there

Writes ``benchmarks/results/fidelity_tiny/fidelity_<tiny|subject>_<tofu|synthetic|small>.json``. Figures:

* ATWU: token AUROC against TOFU's answer spans (a token of a word with a digit, or of a capitalised word other
  than a common sentence opener: names, dates, places) and against forget-specific token ids, and forget quality
  (KS p-value of the forget rows' truth ratios against the retain reference's) before and after, for the runs of
  :data:`ATWU_VARIANTS`;
* MASC: its time to its stop as a ratio to GradDiff's time for the same step budget, in this process, and the
  stop's NLL shift gap to the holdout rows, with the calibrated stop (the default) and the fixed one;
* T3: the calibration's grid, its chosen ``(T, w)``, whether a ``T > 1`` point is within the retain tolerance, and
  forget quality at the chosen point and at its greedy-equivalent ``(1, T w)``.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

#: The rows each source gives the methods: forget, holdout, retain (trained with) and retain-validation.
ROWS = {
    # real TOFU: forget10 authors 5-8 (20 rows each, the tuning authors), holdout10 authors 5-8, and the 80
    # retain rows the test-size tiny model trained on
    "tofu": {"forget": slice(80, 160), "holdout": slice(80, 160), "retain": slice(0, 60),
             "retain_validation": slice(60, 80)},
    # the synthetic set (two forget authors, two holdout authors, 180 retain rows): the tests' cached tiny pair
    "synthetic": {"forget": slice(0, 20), "holdout": slice(0, 20), "retain": slice(0, 160),
                  "retain_validation": slice(160, 180)},
    # a TOFU-small v2 folder (``--subject``): its splits hold exactly the tuning rows (forget10 authors 5-8)
    "small": {"forget": slice(None), "holdout": slice(None), "retain": slice(None), "retain_validation": slice(None)},
}


#: Where the trainers' output folders go (nothing is saved in them).
WORK = Path(tempfile.gettempdir()) / "hf_unlearn_fidelity"
#: Learning rates of the runs (the TOFU-tiny bench's demo values unless given).
LEARNING_RATES = {"atwu": 5e-4, "masc": 3e-3, "grad_diff": 3e-4}


def _row_set(data: str) -> str:
    if data == "synthetic":
        return "synthetic"
    return "small" if (Path(data) / "retain_validation.jsonl").is_file() else "tofu"


def _rows(name: str, data: str, part: str | None = None) -> list[dict[str, Any]]:
    """The rows of split ``name`` (``part``: the slice of :data:`ROWS` for this source)."""
    from hf_unlearn.data import load_tofu_rows

    if part == "retain_validation" and _row_set(data) == "small":
        name = "retain_validation"
    rows = load_tofu_rows(name, data)
    return rows if part is None else rows[ROWS[_row_set(data)][part]]


def subjects(data: str, cache: Path) -> Any:
    """The tiny target and retain reference: the tests' pair for the synthetic set, the test-size TOFU pair
    (``tofu-test``) for real TOFU."""
    from hf_unlearn.demo import build_tiny_pair, recipe_for

    recipe = recipe_for("test" if data == "synthetic" else "tofu-test")
    return build_tiny_pair(data, "forget10", recipe, cache_dir=cache, progress=False)


def truth_ratios(model: Any, tok: Any, rows: list[dict[str, Any]], scorer: Any = None) -> np.ndarray:
    """TOFU's truth ratio of each row, ``exp(NLL(paraphrased) - mean NLL(perturbed))`` (per-token NLLs)."""
    from hf_unlearn.logprobs import answer_nll, multi_answer_nll

    kwargs = {"scorer": scorer} if scorer is not None else {}
    questions = [r["question"] for r in rows]
    true = answer_nll(model, tok, questions, [r["paraphrased_answer"] for r in rows], progress=False, **kwargs)
    false = multi_answer_nll(model, tok, questions, [r["perturbed_answer"] for r in rows], progress=False, **kwargs)
    return np.exp(true - np.array([f.mean() for f in false]))



def _rows_and_reference(pair: Any, data: str) -> tuple[list, list, list, np.ndarray]:
    """The forget and retain rows, the evaluated forget rows, and the retain reference's truth ratios on them."""
    from hf_unlearn.demo import load_tiny

    evaluated = _rows("forget10_perturbed", data, "forget")
    reference, ref_tok = load_tiny(pair.retain)
    return (_rows("forget10", data, "forget"), _rows("retain90", data, "retain"), evaluated,
            truth_ratios(reference, ref_tok, evaluated))

def forget_quality(model_tr: np.ndarray, reference_tr: np.ndarray) -> float:
    from hf_unlearn.evaluation.metrics import forget_quality as ks

    return float(ks(model_tr, reference_tr)["forget_quality"])


#: Capitalised words that open TOFU answers without naming anything.
SENTENCE_STARTERS = {"The", "A", "An", "In", "His", "Her", "Their", "This", "These", "It", "He", "She", "They", "As",
                     "Yes", "No", "One", "Some", "While", "With", "Although", "Despite", "Through", "By", "For",
                     "Being", "Like", "Not", "To", "At", "On", "From", "Many", "Several", "Both", "Each", "I"}


def span_labels(tok: Any, token_ids: list[int]) -> list[bool]:
    """Per answer token: does it overlap a word with a digit, or a capitalised word other than a common sentence
    opener (:data:`SENTENCE_STARTERS`): TOFU's names, dates and places? Characters are located by decoding the
    answer's token prefixes."""
    ends, text = [], ""
    for k in range(len(token_ids)):
        text = tok.decode(token_ids[: k + 1])
        ends.append(len(text))
    spans = []
    for match in re.finditer(r"\S+", text):
        word = match.group().strip(".,;:!?\"'()")
        if any(c.isdigit() for c in word) or (word[:1].isupper() and word.split("'")[0] not in SENTENCE_STARTERS):
            spans.append((match.start(), match.end()))
    labels, start = [], 0
    for end in ends:
        labels.append(any(s < end and start < e for s, e in spans))
        start = end
    return labels


# ---------------------------------------------------------------------------------------------------------------
# ATWU
# ---------------------------------------------------------------------------------------------------------------


#: ATWU's runs: the defaults, the predicting-state reading, the forget loss in the weighter step (the paper's
#: objective), and that with the paper-scale contrast c = 50.
ATWU_VARIANTS = ({}, {"scorer_position": "predicting"}, {"scorer_forget_weight": 1.0},
                 {"scorer_forget_weight": 1.0, "saturation_c": 50.0})


def atwu(pair: Any, data: str, steps: int) -> dict[str, Any]:
    from hf_unlearn.demo import load_tiny
    from hf_unlearn.methods.atwu import ATWUConfig, ATWUTrainer
    from hf_unlearn.methods.atwu.weighter import answer_token_ids, auroc, forget_specific_auroc

    forget, retain, evaluated, reference_tr = _rows_and_reference(pair, data)
    target, tok = load_tiny(pair.target)
    out: dict[str, Any] = {"forget_quality_before": forget_quality(truth_ratios(target, tok, evaluated), reference_tr),
                           "steps": steps, "runs": []}
    retain_ids = answer_token_ids(tok, retain)
    for variant in ATWU_VARIANTS:
        for seed in (0, 1):
            torch.manual_seed(seed)
            model, tok = load_tiny(pair.target)
            args = ATWUConfig(
                output_dir=str(WORK / "atwu"), report_to="none", save_strategy="no", disable_tqdm=True,
                per_device_train_batch_size=8, learning_rate=LEARNING_RATES["atwu"], max_steps=steps, seed=seed,
                logging_steps=10, **variant,
            )
            trainer = ATWUTrainer(model, args, train_dataset=forget, retain_dataset=retain, processing_class=tok)
            trainer.train()
            scores = trainer.token_scores(forget)
            flat = [s for ex in scores for s in ex["scores"]]
            spans = [y for ex in scores for y in span_labels(tok, ex["token_ids"])]
            out["runs"].append({
                **variant, "seed": seed,
                "span_auroc": auroc(flat, spans), "span_fraction": float(np.mean(spans)),
                "forget_specific_auroc": forget_specific_auroc(scores, retain_ids),
                "forget_quality_after": forget_quality(truth_ratios(trainer.model, tok, evaluated), reference_tr),
            })
            print("atwu", out["runs"][-1], flush=True)
    return out


# ---------------------------------------------------------------------------------------------------------------
# MASC
# ---------------------------------------------------------------------------------------------------------------


def _criterion(data: str) -> Any:
    from hf_unlearn.selection import SelectionCriterion

    return SelectionCriterion(_rows("forget10", data, "forget"), _rows("holdout10", data, "holdout"),
                              _rows("retain90", data, "retain_validation"))


class StepTimer:
    """Wall time from the first step's start to the last step's end (the callbacks of the step, MASC's probes
    included; the start of ``train()`` and MASC's calibration excluded). Add it last, so that it runs after the
    stopping rule's probes."""

    def __init__(self) -> None:
        from transformers import TrainerCallback

        timer = self

        class _Callback(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                timer.first = time.perf_counter() if timer.first is None else timer.first

            def on_step_end(self, args, state, control, **kwargs):
                timer.last, timer.steps = time.perf_counter(), state.global_step

        self.first: float | None = None
        self.last = 0.0
        self.steps = 0
        self.callback = _Callback()

    @property
    def per_step(self) -> float:
        return (self.last - self.first) / max(self.steps, 1)


def masc(pair: Any, data: str, budget: int) -> dict[str, Any]:
    from hf_unlearn.demo import load_tiny
    from hf_unlearn.methods.baselines import GradDiffConfig, GradDiffTrainer
    from hf_unlearn.methods.masc import MASCConfig, MASCTrainer

    forget = _rows("forget10", data, "forget")
    holdout = _rows("holdout10", data, "holdout")
    retain = _rows("retain90", data, "retain")
    criterion = _criterion(data)
    target, tok = load_tiny(pair.target)
    criterion.measure_original(target, tok)
    common = dict(report_to="none", save_strategy="no", disable_tqdm=True, per_device_train_batch_size=4,
                  max_steps=budget, seed=0, logging_steps=10)
    out: dict[str, Any] = {"budget_steps": budget, "start": criterion.measure(target, tok)}

    model, tok = load_tiny(pair.target)
    graddiff_args = GradDiffConfig(output_dir=str(WORK / "gd"), learning_rate=LEARNING_RATES["grad_diff"], **common)
    graddiff = GradDiffTrainer(model, graddiff_args,
                               train_dataset=forget, retain_dataset=retain, processing_class=tok)
    gd_timer = StepTimer()
    graddiff.add_callback(gd_timer.callback)
    start = time.perf_counter()
    graddiff.train()
    gd_seconds = time.perf_counter() - start
    out["grad_diff"] = {"seconds": gd_seconds, "steps": graddiff.state.global_step, "step_seconds": gd_timer.per_step,
                        "after": criterion.measure(graddiff.model, tok)}
    variants = {
        "calibrated (default)": ({}, holdout),
        "fixed threshold, 32/32 minimum (earlier default)": (
            {"calibrate_stop": False, "continuation_min_prefix_tokens": 32, "continuation_min_suffix_tokens": 32},
            None),
    }
    for name, (settings, rows) in variants.items():
        model, tok = load_tiny(pair.target)
        args = MASCConfig(output_dir=str(WORK / "masc"), learning_rate=LEARNING_RATES["masc"], **common, **settings)
        trainer = MASCTrainer(model, args, train_dataset=forget, retain_dataset=retain, processing_class=tok,
                              calibrate_stop_on=rows)
        timer = StepTimer()
        trainer.add_callback(timer.callback)
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
        steps = trainer.state.global_step
        out[name] = {
            "seconds": seconds, "time_ratio_to_grad_diff": seconds / gd_seconds, "stopped_at_step": steps,
            "stop_reason": trainer.stop_reason, "per_step_ratio": (seconds / steps) / (gd_seconds / budget),
            "step_seconds": timer.per_step, "step_ratio_to_grad_diff": timer.per_step / gd_timer.per_step,
            "start_seconds": seconds - timer.per_step * steps,
            "calibration": trainer.stopping_callback.calibration, "recipe": trainer.recipe["used"],
            "after": criterion.measure(trainer.model, tok),
        }
        print("masc", name, {k: v for k, v in out[name].items() if k != "after"}, flush=True)
    return out


# ---------------------------------------------------------------------------------------------------------------
# T3
# ---------------------------------------------------------------------------------------------------------------


def t3(pair: Any, data: str) -> dict[str, Any]:
    from hf_unlearn.demo import load_tiny
    from hf_unlearn.methods.t3 import T3ClassifierConfig, calibrate_t3, fit_t3, t3_scorer

    forget, retain, evaluated, reference_tr = _rows_and_reference(pair, data)
    model, tok = load_tiny(pair.target)
    torch.manual_seed(0)
    head = fit_t3(model, tok, forget, retain, T3ClassifierConfig(rank=20, layer=-1, pooling="mean"), progress=False)
    criterion = _criterion(data)
    record = calibrate_t3(model, tok, head, criterion)
    chosen = record.chosen
    tol = criterion.retain_tolerance
    grid = [{**c, **{k: m[k] for k in ("shift_gap", "retain_change", "retain_nll_change", "retain_greedy_agreement")}}
            for c, m in zip(record.candidates, record.measurements)]
    t, w = float(chosen["temperature"]), float(chosen["tilt_weight"])
    return {
        "chosen": chosen, "reason": record.reason, "retain_tolerance": tol, "grid": grid,
        "t_above_1_within_tolerance": [g for g in grid if g["temperature"] > 1 and g["retain_change"] <= tol],
        "t_above_1_within_tolerance_by_nll": [g for g in grid if g["temperature"] > 1 and g["retain_nll_change"] <= tol],
        "forget_quality": {
            "base": forget_quality(truth_ratios(model, tok, evaluated), reference_tr),
            "chosen": forget_quality(truth_ratios(model, tok, evaluated, t3_scorer(model, head, t, w)), reference_tr),
            "greedy_equivalent (1, T*w)": forget_quality(
                truth_ratios(model, tok, evaluated, t3_scorer(model, head, 1.0, t * w)), reference_tr),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="TOFU folder (JSON Lines splits), or 'synthetic'")
    parser.add_argument("--only", default="atwu,masc,t3")
    parser.add_argument("--cache", default=None, help="model cache (default: the tests' for synthetic)")
    parser.add_argument("--out", default="benchmarks/results/fidelity_tiny")
    parser.add_argument("--masc-budget", type=int, default=100)
    parser.add_argument("--atwu-steps", type=int, default=40)
    parser.add_argument("--subject", default=None,
                        help="a TOFU-small subject (smollm2-135m): its v2 pair of forget10 authors 5-8, not TOFU-tiny")
    parser.add_argument("--atwu-lr", type=float, default=5e-4)
    parser.add_argument("--masc-lr", type=float, default=3e-3)
    parser.add_argument("--grad-diff-lr", type=float, default=3e-4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cache = args.cache or (".cache/tests" if args.data == "synthetic" else ".cache/fidelity")
    if args.subject:
        from unlearn_bench.subjects.tofu_small import SmallRecipe, build_small_pair

        pair = build_small_pair(args.subject, source=args.data, recipe=SmallRecipe.v2(args.subject, forget_offset=4),
                                cache_dir=cache, progress=False)
        args.data = str(pair.source)
    else:
        pair = subjects(args.data, Path(cache))
    LEARNING_RATES.update(atwu=args.atwu_lr, masc=args.masc_lr, grad_diff=args.grad_diff_lr)
    out_dir = Path(args.out)
    path = out_dir / f"fidelity_{args.subject or 'tiny'}_{_row_set(args.data)}.json"
    results = json.loads(path.read_text()) if path.is_file() else {}
    for name in args.only.split(","):
        start = time.perf_counter()
        if name == "atwu":
            results["atwu"] = atwu(pair, args.data, args.atwu_steps)
        elif name == "masc":
            results["masc"] = masc(pair, args.data, args.masc_budget)
        elif name == "t3":
            results["t3"] = t3(pair, args.data)
        else:
            raise SystemExit(f"unknown section {name!r}")
        results[name]["section_seconds"] = time.perf_counter() - start
    from hf_unlearn.safe_output import atomic_write_json

    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, results)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
