"""ATWU unlearning (alternating token-weighted unlearning with a learned token weighter), TRL-style.

Every field of ``ATWUConfig`` (and so of ``trl.SFTConfig`` / ``transformers.TrainingArguments``) is an option,
plus the script arguments below; ``--help`` lists them all. ATWU learns which answer tokens carry the
forget content and spares structural tokens. The result is the unlearned model in ``--output_dir`` with
the token weighter saved beside it.

TOFU-tiny (a small Llama trained here on the synthetic authors on first use; CPU, about a minute):

    python examples/scripts/atwu.py \\
        --model_name_or_path tofu-tiny --dataset_name synthetic \\
        --learning_rate 5e-4 --num_train_epochs 10 --per_device_train_batch_size 8 --weight_decay 0.0 \\
        --output_dir outputs/atwu-tofu-tiny

A Hub model fine-tuned on TOFU (GPU):

    python examples/scripts/atwu.py \\
        --model_name_or_path open-unlearning/tofu_Llama-3.2-1B-Instruct_full --dataset_name locuslab/TOFU \\
        --forget_split forget10 --learning_rate 1e-5 --num_train_epochs 10 --bf16 True \\
        --output_dir outputs/atwu-llama-1b

Your own records: ``--forget_file delete_me.jsonl`` (and optionally ``--retain_file keep.jsonl``), JSON Lines
with ``question`` and ``answer``.
"""

from __future__ import annotations

from transformers import HfArgumentParser

from hf_unlearn.bench.script_args import ScriptArguments, load_forget_retain, load_model_and_tokenizer
from hf_unlearn.trainers import ATWUConfig, ATWUTrainer


def main(script_args: ScriptArguments, training_args: ATWUConfig) -> None:
    model, tokenizer = load_model_and_tokenizer(script_args)
    # the retain rows only when the objective has a retain term (alpha > 0)
    needs_retain = ATWUTrainer.needs_retain(training_args)
    forget, retain = load_forget_retain(script_args, needs_retain, as_dataset=True)
    trainer = ATWUTrainer(
        model=model, args=training_args, train_dataset=forget, retain_dataset=retain, processing_class=tokenizer
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)


if __name__ == "__main__":
    parser = HfArgumentParser((ScriptArguments, ATWUConfig))
    main(*parser.parse_args_into_dataclasses())
