"""Prompt templates and whole-text tokenization: each preset's exact strings, a SentencePiece-style tokenizer
with a prepend-space normalizer (built offline with `tokenizers`), TRL's trainer tokens equal to the evaluator's,
and length limits."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import GPT2Config, PreTrainedTokenizerFast

from hf_unlearn.data import (
    IGNORE_INDEX,
    PROMPT_TEMPLATES,
    PromptTemplate,
    build_prompt,
    format_qa,
    get_template,
    model_max_positions,
    resolve_template,
    template_fingerprint,
    tokenize_prompt,
    tokenize_qa,
)

Q, A = "Who wrote Moby-Dick?", "Herman Melville wrote it."

# A Llama-3-style chat template: system turn with the date string, as Meta's template renders it.
LLAMA3_STYLE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}"
    "{% set messages = messages[1:] %}{% else %}{% set system = '' %}{% endif %}"
    "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
    "Today Date: {{ date_string | default('26 Jul 2024') }}\n\n{{ system }}<|eot_id|>"
    "{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>"
    "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


@pytest.fixture(scope="module")
def sp_tokenizer():
    """A Llama-2-like tokenizer: BPE with SentencePiece's prepend-space normalizer (``▁`` before the text and for
    every space), Metaspace splitting, BOS added; trained offline on a few sentences."""
    texts = [f"{Q} {A}", "Where was she born? She was born in Paris, France."] * 50  # prose: no template merges
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    alphabet = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789▁?.,:[]/-|<>_\n")
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "<s>", "</s>"],
                                                      initial_alphabet=alphabet))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    out = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    out.pad_token = out.eos_token
    return out


@pytest.fixture()
def chat_tokenizer(sp_tokenizer):
    import copy

    tok = copy.deepcopy(sp_tokenizer)
    tok.chat_template = LLAMA3_STYLE
    return tok


# --------------------------------------------------------------------------------------------- exact strings


@pytest.mark.parametrize(
    ("name", "prompt", "completion"),
    [
        # locuslab/tofu config/model_config.yaml llama2-7b
        ("tofu-llama2", f"[INST] {Q} [/INST]", A),
        # locuslab/tofu config/model_config.yaml phi (TOFU masks only the question part)
        ("tofu-phi", f"Question: {Q}\n", f"Answer: {A}"),
        # open-unlearning configs/model/Qwen2.5-*-Instruct.yaml template_args as text
        ("chatml", "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                   f"<|im_start|>user\n{Q}<|im_end|>\n<|im_start|>assistant\n", A),
        ("plain", f"Question: {Q}\nAnswer:", f" {A}"),
    ],
)
def test_plain_presets_render_their_sources_strings(sp_tokenizer, name, prompt, completion):
    assert format_qa(sp_tokenizer, Q, A, template=name) == (prompt, completion)
    assert build_prompt(sp_tokenizer, Q, template=name) == prompt
    assert format_qa(sp_tokenizer, Q, A, template=get_template(name)) == (prompt, completion)


def test_open_unlearning_llama3_passes_system_prompt_and_date(chat_tokenizer):
    prompt, completion = format_qa(chat_tokenizer, Q, A, template="open-unlearning-llama3")
    assert prompt == (
        "<s><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
        "Today Date: 10 Apr 2025\n\nYou are a helpful assistant.<|eot_id|>"
        f"<|start_header_id|>user<|end_header_id|>\n\n{Q}<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert completion == f"{A}<|eot_id|>"
    # the default chat preset: no system prompt, the template's own default date
    default_prompt, _ = format_qa(chat_tokenizer, Q, A)
    assert "Today Date: 26 Jul 2024\n\n<|eot_id|>" in default_prompt
    fp = template_fingerprint(chat_tokenizer, "open-unlearning-llama3")
    assert fp["template"] == "open-unlearning-llama3" and len(fp["chat_template_sha256"]) == 64


def test_default_template_and_errors(sp_tokenizer, chat_tokenizer):
    assert resolve_template(sp_tokenizer, None).name == "plain"
    assert resolve_template(chat_tokenizer, None).name == "chat"
    assert set(PROMPT_TEMPLATES) >= {"tofu-llama2", "tofu-phi", "open-unlearning-llama3", "chatml", "plain"}
    with pytest.raises(ValueError, match="presets are: chat, chatml, open-unlearning-llama3, plain, tofu-llama2"):
        get_template("llama")
    with pytest.raises(ValueError, match="tokenizer has none"):
        format_qa(sp_tokenizer, Q, A, template="open-unlearning-llama3")
    with pytest.raises(ValueError, match="kind must be"):
        PromptTemplate(kind="jinja")
    with pytest.raises(ValueError, match="prefix"):
        PromptTemplate(kind="plain", system_prompt="hi")
    custom = PromptTemplate(question_start_tag="Q: ", question_end_tag="\n", answer_tag="A: ")
    assert format_qa(sp_tokenizer, Q, A, template=custom) == (f"Q: {Q}\nA: ", A)


# --------------------------------------------------------------------------------------------- whole-text tokens


@pytest.mark.parametrize("name", ["plain", "tofu-llama2", "tofu-phi"])
def test_whole_text_tokens_have_no_spurious_leading_piece(sp_tokenizer, name):
    tok = sp_tokenizer
    prompt, completion = format_qa(tok, Q, A, template=name)
    feats = tokenize_qa(tok, Q, A, template=name)
    whole = tok(prompt + completion)["input_ids"] + [tok.eos_token_id]
    n = feats["prompt_length"]
    assert feats["input_ids"] == whole
    assert feats["input_ids"][:n] == tok(prompt)["input_ids"]
    assert feats["labels"] == [IGNORE_INDEX] * n + whole[n:]
    # the answer tokens spell the completion exactly: one "▁" per space, none prepended
    answer_pieces = tok.convert_ids_to_tokens(whole[n:-1])
    assert "".join(answer_pieces) == completion.replace(" ", "▁")
    assert tokenize_prompt(tok, Q, template=name) == feats["input_ids"][:n]
    # tokenizing the completion on its own (the old way) prepends a spurious "▁": the bug this fixes
    separate = tok.convert_ids_to_tokens(tok(completion, add_special_tokens=False)["input_ids"])
    assert "".join(separate) == "▁" + completion.replace(" ", "▁")


def _tiny_llama(vocab_size: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256)
    return LlamaForCausalLM(config)


@pytest.mark.parametrize("name", ["plain", "tofu-llama2", "tofu-phi", "open-unlearning-llama3"])
def test_trl_trainer_tokens_equal_evaluator_tokens(chat_tokenizer, tmp_path, name):
    """TRL's SFTTrainer tokenizes prompt/completion rows (the trainers' data path) into exactly the tokens and
    labels that tokenize_qa gives the evaluator."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    tok = chat_tokenizer
    template = get_template(name)
    rows = [(Q, A), ("Where was she born?", "She was born in Paris, France.")]
    if template.kind == "chat":
        data = [{
            "prompt": [{"role": "system", "content": template.system_prompt}, {"role": "user", "content": q}],
            "completion": [{"role": "assistant", "content": a}],
            "chat_template_kwargs": {"date_string": template.date_string},
        } for q, a in rows]
    else:
        data = [dict(zip(("prompt", "completion"), format_qa(tok, q, a, template=template))) for q, a in rows]
    args = SFTConfig(output_dir=str(tmp_path), report_to=[], max_length=None, use_cpu=True)
    trainer = SFTTrainer(model=_tiny_llama(len(tok)), args=args, train_dataset=Dataset.from_list(data),
                         processing_class=tok)
    for i, (q, a) in enumerate(rows):
        feats = tokenize_qa(tok, q, a, template=template)
        item = trainer.train_dataset[i]
        assert item["input_ids"] == feats["input_ids"]
        assert item["labels"] == feats["labels"]  # loss on the same answer tokens


# --------------------------------------------------------------------------------------------- length limits


def test_max_length_truncates_the_answer_end_or_refuses(sp_tokenizer):
    full = tokenize_qa(sp_tokenizer, Q, A)
    n = full["prompt_length"]
    short = tokenize_qa(sp_tokenizer, Q, A, max_length=n + 3)
    assert short["input_ids"] == full["input_ids"][: n + 3] and short["prompt_length"] == n
    assert short["labels"] == full["labels"][: n + 3]
    assert tokenize_qa(sp_tokenizer, Q, A, max_length=10_000) == full
    with pytest.raises(ValueError, match=f"prompt alone is {n} tokens.*max_length={n}"):
        tokenize_qa(sp_tokenizer, Q, A, max_length=n)


def test_model_max_positions_reads_the_config():
    assert model_max_positions(GPT2Config(n_positions=64)) == 64
    assert model_max_positions(_tiny_llama(50)) == 256

    class NoLimit:
        config = object()

    assert model_max_positions(NoLimit()) is None
