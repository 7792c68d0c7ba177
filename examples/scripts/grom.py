"""GROM: a closed-form, one-shot unlearning edit of a causal LM (no training loop), saved as a PEFT LoRA adapter.

TOFU-tiny (a small Llama trained on the synthetic authors on first use; CPU, seconds):

    python examples/scripts/grom.py \\
        --model_name_or_path tofu-tiny --dataset_name synthetic \\
        --target_modules lm_head --forget_weight 10 --suppression_margin 30 \\
        --output_dir outputs/grom-tofu-tiny

A Hub model fine-tuned on TOFU (GPU):

    python examples/scripts/grom.py \\
        --model_name_or_path open-unlearning/tofu_Llama-3.2-1B-Instruct_full --dataset_name locuslab/TOFU \\
        --forget_split forget10 --target_modules down_proj --dtype bfloat16 \\
        --output_dir outputs/grom-llama-1b

Load the result with ``PeftModel.from_pretrained(base, output_dir)`` or ``load_grom_adapter(base, output_dir)``
(which also checks that ``base`` is the model the edit was fitted on).
"""

from dataclasses import dataclass, field

from trl import TrlParser

from hf_unlearn.methods.grom import GROMConfig, fit_grom
from hf_unlearn.model_options import DTYPE_CHOICES, ModelOptions
from hf_unlearn.options import config_kwargs, options_dataclass
from hf_unlearn.run import check_inputs
from hf_unlearn.scripts import (
    ScriptArguments,
    check_output_folder,
    load_forget_retain,
    load_model_and_tokenizer,
)


@dataclass
class SaveArguments:
    """The model's dtype and where the adapter goes (GROM does not train, so it has no ``TrainingArguments``)."""

    output_dir: str = field(default="outputs/grom", metadata={"help": "Folder of the adapter (refused if not empty)."})
    overwrite: bool = field(default=False, metadata={"help": "Replace a non-empty output_dir."})
    dtype: str = field(default="float32", metadata={"help": "dtype the model loads in.", "choices": DTYPE_CHOICES})
    push_to_hub: bool = field(default=False, metadata={"help": "Upload the adapter to hub_model_id."})
    hub_model_id: str | None = field(default=None, metadata={"help": "Hub repository of the upload (user/name)."})


def main(script_args: ScriptArguments, grom_args, save_args: SaveArguments) -> None:
    settings = config_kwargs(grom_args)
    forget, retain = load_forget_retain(script_args)
    check_inputs("grom", None, None, forget, retain, save_args.output_dir, settings)
    check_output_folder(save_args.output_dir, script_args, overwrite=save_args.overwrite)
    model, tokenizer = load_model_and_tokenizer(script_args, dtype=ModelOptions(dtype=save_args.dtype).torch_dtype())

    edit = fit_grom(model, tokenizer, forget, retain, GROMConfig(**settings))
    edit.save_pretrained(save_args.output_dir, overwrite=save_args.overwrite)
    print(f"GROM edit of {sorted(edit.deltas)} saved to {save_args.output_dir}")
    if save_args.push_to_hub:
        edit.push_to_hub(save_args.hub_model_id)


def make_parser() -> TrlParser:
    return TrlParser((ScriptArguments, options_dataclass(GROMConfig), SaveArguments))


if __name__ == "__main__":
    main(*make_parser().parse_args_and_config())
