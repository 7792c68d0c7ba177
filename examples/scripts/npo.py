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

from dataclasses import dataclass, field

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, HfArgumentParser

from hf_unlearn.data import RETAIN_FOR_FORGET, load_tofu_rows
from hf_unlearn.data.tofu import read_jsonl
from hf_unlearn.trainers import NPOConfig, NPOTrainer


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


def model_path(args: ScriptArguments) -> str:
    if args.model_name_or_path != "tofu-tiny":
        return args.model_name_or_path
    from hf_unlearn.bench.subjects import build_tiny_pair, recipe_for

    size = "test" if args.dataset_name == "synthetic" else "tofu-test"
    return str(build_tiny_pair(args.dataset_name, args.forget_split, recipe_for(size)).target)


def rows(file: str | None, split: str, source: str) -> Dataset:
    data = read_jsonl(file) if file else load_tofu_rows(split, source)
    return Dataset.from_list([{"question": r["question"], "answer": r["answer"]} for r in data])


def main(script_args: ScriptArguments, training_args: NPOConfig) -> None:
    path = model_path(script_args)
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    forget = rows(script_args.forget_file, script_args.forget_split, script_args.dataset_name)
    retain = None  # the retain rows, when the objective has a retain term (alpha > 0)
    if NPOTrainer.needs_retain(training_args):
        retain = rows(script_args.retain_file, RETAIN_FOR_FORGET[script_args.forget_split], script_args.dataset_name)
    trainer = NPOTrainer(
        model=model, args=training_args, train_dataset=forget, retain_dataset=retain, processing_class=tokenizer
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)


if __name__ == "__main__":
    parser = HfArgumentParser((ScriptArguments, NPOConfig))
    main(*parser.parse_args_into_dataclasses())
