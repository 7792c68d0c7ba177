"""GradAscent unlearning: gradient ascent on the forget answers (no retain term; a retain set is watched for divergence).

TOFU-tiny (a small Llama trained on the synthetic authors on first use; CPU, about a minute):

    python examples/scripts/grad_ascent.py \\
        --model_name_or_path tofu-tiny --dataset_name synthetic \\
        --learning_rate 3e-4 --num_train_epochs 5 --per_device_train_batch_size 8 \\
        --output_dir outputs/grad_ascent-tofu-tiny

A Hub model fine-tuned on TOFU (GPU):

    python examples/scripts/grad_ascent.py \\
        --model_name_or_path open-unlearning/tofu_Llama-3.2-1B-Instruct_full --dataset_name locuslab/TOFU \\
        --forget_split forget10 --learning_rate 1e-5 --num_train_epochs 5 --bf16 True \\
        --output_dir outputs/grad_ascent-llama-1b
"""

from trl import TrlParser, get_peft_config

from hf_unlearn.methods.baselines import GradAscentConfig, GradAscentTrainer
from hf_unlearn.model_options import ModelOptions
from hf_unlearn.run import check_inputs
from hf_unlearn.scripts import (
    ScriptArguments,
    check_output_folder,
    load_forget_retain,
    load_model_and_tokenizer,
)


def main(script_args: ScriptArguments, training_args: GradAscentConfig, model_args: ModelOptions) -> None:
    forget, retain = load_forget_retain(script_args)
    check_inputs("grad_ascent", None, None, forget, retain, training_args.output_dir, training_args.to_dict())
    check_output_folder(training_args.output_dir, script_args, overwrite=training_args.overwrite)
    model, tokenizer = load_model_and_tokenizer(script_args, dtype=model_args.torch_dtype())

    trainer = GradAscentTrainer(
        model=model,
        args=training_args,
        train_dataset=forget,
        retain_dataset=retain,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args.trl_model_config()),
    )
    trainer.train()
    trainer.save_model(training_args.output_dir)
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)


def make_parser() -> TrlParser:
    return TrlParser((ScriptArguments, GradAscentConfig, ModelOptions))


if __name__ == "__main__":
    main(*make_parser().parse_args_and_config())
