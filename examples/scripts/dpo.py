"""DPO unlearning (each forget row's alternate answer preferred over its answer, with a retain term), TRL-style.

Every field of ``UnlearnDPOConfig`` (and so of ``trl.SFTConfig`` / ``transformers.TrainingArguments``) is an option,
plus the script arguments below; ``--help`` lists them all. The result is the unlearned model
(``model.safetensors`` + tokenizer) in ``--output_dir``.

The forget rows need the preferred answer of each row in ``alternate_answer`` (a string, or a list of strings
of which one is drawn per row with ``--seed``); ``--alternate_column`` names another column, and rows without it
are refused before any work. TOFU's forget splits carry none, but its ``*_perturbed`` configs hold the same rows
with wrong answers in ``perturbed_answer``; write them to a file and prefer those:

    python -c "from hf_unlearn.data import load_tofu_rows; import json; print(*(json.dumps(r) for r in
        load_tofu_rows('forget10_perturbed', 'synthetic')), sep='\\n')" > forget10_alternates.jsonl

TOFU-tiny (a small Llama trained here on the synthetic authors on first use; CPU, about a minute):

    python examples/scripts/dpo.py \\
        --model_name_or_path tofu-tiny --dataset_name synthetic --forget_file forget10_alternates.jsonl \\
        --alternate_column perturbed_answer --learning_rate 1e-3 --beta 0.1 --num_train_epochs 10 \\
        --per_device_train_batch_size 8 --output_dir outputs/dpo-tofu-tiny

A Hub model fine-tuned on TOFU (GPU), with your own rows (``question``, ``answer``, ``alternate_answer``; the
retain rows default to TOFU's retain90):

    python examples/scripts/dpo.py \\
        --model_name_or_path open-unlearning/tofu_Llama-3.2-1B-Instruct_full --dataset_name locuslab/TOFU \\
        --forget_file delete_me.jsonl --learning_rate 1e-5 --beta 0.1 --bf16 True --output_dir outputs/dpo-llama-1b

The script runs what ``hf-unlearn unlearn --method dpo`` runs, and given the same options both write the
same folder: the same checks before any work, then :func:`hf_unlearn.run.unlearn`; the folder is swapped
in when complete and holds ``logs/dpo.jsonl`` (the training logs) beside the result.
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

METHOD = "dpo"


def make_parser() -> HfArgumentParser:
    """The script's options: :class:`ScriptArguments`, :class:`OutputArguments` and every field of the method's
    config."""
    return method_parser(METHOD)


def main(script_args: ScriptArguments, output_args: OutputArguments, settings: dict[str, Any]) -> Unlearned:
    result = run_script(METHOD, script_args, output_args, settings)
    print(f"dpo: unlearned in {result.seconds:.1f}s, saved to {output_args.output_dir}")
    return result


if __name__ == "__main__":
    main(*parse_script_args(METHOD))
