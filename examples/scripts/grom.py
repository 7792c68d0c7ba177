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

from transformers import AutoModelForCausalLM, AutoTokenizer, HfArgumentParser

from hf_unlearn.cli import config_kwargs, options_dataclass
from hf_unlearn.data import RETAIN_FOR_FORGET, load_tofu_rows
from hf_unlearn.data.tofu import read_jsonl
from hf_unlearn.grom import GROMConfig, fit_grom
from hf_unlearn.safe_output import check_output_dir

# GROMConfig's options as a plain dataclass that HfArgumentParser reads with every default intact (it drops the
# default of a field typed `str | list[int]`, such as `layers="auto"`, when given the config itself).
GROMOptions = options_dataclass(GROMConfig)


@dataclass
class ScriptArguments:
    model_name_or_path: str = field(
        default="tofu-tiny",
        metadata={"help": "Causal LM to unlearn from (folder or Hub id); 'tofu-tiny' builds and caches TOFU-tiny."},
    )
    dataset_name: str = field(
        default="locuslab/TOFU", metadata={"help": "TOFU source: Hub id, folder of <config>.jsonl, or 'synthetic'."}
    )
    forget_split: str = field(default="forget10", metadata={"help": "TOFU forget split: forget01, forget05, forget10."})
    forget_file: str | None = field(default=None, metadata={"help": "JSON Lines of question/answer rows to forget."})
    retain_file: str | None = field(default=None, metadata={"help": "JSON Lines of question/answer rows to keep."})


@dataclass
class OutputArguments:
    output_dir: str = field(default="outputs/grom", metadata={"help": "Folder for the adapter (refused if not empty)."})
    overwrite: bool = field(default=False, metadata={"help": "Replace a non-empty output folder (swapped in when done)."})


def model_path(args: ScriptArguments) -> str:
    if args.model_name_or_path != "tofu-tiny":
        return args.model_name_or_path
    from hf_unlearn.bench.subjects import build_tiny_pair, recipe_for

    size = "test" if args.dataset_name == "synthetic" else "tofu-test"
    return str(build_tiny_pair(args.dataset_name, args.forget_split, recipe_for(size)).target)


def rows(file: str | None, split: str, source: str) -> list[dict]:
    return read_jsonl(file) if file else load_tofu_rows(split, source)


def main(script_args: ScriptArguments, grom_options, output_args: OutputArguments) -> None:
    grom_config = GROMConfig(**config_kwargs(grom_options))
    path = model_path(script_args)
    check_output_dir(output_args.output_dir, inputs=[path], overwrite=output_args.overwrite)
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    forget = rows(script_args.forget_file, script_args.forget_split, script_args.dataset_name)
    retain = rows(script_args.retain_file, RETAIN_FOR_FORGET[script_args.forget_split], script_args.dataset_name)
    edit = fit_grom(model, tokenizer, forget, retain, grom_config)
    edit.save_pretrained(output_args.output_dir, overwrite=output_args.overwrite)
    print(f"GROM edit of {sorted(edit.solutions)} saved to {output_args.output_dir}")


if __name__ == "__main__":
    parser = HfArgumentParser((ScriptArguments, GROMOptions, OutputArguments))
    main(*parser.parse_args_into_dataclasses())
