"""Unlearn a TOFU forget split with any hf-unlearn method, then print the TOFU report.

Without ``--model`` it builds (or reuses) TOFU-tiny: a small Llama trained from scratch on TOFU
text (the target) and the same recipe on the retain authors only (the retain reference, for
forget quality). With ``--model`` and ``--retain-model`` it runs the same code on real models,
e.g. a Llama fine-tuned on TOFU and its retain-only counterpart from the Hub.

    python examples/unlearn_tofu.py --method grom --data TOFU_DIR   # a local folder of TOFU <config>.jsonl files
    python examples/unlearn_tofu.py --method npo --model <finetuned> --retain-model <retain-only> --data locuslab/TOFU
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer
from unlearn_bench.registry import PRESETS

from hf_unlearn.data import FORGET_SPLITS, RETAIN_FOR_FORGET, load_tofu_rows
from hf_unlearn.demo import TinyPair, build_tiny_pair, recipe_for, reference_rows
from hf_unlearn.evaluation import evaluate_tofu, format_report_table
from hf_unlearn.run import fit_or_train, prepare_inputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", required=True, choices=sorted(PRESETS))
    parser.add_argument("--data", default="synthetic", help="locuslab/TOFU, a local folder of <config>.jsonl, or synthetic")
    parser.add_argument("--forget-split", default="forget10", choices=FORGET_SPLITS)
    parser.add_argument("--model", help="target model (default: TOFU-tiny trained here)")
    parser.add_argument("--retain-model", help="retain reference model, with --model")
    parser.add_argument("--size", default="test", help="TOFU-tiny size when --model is not given: test, tofu-test or bench")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="method settings (JSON values)")
    parser.add_argument("--output", default="outputs/unlearn_tofu")
    parser.add_argument("--max-examples", type=int, default=None)
    args = parser.parse_args()

    if args.model:
        pair = TinyPair(Path(args.model), Path(args.retain_model or args.model), args.data, args.forget_split)
    else:
        pair = build_tiny_pair(args.data, args.forget_split, recipe_for(args.size))
    eval_kwargs = {"max_examples": args.max_examples}
    target_report, retain_report = reference_rows(pair, args.data, args.forget_split, eval_kwargs)

    settings = dict(PRESETS[args.method].demo)
    settings.update({k: json.loads(v) for k, v in (s.split("=", 1) for s in args.set)})
    model = AutoModelForCausalLM.from_pretrained(pair.target, trust_remote_code=False)
    tokenizer = AutoTokenizer.from_pretrained(pair.target, trust_remote_code=False)
    forget = load_tofu_rows(args.forget_split, args.data)
    retain = load_tofu_rows(RETAIN_FOR_FORGET[args.forget_split], args.data)
    out = Path(args.output) / args.method
    result = fit_or_train(prepare_inputs(args.method, model, tokenizer, forget, retain, out, settings))
    result.save_pretrained(out)
    report = evaluate_tofu(
        result.model, tokenizer, source=args.data, forget_split=args.forget_split, retain_reference=retain_report,
        scorer=result.scorer, generation_kwargs=result.generation_kwargs, output_path=out / "tofu_report.json",
        **eval_kwargs,
    )
    print(f"{args.method}: {result.seconds:.1f}s, settings {result.settings}")
    print(format_report_table({"target": target_report, "retain reference": retain_report, args.method: report}))


if __name__ == "__main__":
    main()
