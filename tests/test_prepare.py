"""prepare_qa: the one step from question/answer rows to tokenized features, on real TOFU rows.

Each truncation policy gives exactly the features of the per-consumer loops it replaces (written out here as
they were), long rows are cut or refused as documented, bad rows are refused before any tokenization, and the
consumers that now call it (GROM, T3, the trainers' pairing) return what they returned before.
"""

from __future__ import annotations

import copy
import json

import pytest
from transformers import AutoTokenizer

from hf_unlearn.data import IGNORE_INDEX, PromptTooLongError, prepare_qa, tokenize_qa

LLAMA3_STYLE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}"
    "{% set messages = messages[1:] %}{% else %}{% set system = '' %}{% endif %}"
    "<|start_header_id|>system<|end_header_id|>\n\n{{ system }}<|eot_id|>"
    "{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>"
    "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


@pytest.fixture(scope="module")
def rows(tofu_dir):
    with open(tofu_dir / "forget10.jsonl", encoding="utf-8") as fh:
        return [json.loads(line) for _, line in zip(range(20), fh)]


@pytest.fixture(scope="module")
def plain_tok(tiny_pair):
    return AutoTokenizer.from_pretrained(tiny_pair.target)


@pytest.fixture(scope="module")
def chat_tok(plain_tok):
    tok = copy.deepcopy(plain_tok)
    tok.chat_template = LLAMA3_STYLE
    return tok


# ----- the loops prepare_qa replaced, as they were -----------------------------------------------------------------

def old_answer_cut(tok, rows, max_length, template):  # GROM, ATWU probes, relearning attack
    return [tokenize_qa(tok, r["question"], r["answer"], max_length, template=template) for r in rows]


def old_end_cut(tok, rows, limit, template):  # T3
    out, truncated = [], 0
    for r in rows:
        f = tokenize_qa(tok, r["question"], r["answer"], template=template)
        if limit is not None and len(f["input_ids"]) > limit:
            truncated += 1
            f = {k: (v[:limit] if isinstance(v, list) else v) for k, v in f.items()}
        out.append(f)
    return out, truncated


def _lengths(tok, rows, template):
    feats = prepare_qa(rows, tok, template=template)
    return [len(f["input_ids"]) for f in feats], [f["prompt_length"] for f in feats]


@pytest.mark.parametrize("which", ["plain", "chat", "tofu-llama2"])
def test_each_policy_equals_the_old_loops(rows, plain_tok, chat_tok, which):
    tok = chat_tok if which == "chat" else plain_tok
    template = None if which != "tofu-llama2" else "tofu-llama2"
    lengths, prompts = _lengths(tok, rows, template)
    cut = sorted(lengths)[len(lengths) // 2]  # about half the rows are longer
    assert cut > max(prompts) + 1 and any(n > cut for n in lengths)
    for max_length in (None, cut, max(lengths)):
        new = prepare_qa(rows, tok, template=template, max_length=max_length)
        assert new == old_answer_cut(tok, rows, max_length, template)
        new_end, n_end = prepare_qa(rows, tok, template=template, max_length=max_length, truncation="end",
                                    return_truncated=True)
        assert (new_end, n_end) == old_end_cut(tok, rows, max_length, template)
        assert n_end == sum(n > max_length for n in lengths) if max_length else n_end == 0
    if which == "chat":  # the chat template is really used: its header tokens are in the prompt
        assert new[0]["input_ids"] != prepare_qa(rows[:1], plain_tok)[0]["input_ids"]


def test_long_rows_under_each_policy(rows, plain_tok):
    lengths, prompts = _lengths(plain_tok, rows, None)
    full = prepare_qa(rows, plain_tok)
    cut = min(prompts) + 3
    short = [r for r, p in zip(rows, prompts) if p + 1 <= cut]
    kept = prepare_qa(short, plain_tok, max_length=cut)
    for f, r in zip(kept, short):
        whole = full[rows.index(r)]
        assert len(f["input_ids"]) == min(cut, len(whole["input_ids"]))
        assert f["input_ids"] == whole["input_ids"][:cut]  # the answer end is cut, the prompt is whole
        assert f["prompt_length"] == whole["prompt_length"]
        assert f["labels"][: f["prompt_length"]] == [IGNORE_INDEX] * f["prompt_length"]
        assert f["labels"][f["prompt_length"] :] == f["input_ids"][f["prompt_length"] :]
        assert f["attention_mask"] == [1] * len(f["input_ids"])

    first_long = next(i for i, p in enumerate(prompts) if p + 1 > cut)
    with pytest.raises(PromptTooLongError) as info:
        prepare_qa(rows, plain_tok, max_length=cut)
    assert info.value.index == first_long
    with pytest.raises(ValueError) as old:
        tokenize_qa(plain_tok, rows[first_long]["question"], rows[first_long]["answer"], cut)
    assert info.value.reason == str(old.value) and str(info.value) == f"row {first_long}: {old.value}"

    ended = prepare_qa(rows, plain_tok, max_length=cut, truncation="end")  # nothing refused
    assert all(len(f["input_ids"]) == min(cut, n) for f, n in zip(ended, lengths))
    f = ended[first_long]
    assert f["prompt_length"] == prompts[first_long] > cut - 1
    assert all(lab == IGNORE_INDEX for lab in f["labels"])  # the prompt fills it: no answer label left


@pytest.mark.parametrize(
    "bad, match",
    [
        ("not a row", r"row 2 is a str, not a dict"),
        ({"question": "Who?"}, r"row 2 has no 'answer' field"),
        ({"question": 3, "answer": "x"}, r"row 2: 'question' must be a string, got int"),
        ({"question": "Who?", "answer": None}, r"row 2: 'answer' must be a string, got NoneType"),
    ],
)
def test_bad_rows_are_refused_before_any_tokenization(rows, plain_tok, bad, match):
    lengths, prompts = _lengths(plain_tok, rows[:2], None)
    with pytest.raises(ValueError, match=match) as info:  # rows 0-1 would be refused at max_length=1
        prepare_qa([*rows[:2], bad], plain_tok, max_length=1)
    assert not isinstance(info.value, PromptTooLongError)


def test_options_are_checked(rows, plain_tok):
    with pytest.raises(ValueError, match="truncation must be one of 'answer', 'end'"):
        prepare_qa(rows, plain_tok, truncation="left")
    with pytest.raises(ValueError, match="Unknown prompt template 'nope'"):
        prepare_qa(rows, plain_tok, template="nope")
    assert prepare_qa([], plain_tok, template="nope") == []  # no row, nothing tokenized (as the loops)
    assert prepare_qa(iter(rows[:3]), plain_tok) == prepare_qa(rows[:3], plain_tok)


def test_consumers_return_what_their_loops_returned(rows, plain_tok):
    from datasets import Dataset

    from hf_unlearn.methods.base.pairing import to_trl_format
    from hf_unlearn.methods.grom.inputs import _tokenize_rows
    from hf_unlearn.methods.t3.cache import _tokenize

    lengths, prompts = _lengths(plain_tok, rows, None)
    cut = sorted(lengths)[len(lengths) // 2]
    assert _tokenize_rows(plain_tok, rows, cut, None, None, "forget") == old_answer_cut(plain_tok, rows, cut, None)
    tight = min(prompts) + 1
    first_long = next(i for i, p in enumerate(prompts) if p + 1 > tight)
    with pytest.raises(ValueError) as old:
        tokenize_qa(plain_tok, rows[first_long]["question"], rows[first_long]["answer"], tight)
    with pytest.raises(ValueError) as info:
        _tokenize_rows(plain_tok, rows, 512, tight, None, "retain")
    assert str(info.value) == (f"retain example {first_long}: {old.value} (GROM cuts every example to {tight} tokens, "
                               "the model's maximum positions).")

    feats, truncated, _ = _tokenize(plain_tok, rows, tight, None)
    ref, ref_truncated = old_end_cut(plain_tok, rows, tight, None)
    assert truncated == ref_truncated
    assert feats == [f if any(lab != IGNORE_INDEX for lab in f["labels"][1:]) else None for f in ref]
    assert None in feats and any(f is not None for f in feats)

    trl = to_trl_format(Dataset.from_list(rows), plain_tok)
    assert trl.to_list() == [{"input_ids": f["input_ids"], "labels": f["labels"]}
                             for f in old_answer_cut(plain_tok, rows, None, None)]
