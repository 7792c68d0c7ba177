"""T3 (temper-then-tilt): fit a small guidance head that steers decoding away from the forget answers.

The base model is not changed: unlearning happens at decoding time, with the head saved in ``--output_dir``.

TOFU-tiny (a small Llama trained on the synthetic authors on first use; CPU, seconds):

    python examples/scripts/t3.py \\
        --model_name_or_path tofu-tiny --dataset_name synthetic \\
        --rank 8 --layer 1 --temperature 1.0 --tilt_weight 1.0 \\
        --output_dir outputs/t3-tofu-tiny

A Hub model fine-tuned on TOFU (GPU):

    python examples/scripts/t3.py \\
        --model_name_or_path open-unlearning/tofu_Llama-3.2-1B-Instruct_full --dataset_name locuslab/TOFU \\
        --forget_split forget10 --rank 20 --dtype bfloat16 \\
        --output_dir outputs/t3-llama-1b

Decode with the head:

    processor = T3LogitsProcessor.from_pretrained(model, "outputs/t3-tofu-tiny")
    model.generate(**inputs, logits_processor=[processor], do_sample=True)
"""

from dataclasses import dataclass, field

from trl import TrlParser

from hf_unlearn.methods.t3 import T3ClassifierConfig, fit_t3
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
    """The model's dtype and where the head goes (T3 does not train the model, so it has no ``TrainingArguments``)."""

    output_dir: str = field(default="outputs/t3", metadata={"help": "Folder of the T3 head (refused if not empty)."})
    overwrite: bool = field(default=False, metadata={"help": "Replace a non-empty output_dir."})
    dtype: str = field(default="float32", metadata={"help": "dtype the model loads in.", "choices": DTYPE_CHOICES})
    push_to_hub: bool = field(default=False, metadata={"help": "Upload the head to hub_model_id."})
    hub_model_id: str | None = field(default=None, metadata={"help": "Hub repository of the upload (user/name)."})


def main(script_args: ScriptArguments, t3_args, save_args: SaveArguments) -> None:
    settings = config_kwargs(t3_args)
    forget, retain = load_forget_retain(script_args)
    check_inputs("t3", None, None, forget, retain, save_args.output_dir, settings)
    check_output_folder(save_args.output_dir, script_args, overwrite=save_args.overwrite)
    model, tokenizer = load_model_and_tokenizer(script_args, dtype=ModelOptions(dtype=save_args.dtype).torch_dtype())

    head = fit_t3(model, tokenizer, forget, retain, T3ClassifierConfig(**settings))
    head.save_pretrained(save_args.output_dir)
    print(f"T3 head saved to {save_args.output_dir}")
    if save_args.push_to_hub:
        head.push_to_hub(save_args.hub_model_id)


def make_parser() -> TrlParser:
    return TrlParser((ScriptArguments, options_dataclass(T3ClassifierConfig), SaveArguments))


if __name__ == "__main__":
    main(*make_parser().parse_args_and_config())
