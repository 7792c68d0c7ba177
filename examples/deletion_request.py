"""A deletion request, end to end: unlearn a file of records, check it worked, publish the result with a card.

Given a causal LM and a JSON Lines file of the records to delete (``question``/``answer`` rows), this script

1. unlearns them with a chosen method (``--method``; the method's config fields are options too, as in
   ``hf-unlearn unlearn``, e.g. ``--target_modules lm_head``);
2. measures forget and retain behaviour of the model before and after (mean answer NLL and greedy-answer
   ROUGE-L recall on the records, and on a sample of the retain rows), next to a reference: a retain model
   that never saw the records (``--retain_model``), or, when none exists, the untouched model, labelled as
   such (it shows how much changed, not how close the result is to never having seen the data);
3. re-checks the forget behaviour after 4-bit NF4 quantization (a deployed copy is often quantized, and
   quantization can bring forgotten answers back); T3 leaves the weights alone, so it has no re-check; then runs
   the attacks of :mod:`hf_unlearn.evaluation.attacks` (``--attacks``, default ``quant,relearn``): 4-bit and 8-bit
   copies, and a few fine-tuning steps on 10% of the records (measured on the other 90%) and on retain rows only,
   each reported with the share of the gap to the original model it brought back (for T3 the base is attacked
   and its head kept, not refitted);
4. writes ``deletion_report.json`` and ``deletion_report.md`` (the table below) to ``--output_dir``;
5. publishes the native artifact (weights, LoRA adapter or T3 head) with a model card and the report to
   ``--repo``, a local folder by default, and with ``--push_to_hub OWNER/NAME`` also to the Hub.

Every check of the inputs (output folders, repo id, token) runs before any work; every file is written
through a temporary folder and swapped in when complete.

On TOFU-tiny (built on first use; the records are the synthetic forget10 authors):

    unlearn-bench tiny --size test --data synthetic          # prints the target and retain-reference folders
    python examples/deletion_request.py --model <target folder> --retain_model <retain folder> \\
        --records delete_me.jsonl --retain_data synthetic --method grom --target_modules lm_head \\
        --output_dir outputs/deletion-request

On a Hub model, with your own records and TOFU's retain split as the data to keep:

    python examples/deletion_request.py --model open-unlearning/tofu_Llama-3.2-1B-Instruct_full \\
        --records delete_me.jsonl --retain_data locuslab/TOFU --method masc --learning_rate 1e-5 \\
        --output_dir outputs/deletion-request --push_to_hub my-org/llama-1b-deletion-2026-001
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from transformers import AutoModelForCausalLM
from unlearn_bench.registry import PRESETS

from hf_unlearn.data.tofu import read_jsonl
from hf_unlearn.evaluation import (
    artifact_decoding,
    generate_answers,
    quantize_nf4,
    rouge_l_recall,
    run_attacks,
)
from hf_unlearn.evaluation.attacks import check_attack_options, parse_attacks
from hf_unlearn.logprobs import mean_answer_nll
from hf_unlearn.options import UserError, parse_method_settings
from hf_unlearn.preconditions import check_push_target, load_model, load_rows
from hf_unlearn.run import JsonlLogCallback, TrainOptions, fit_or_train, prepare_inputs
from hf_unlearn.safe_output import atomic_directory, atomic_write_json, atomic_write_text, check_output_dir

COLUMNS = (("forget_nll", "forget NLL", ".3f"), ("forget_rouge_l", "forget ROUGE-L", ".3f"),
           ("retain_nll", "retain NLL", ".3f"), ("retain_rouge_l", "retain ROUGE-L", ".3f"))


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--model", required=True, help="model folder or Hub id to delete the records from")
    parser.add_argument("--records", required=True, help="JSON Lines file of question/answer rows to delete")
    parser.add_argument("--method", default="grom", choices=sorted(PRESETS))
    parser.add_argument("--preset", choices=("none", "demo"), default="none",
                        help="start from the config defaults or the method's TOFU-tiny demo setting")
    parser.add_argument("--retain_file", help="JSON Lines file of rows to keep (default: --retain_data's split)")
    parser.add_argument("--retain_data", default="locuslab/TOFU", help="TOFU source of the retain rows")
    parser.add_argument("--retain_split", default="retain90", help="TOFU retain split (with --retain_data)")
    parser.add_argument("--retain_model", help="a model that never saw the records (the reference)")
    parser.add_argument("--retain_eval_rows", type=int, default=40, help="retain rows scored before/after")
    parser.add_argument("--max_new_tokens", type=int, default=64)
    parser.add_argument("--attacks", default="quant,relearn",
                        help="attacks that try to bring the records back: quant, relearn, both (default) or none")
    parser.add_argument("--relearn_steps", type=int, default=10, help="relearning attack: fine-tuning steps")
    parser.add_argument("--relearn_lr", type=float, default=1e-4,
                        help="relearning attack: learning rate (use the model's own fine-tuning rate)")
    parser.add_argument("--output_dir", required=True, help="folder for the report and logs")
    parser.add_argument("--repo", help="local folder to publish to (default: <output_dir>/repo)")
    parser.add_argument("--push_to_hub", metavar="REPO_ID", help="also upload the published folder to the Hub")
    parser.add_argument("--hub_token", help="token for --push_to_hub (default: HF_TOKEN or the saved login)")
    parser.add_argument("--overwrite", action="store_true", help="replace non-empty output folders")
    args, extra = parser.parse_known_args(argv)
    preset = dict(PRESETS[args.method].demo) if args.preset == "demo" else {}
    return args, parse_method_settings(args.method, extra, preset)


def behaviour(model: Any, tokenizer: Any, records: list[dict], retain: list[dict], max_new_tokens: int,
              scorer: Any = None, generation_kwargs: dict | None = None) -> dict[str, float]:
    """Mean answer NLL and greedy ROUGE-L recall on the records and (when given) on the retain sample."""
    out = {}
    for name, rows in (("forget", records), ("retain", retain)):
        if not rows:
            continue
        out[f"{name}_nll"] = mean_answer_nll(model, tokenizer, rows, scorer=scorer)
        answers = generate_answers(model, tokenizer, [r["question"] for r in rows], max_new_tokens=max_new_tokens,
                                   generation_kwargs=generation_kwargs)
        scores = rouge_l_recall(answers, [r["answer"] for r in rows])
        out[f"{name}_rouge_l"] = float(sum(scores) / len(scores))
    return out


def markdown(report: dict[str, Any]) -> str:
    rows = [("before (original model)", report["before"]), (f"after ({report['method']})", report["after"]),
            ("after, NF4-quantized", report["after_nf4"]),
            (f"reference: {report['reference']['kind']}", report["reference"]["behaviour"])]
    lines = ["| model | " + " | ".join(t for _, t, _ in COLUMNS) + " |", "|---|" + "---:|" * len(COLUMNS)]
    for name, values in rows:
        cells = ["n/a" if values.get(k) is None else format(values[k], f) for k, _, f in COLUMNS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    attacked = attack_rows(report.get("attacks") or {})
    if attacked:
        lines += ["", "| attack | forget NLL | forget ROUGE-L | recovered (NLL) |", "|---|---:|---:|---:|"]
        lines += [f"| {name} | " + " | ".join("n/a" if v is None else f"{v:.3f}" for v in values) + " |"
                  for name, values in attacked]
    return "\n".join(lines)


def attack_rows(attacks: dict[str, Any]) -> list[tuple[str, tuple]]:
    """(name, (forget NLL, forget ROUGE-L, recovered fraction)) per attack, for the report's second table."""
    rows = []
    quant = attacks.get("quantization")
    if quant:
        full = quant["full_precision"]
        rows.append(("no attack (full precision)", (full["forget_nll"], full["forget_rouge_l"], None)))
        rows += [(f"{e['bits']}-bit {e['scheme']}", (e["forget_nll"], e["forget_rouge_l"], e["recovered_fraction"]))
                 for e in quant["bits"].values()]
    relearn = attacks.get("relearning")
    if relearn:
        what = f"{relearn['steps']} steps on {relearn['num_attack_rows']} records, measured on {relearn['num_eval_rows']}"
        rows.append((f"relearning ({what})", (relearn["forget_nll_after"], relearn["forget_rouge_l_after"],
                                              relearn["recovered_fraction"])))
        benign = relearn.get("benign")
        if benign:
            rows.append((f"benign fine-tune ({relearn['steps']} steps on retain rows)",
                         (benign["forget_nll_after"], benign["forget_rouge_l_after"], benign["recovered_fraction"])))
    return rows


def model_card(result: Any, args: argparse.Namespace, report: dict[str, Any]) -> str:
    from hf_unlearn.hub import build_model_card, detect_artifact_kind

    card = build_model_card(detect_artifact_kind(result.artifact), args.model, method=args.method,
                            settings=result.settings, repo_id=args.push_to_hub,
                            forget_split=Path(args.records).stem, dataset="deletion-request records")
    return (f"{card}\n\n## Deletion request\n\n{report['num_records']} records were unlearned with "
            f"`{args.method}` in {report['seconds']:.1f} s. Reference: {report['reference']['kind']}.\n\n"
            f"{markdown(report)}\n")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args, settings = parse_args(argv)
    out = Path(args.output_dir)
    repo = Path(args.repo) if args.repo else out / "repo"
    # Every check before any work: output folders, the records, the Hub target.
    check_output_dir(out, inputs=[args.model], overwrite=args.overwrite)
    if not repo.resolve().is_relative_to(out.resolve()):
        check_output_dir(repo, inputs=[args.model], overwrite=args.overwrite)
    token = check_push_target(args.push_to_hub, args.hub_token)
    records = read_jsonl(args.records)
    if not records or any("question" not in r or "answer" not in r for r in records):
        raise UserError(f"{args.records}: every line must be a JSON object with 'question' and 'answer'.")
    retain = load_rows(args.retain_split, args.retain_data, args.retain_file)
    retain_eval = retain[: args.retain_eval_rows]
    attacks = parse_attacks(None if args.attacks == "none" else args.attacks)
    if "relearn" in attacks:
        if len(records) < 2:
            raise UserError("The relearning attack needs at least 2 records (one to train on, one to measure); "
                            "pass --attacks quant or --attacks none.")
        attacks["relearn"].update(steps=args.relearn_steps, learning_rate=args.relearn_lr)
    try:
        check_attack_options(attacks)
    except ValueError as err:
        raise UserError(str(err)) from None

    model, tokenizer = load_model(args.model)
    print(f"1/5 measuring the original model on {len(records)} records and {len(retain_eval)} retain rows")
    before = behaviour(model, tokenizer, records, retain_eval, args.max_new_tokens)
    if args.retain_model:
        ref_model = AutoModelForCausalLM.from_pretrained(args.retain_model, trust_remote_code=False)
        reference = {"kind": "retain model", "model": args.retain_model,
                     "behaviour": behaviour(ref_model, tokenizer, records, retain_eval, args.max_new_tokens)}
        del ref_model
    else:
        reference = {"kind": "untouched model (no retain model given)", "model": args.model, "behaviour": before}

    with atomic_directory(out, overwrite=args.overwrite) as work:
        print(f"2/5 unlearning with {args.method}")
        inputs = prepare_inputs(args.method, model, tokenizer, records, retain, work / "run", settings)
        log = JsonlLogCallback(work / "logs" / f"{args.method}.jsonl")
        result = fit_or_train(inputs, TrainOptions(callbacks=[log], quiet=False))
        print("3/5 measuring the result (and after NF4 quantization)")
        after = behaviour(result.model, tokenizer, records, retain_eval, args.max_new_tokens,
                          scorer=result.scorer, generation_kwargs=result.generation_kwargs)
        if result.weights_changed:
            after_nf4 = behaviour(quantize_nf4(result.model), tokenizer, records, [], args.max_new_tokens)
        else:
            after_nf4 = {"forget_nll": None, "forget_rouge_l": None, "note": "weights unchanged (T3)"}
        attack_report = None
        if attacks:
            print(f"   attacks: {', '.join(attacks)} (against the original model, reloaded)")
            original, _ = load_model(args.model)
            # a decoding-time method: the base is attacked, the artifact kept
            decoding = artifact_decoding(result.artifact) if result.scorer is not None else None
            attack_report = run_attacks(result.model, tokenizer, records, retain, attacks, original=original,
                                        decoding=decoding, max_new_tokens=args.max_new_tokens, progress=False)
            del original
        report = {
            "method": args.method, "settings": {k: v for k, v in result.settings.items() if _jsonable(v)},
            "model": args.model, "records_file": str(args.records), "num_records": len(records),
            "num_retain_eval_rows": len(retain_eval), "seconds": result.seconds,
            "weights_changed": result.weights_changed, "before": before, "after": after, "after_nf4": after_nf4,
            "reference": reference, "attacks": attack_report,
        }
        print("4/5 writing the report")
        table = markdown(report)
        atomic_write_json(work / "deletion_report.json", report)
        atomic_write_text(work / "deletion_report.md", table + "\n")
        print(f"5/5 publishing to {repo}" + (f" and {args.push_to_hub}" if args.push_to_hub else ""))
        inside = repo.resolve().is_relative_to(out.resolve())
        target = work / repo.resolve().relative_to(out.resolve()) if inside else repo
        with atomic_directory(target, overwrite=args.overwrite or inside) as folder:
            result.save_pretrained(folder)
            if result.artifact is result.model:
                tokenizer.save_pretrained(folder)
            atomic_write_text(folder / "README.md", model_card(result, args, report))
            atomic_write_json(folder / "deletion_report.json", report)
        if result.info.get("trainer") is not None:  # the trainer's own run folder is not part of the result
            shutil.rmtree(work / "run", ignore_errors=True)
    if args.push_to_hub:
        from huggingface_hub import HfApi

        HfApi(token=token).create_repo(args.push_to_hub, exist_ok=True)
        HfApi(token=token).upload_folder(folder_path=str(repo), repo_id=args.push_to_hub,
                                         commit_message=f"Deletion request: {len(records)} records ({args.method})")
    print()
    print(table)
    print(f"\nreport: {out / 'deletion_report.json'}\npublished: {repo}")
    return report


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False


if __name__ == "__main__":
    from hf_unlearn.console import quiet_console

    quiet_console()  # as the CLI does: no third-party log chatter or progress bars (this process only)
    try:
        main()
    except UserError as err:
        print(f"deletion_request: error: {err}", file=sys.stderr)
        sys.exit(2)
