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
from hf_unlearn.grom import GROMConfig, fit_grom
from hf_unlearn.safe_output import check_output_dir

# GROMConfig's options as a plain dataclass that HfArgumentParser reads with every default intact (it drops the
# default of a field typed `str | list[int]`, such as `layers="auto"`, when given the config itself).
GROMOptions = options_dataclass(GROMConfig)


@dataclass
class OutputArguments:
    output_dir: str = field(default="outputs/grom", metadata={"help": "Folder for the adapter (refused if not empty)."})
    overwrite: bool = field(default=False, metadata={"help": "Replace a non-empty output folder (swapped in when done)."})


def main(script_args: ScriptArguments, grom_options, output_args: OutputArguments) -> None:
    grom_config = GROMConfig(**config_kwargs(grom_options))
    path = model_path(script_args)
    check_output_dir(output_args.output_dir, inputs=[path], overwrite=output_args.overwrite)
    model, tokenizer = load_model_and_tokenizer(path)
    forget, retain = load_forget_retain(script_args)
    edit = fit_grom(model, tokenizer, forget, retain, grom_config)
    edit.save_pretrained(output_args.output_dir, overwrite=output_args.overwrite)
    print(f"GROM edit of {sorted(edit.solutions)} saved to {output_args.output_dir}")


if __name__ == "__main__":
    parser = HfArgumentParser((ScriptArguments, GROMOptions, OutputArguments))
    main(*parser.parse_args_into_dataclasses())
