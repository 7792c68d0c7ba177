"""GROM: a closed-form, one-shot unlearning edit of a causal LM, saved as a PEFT LoRA adapter.

Every field of ``GROMConfig`` is an option, plus the script and output arguments below; ``--help`` lists them
all. GROM reads the forget and retain answers with forward passes only and solves the edit in closed form
(no training loop); the base weights are not changed. The result in ``--output_dir`` is a LoRA adapter
(``adapter_config.json`` + ``adapter_model.safetensors``, loadable by ``PeftModel.from_pretrained``) with
``grom_metadata.json`` (settings, layer scores, base fingerprint) and the audit state for per-example
influence.

TOFU-tiny (a small Llama trained here on the synthetic authors on first use; CPU, seconds):

    python examples/scripts/grom.py \\
        --model_name_or_path tofu-tiny --dataset_name synthetic \\
        --target_modules lm_head --forget_weight 10 --suppression_margin 30 \\
        --output_dir outputs/grom-tofu-tiny

A Hub model fine-tuned on TOFU:

    python examples/scripts/grom.py \\
        --model_name_or_path open-unlearning/tofu_Llama-3.2-1B-Instruct_full --dataset_name locuslab/TOFU \\
        --forget_split forget10 --target_modules down_proj \\
        --output_dir outputs/grom-llama-1b

Your own records: ``--forget_file delete_me.jsonl`` (and optionally ``--retain_file keep.jsonl``), JSON Lines
with ``question`` and ``answer``.

The script runs what ``hf-unlearn unlearn --method grom`` runs, and given the same options both write the
same folder: the same checks before any work, then :func:`hf_unlearn.run.unlearn`; the folder is swapped
in when complete and holds ``logs/grom.jsonl`` (the training logs) beside the result.
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

METHOD = "grom"


def make_parser() -> HfArgumentParser:
    """The script's options: :class:`ScriptArguments`, :class:`OutputArguments` and every field of the method's
    config."""
    return method_parser(METHOD)


def main(script_args: ScriptArguments, output_args: OutputArguments, settings: dict[str, Any]) -> Unlearned:
    result = run_script(METHOD, script_args, output_args, settings)
    print(f"GROM edit of {sorted(result.artifact.solutions)} saved to {output_args.output_dir}")
    return result


if __name__ == "__main__":
    main(*parse_script_args(METHOD))
