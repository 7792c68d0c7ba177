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
"""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import HfArgumentParser

from hf_unlearn.bench.script_args import (
    ScriptArguments,
    load_forget_retain,
    load_model_and_tokenizer,
    model_path,
)
from hf_unlearn.cli import config_kwargs, options_dataclass
from hf_unlearn.safe_output import atomic_directory, check_output_dir
from hf_unlearn.t3 import T3ClassifierConfig, fit_t3

# T3ClassifierConfig is a transformers config; its options (every field but the base-model fields that the
# fit fills in) come as a plain dataclass that HfArgumentParser can read.
T3Options = options_dataclass(T3ClassifierConfig)


@dataclass
class OutputArguments:
    output_dir: str = field(default="outputs/t3", metadata={"help": "Folder for the T3 head (refused if not empty)."})
    overwrite: bool = field(default=False, metadata={"help": "Replace a non-empty output folder (swapped in when done)."})


def main(script_args: ScriptArguments, t3_options, output_args: OutputArguments) -> None:
    path = model_path(script_args)
    check_output_dir(output_args.output_dir, inputs=[path], overwrite=output_args.overwrite)
    model, tokenizer = load_model_and_tokenizer(path)
    forget, retain = load_forget_retain(script_args)
    config = T3ClassifierConfig(**config_kwargs(t3_options))
    head = fit_t3(model, tokenizer, forget, retain, config)
    with atomic_directory(output_args.output_dir, overwrite=output_args.overwrite) as tmp:
        head.save_pretrained(tmp)
    print(f"T3 head saved to {output_args.output_dir}")
    # Decoding with it (the base model stays as it is):
    #   from hf_unlearn.t3 import T3LogitsProcessor
    #   processor = T3LogitsProcessor.from_pretrained(model, output_dir)
    #   model.generate(**inputs, logits_processor=[processor], do_sample=True)


if __name__ == "__main__":
    parser = HfArgumentParser((ScriptArguments, T3Options, OutputArguments))
    main(*parser.parse_args_into_dataclasses())
