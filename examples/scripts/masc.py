"""MASC unlearning: margin self-correction, which stops by itself when its held-out rule fires.

``max_steps`` is only a budget. MASC trains a LoRA adapter by default (``use_peft=True`` and the ``lora_*`` fields
of ``MASCConfig``; load the result with ``peft.AutoPeftModelForCausalLM``), or the full weights with
``--use_peft False``.

TOFU-tiny (a small Llama trained on the synthetic authors on first use; CPU, about a minute):

    python examples/scripts/masc.py \\
        --model_name_or_path tofu-tiny --dataset_name synthetic \\
        --learning_rate 3e-4 --per_device_train_batch_size 4 --margin_threshold 1.0 --stop_tolerance 0.3 \\
        --output_dir outputs/masc-tofu-tiny

A Hub model fine-tuned on TOFU (GPU):

    python examples/scripts/masc.py \\
        --model_name_or_path open-unlearning/tofu_Llama-3.2-1B-Instruct_full --dataset_name locuslab/TOFU \\
        --forget_split forget10 --learning_rate 1e-5 --bf16 True \\
        --output_dir outputs/masc-llama-1b
"""

from dataclasses import dataclass, field

from trl import TrlParser

from hf_unlearn.methods.masc import MASCConfig, MASCTrainer
from hf_unlearn.model_options import DTYPE_CHOICES, ModelOptions
from hf_unlearn.run import check_inputs
from hf_unlearn.scripts import (
    ScriptArguments,
    check_output_folder,
    load_forget_retain,
    load_model_and_tokenizer,
)


@dataclass
class ModelArguments:
    """TRL's model options that MASCConfig does not have (its own ``use_peft`` and ``lora_*`` set the adapter)."""

    dtype: str = field(default="float32", metadata={"help": "dtype the model loads in.", "choices": DTYPE_CHOICES})


def main(script_args: ScriptArguments, training_args: MASCConfig, model_args: ModelArguments) -> None:
    forget, retain = load_forget_retain(script_args)
    check_inputs("masc", None, None, forget, retain, training_args.output_dir, training_args.to_dict())
    check_output_folder(training_args.output_dir, script_args, overwrite=training_args.overwrite)
    model, tokenizer = load_model_and_tokenizer(script_args, dtype=ModelOptions(dtype=model_args.dtype).torch_dtype())

    trainer = MASCTrainer(
        model=model,
        args=training_args,
        train_dataset=forget,
        retain_dataset=retain,
        processing_class=tokenizer,
    )
    trainer.train()
    trainer.save_model(training_args.output_dir)
    outcome = trainer.training_outcome()
    print(f"MASC stopped at step {outcome.global_step} ({outcome.stop_reason or 'end of the schedule'})")
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)


def make_parser() -> TrlParser:
    return TrlParser((ScriptArguments, MASCConfig, ModelArguments))


if __name__ == "__main__":
    main(*make_parser().parse_args_and_config())
