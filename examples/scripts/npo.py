"""NPO unlearning (negative preference optimization on the forget answers, with a retain term), TRL-style.

Every field of ``NPOConfig`` (and so of ``trl.SFTConfig`` / ``transformers.TrainingArguments``) is an option,
plus the script arguments below; ``--help`` lists them all. The result is the unlearned model
(``model.safetensors`` + tokenizer) in ``--output_dir``.

TOFU-tiny (a small Llama trained here on the synthetic authors on first use; CPU, about a minute):

    python examples/scripts/npo.py \\
        --model_name_or_path tofu-tiny --dataset_name synthetic \\
        --learning_rate 1e-3 --beta 0.1 --num_train_epochs 10 --per_device_train_batch_size 8 \\
        --output_dir outputs/npo-tofu-tiny

A Hub model fine-tuned on TOFU (GPU):

    python examples/scripts/npo.py \\
        --model_name_or_path open-unlearning/tofu_Llama-3.2-1B-Instruct_full --dataset_name locuslab/TOFU \\
        --forget_split forget10 --learning_rate 1e-5 --beta 0.1 --num_train_epochs 10 --bf16 True \\
        --output_dir outputs/npo-llama-1b

Your own records: ``--forget_file delete_me.jsonl`` (and optionally ``--retain_file keep.jsonl``), JSON Lines
with ``question`` and ``answer``.
"""

from __future__ import annotations

from transformers import HfArgumentParser

from hf_unlearn.bench.script_args import ScriptArguments, load_forget_retain, load_model_and_tokenizer
from hf_unlearn.trainers import NPOConfig, NPOTrainer


def main(script_args: ScriptArguments, training_args: NPOConfig) -> None:
    model, tokenizer = load_model_and_tokenizer(script_args)
    # the retain rows only when the objective has a retain term (alpha > 0)
    needs_retain = NPOTrainer.needs_retain(training_args)
    forget, retain = load_forget_retain(script_args, needs_retain, as_dataset=True)
    trainer = NPOTrainer(
        model=model, args=training_args, train_dataset=forget, retain_dataset=retain, processing_class=tokenizer
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)


if __name__ == "__main__":
    parser = HfArgumentParser((ScriptArguments, NPOConfig))
    main(*parser.parse_args_into_dataclasses())
