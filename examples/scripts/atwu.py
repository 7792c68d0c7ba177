"""ATWU unlearning (alternating token-weighted unlearning with a learned token weighter), TRL-style.

Every field of ``ATWUConfig`` (and so of ``trl.SFTConfig`` / ``transformers.TrainingArguments``) is an option,
plus the script arguments below; ``--help`` lists them all. ATWU learns which answer tokens carry the
forget content and spares structural tokens. The result is the unlearned model in ``--output_dir`` with
the token weighter saved beside it.

TOFU-tiny (a small Llama trained here on the synthetic authors on first use; CPU, about a minute):

    python examples/scripts/atwu.py \\
        --model_name_or_path tofu-tiny --dataset_name synthetic \\
        --learning_rate 5e-4 --num_train_epochs 10 --per_device_train_batch_size 8 --weight_decay 0.0 \\
        --output_dir outputs/atwu-tofu-tiny

A Hub model fine-tuned on TOFU (GPU):

    python examples/scripts/atwu.py \\
        --model_name_or_path open-unlearning/tofu_Llama-3.2-1B-Instruct_full --dataset_name locuslab/TOFU \\
        --forget_split forget10 --learning_rate 1e-5 --num_train_epochs 10 --bf16 True \\
        --output_dir outputs/atwu-llama-1b

Your own records: ``--forget_file delete_me.jsonl`` (and optionally ``--retain_file keep.jsonl``), JSON Lines
with ``question`` and ``answer``.

The script runs what ``hf-unlearn unlearn --method atwu`` runs, and given the same options both write the
same folder: the same checks before any work, then :func:`hf_unlearn.run.unlearn`; the folder is swapped
in when complete and holds ``logs/atwu.jsonl`` (the training logs) beside the result.
"""

from __future__ import annotations

from typing import Any

from transformers import HfArgumentParser

from hf_unlearn.result import Unlearned
from hf_unlearn.scripts import (
    OutputArguments,
    ScriptArguments,
    method_parser,
    parse_script_args,
    run_script,
)

METHOD = "atwu"


def make_parser() -> HfArgumentParser:
    """The script's options: :class:`ScriptArguments`, :class:`OutputArguments` and every field of the method's
    config."""
    return method_parser(METHOD)


def main(script_args: ScriptArguments, output_args: OutputArguments, settings: dict[str, Any]) -> Unlearned:
    result = run_script(METHOD, script_args, output_args, settings)
    print(f"atwu: unlearned in {result.seconds:.1f}s, saved to {output_args.output_dir}")
    return result


if __name__ == "__main__":
    main(*parse_script_args(METHOD))
