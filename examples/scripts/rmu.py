"""RMU unlearning: the forget answers' hidden states at one layer steered to a fixed random vector, the retain
answers' held to the frozen model's. ``--layer`` must be one of the model's decoder layers (the tiny model has 2).

TOFU-tiny (a small Llama trained on the synthetic authors on first use; CPU, about a minute):

    python examples/scripts/rmu.py \\
        --model_name_or_path tofu-tiny --dataset_name synthetic \\
        --layer 1 --steering_coeff 2 --learning_rate 1e-3 --num_train_epochs 10 --per_device_train_batch_size 8 \\
        --output_dir outputs/rmu-tofu-tiny

A Hub model fine-tuned on TOFU (GPU):

    python examples/scripts/rmu.py \\
        --model_name_or_path open-unlearning/tofu_Llama-3.2-1B-Instruct_full --dataset_name locuslab/TOFU \\
        --forget_split forget10 --layer 7 --steering_coeff 2 --learning_rate 1e-5 --num_train_epochs 10 --bf16 True \\
        --output_dir outputs/rmu-llama-1b

The WMDP authors train only three down-projections: ``--trainable_params 'model\\.layers\\.(5|6|7)\\.mlp\\.down_proj\\.weight'``.
"""

from trl import TrlParser, get_peft_config

from hf_unlearn.methods.rmu import RMUConfig, RMUTrainer
from hf_unlearn.model_options import ModelOptions
from hf_unlearn.run import check_inputs
from hf_unlearn.scripts import (
    ScriptArguments,
    check_output_folder,
    load_forget_retain,
    load_model_and_tokenizer,
)


def main(script_args: ScriptArguments, training_args: RMUConfig, model_args: ModelOptions) -> None:
    forget, retain = load_forget_retain(script_args)
    check_inputs("rmu", None, None, forget, retain, training_args.output_dir, training_args.to_dict())
    check_output_folder(training_args.output_dir, script_args, overwrite=training_args.overwrite)
    model, tokenizer = load_model_and_tokenizer(script_args, dtype=model_args.torch_dtype())

    trainer = RMUTrainer(
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
    return TrlParser((ScriptArguments, RMUConfig, ModelOptions))


if __name__ == "__main__":
    main(*make_parser().parse_args_and_config())
