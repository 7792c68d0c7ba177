"""T3 (temper-then-tilt): fit a small guidance head that steers decoding away from the forget answers.

Every field of ``T3ClassifierConfig`` (the head, its fit and its decoding defaults ``temperature`` and
``tilt_weight``) is an option, plus the script and output arguments below; ``--help`` lists them all. The
base model is never changed: unlearning happens at decoding time, and removing the head undoes it. The
result in ``--output_dir`` is the T3 head (``config.json`` + ``model.safetensors``); decode with it through
``T3LogitsProcessor`` (see the end of ``main``).

TOFU-tiny (a small Llama trained here on the synthetic authors on first use; CPU, seconds):

    python examples/scripts/t3.py \\
        --model_name_or_path tofu-tiny --dataset_name synthetic \\
        --rank 8 --layer 1 --temperature 1.0 --tilt_weight 1.0 \\
        --output_dir outputs/t3-tofu-tiny

A Hub model fine-tuned on TOFU:

    python examples/scripts/t3.py \\
        --model_name_or_path open-unlearning/tofu_Llama-3.2-1B-Instruct_full --dataset_name locuslab/TOFU \\
        --forget_split forget10 --rank 20 \\
        --output_dir outputs/t3-llama-1b

Your own records: ``--forget_file delete_me.jsonl`` (and optionally ``--retain_file keep.jsonl``), JSON Lines
with ``question`` and ``answer``.

The script runs what ``hf-unlearn unlearn --method t3`` runs, and given the same options both write the
same folder: the same checks before any work, then :func:`hf_unlearn.run.unlearn`; the folder is swapped
in when complete and holds ``logs/t3.jsonl`` (the training logs) beside the result.
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

METHOD = "t3"


def make_parser() -> HfArgumentParser:
    """The script's options: :class:`ScriptArguments`, :class:`OutputArguments` and every field of the method's
    config."""
    return method_parser(METHOD)


def main(script_args: ScriptArguments, output_args: OutputArguments, settings: dict[str, Any]) -> Unlearned:
    result = run_script(METHOD, script_args, output_args, settings)
    print(f"T3 head saved to {output_args.output_dir}")
    # Decoding with it (the base model stays as it is):
    #   from hf_unlearn.methods.t3 import T3LogitsProcessor
    #   processor = T3LogitsProcessor.from_pretrained(model, output_dir)
    #   model.generate(**inputs, logits_processor=[processor], do_sample=True)
    return result


if __name__ == "__main__":
    main(*parse_script_args(METHOD))
