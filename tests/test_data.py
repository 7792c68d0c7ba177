"""Loaders against the local TOFU copy (row counts from its README), the synthetic set, prompts,
pairing, and bad input."""

from __future__ import annotations

import json

import datasets
import pytest

from hf_unlearn.data import (
    IGNORE_INDEX,
    RETAIN_FOR_FORGET,
    build_prompt,
    collate_qa,
    ensure_pad_token,
    format_qa,
    load_tofu,
    load_tofu_rows,
    overlapping_examples,
    synthetic_tofu,
    tokenize_qa,
)
from hf_unlearn.methods.base.pairing import retain_partner_indices

# From ../shared/data/tofu/README.md
TOFU_ROW_COUNTS = {
    "full": 4000,
    "forget01": 40,
    "forget05": 200,
    "forget10": 400,
    "retain99": 3960,
    "retain95": 3800,
    "retain90": 3600,
    "forget01_perturbed": 40,
    "forget05_perturbed": 200,
    "forget10_perturbed": 400,
    "retain_perturbed": 400,
    "holdout01": 40,
    "holdout05": 200,
    "holdout10": 400,
    "real_authors": 100,
    "real_authors_perturbed": 100,
    "world_facts": 117,
    "world_facts_perturbed": 117,
}


def test_local_tofu_row_counts(tofu_dir):
    rows = {config: load_tofu_rows(config, str(tofu_dir)) for config in TOFU_ROW_COUNTS}
    assert {c: len(r) for c, r in rows.items()} == TOFU_ROW_COUNTS
    full = [(r["question"], r["answer"]) for r in rows["full"]]
    for forget, retain in RETAIN_FOR_FORGET.items():
        n = TOFU_ROW_COUNTS[forget]
        assert [(r["question"], r["answer"]) for r in rows[forget]] == full[-n:]
        assert [(r["question"], r["answer"]) for r in rows[retain]] == full[:-n]
        assert [r["answer"] for r in rows[f"{forget}_perturbed"]] == [a for _, a in full[-n:]]
    assert [r["question"] for r in rows["retain_perturbed"]] == [q for q, _ in full[:400]]
    assert all(len(r["perturbed_answer"]) == 5 for r in rows["forget10_perturbed"])
    assert all(isinstance(r["paraphrased_answer"], str) for r in rows["retain_perturbed"])
    assert all(
        len(r["perturbed_answer"]) == 3
        for r in rows["real_authors_perturbed"] + rows["world_facts_perturbed"]
    )


def test_load_tofu_returns_dataset(tofu_dir):
    ds = load_tofu("forget01_perturbed", str(tofu_dir))
    assert isinstance(ds, datasets.Dataset)
    assert ds.num_rows == 40
    assert {"question", "answer", "paraphrased_answer", "perturbed_answer"} <= set(ds.column_names)
    assert ds[0] == load_tofu_rows("forget01_perturbed", str(tofu_dir))[0]


def test_synthetic_set_is_deterministic_and_tofu_shaped(synthetic):
    assert synthetic_tofu(seed=0) == synthetic
    assert synthetic_tofu(seed=1)["full"] != synthetic["full"]
    assert load_tofu_rows("forget10_perturbed", "synthetic") == synthetic["forget10_perturbed"]
    assert load_tofu_rows("full", "synthetic:1") == synthetic_tofu(seed=1)["full"]
    assert len(synthetic["forget10"]) == 20 and len(synthetic["retain90"]) == 180
    assert (
        synthetic["forget10"] == synthetic["full"][-20:] and synthetic["retain90"] == synthetic["full"][:-20]
    )
    assert overlapping_examples(synthetic["forget10"], synthetic["retain90"]) == 0
    assert [r["question"] for r in synthetic["retain_perturbed"]] == [
        r["question"] for r in synthetic["full"][:20]
    ]
    for row in synthetic["forget10_perturbed"] + synthetic["retain_perturbed"]:
        assert len(row["perturbed_answer"]) == 5 == len(set(row["perturbed_answer"]))
        assert row["answer"] not in row["perturbed_answer"]
        assert row["paraphrased_answer"] != row["answer"]
    holdout = {r["question"] for r in synthetic["holdout10"]}
    assert not holdout & {r["question"] for r in synthetic["full"]}
    # a mutable copy each call: editing the rows does not change the next call
    synthetic_tofu()["full"][0]["answer"] = "changed"
    assert synthetic_tofu()["full"][0]["answer"] != "changed"


def _write(folder, config, rows):
    with open(folder / f"{config}.jsonl", "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")


def test_bad_input(tmp_path):
    with pytest.raises(ValueError, match="Unknown TOFU config 'forget42'"):
        load_tofu_rows("forget42", "synthetic")
    with pytest.raises(FileNotFoundError, match="forget10.jsonl"):
        load_tofu_rows("forget10", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tofu_rows("forget10", str(tmp_path / "missing"))
    _write(tmp_path, "forget10_perturbed", [{"question": "q", "answer": "a", "paraphrased_answer": "p"}])
    with pytest.raises(ValueError, match="perturbed_answer"):
        load_tofu_rows("forget10_perturbed", str(tmp_path))
    _write(tmp_path, "retain90", [{"question": "q", "answer": "a"}, {"question": "q2"}])
    with pytest.raises(ValueError, match=r"Row 1 .*'answer'"):
        load_tofu_rows("retain90", str(tmp_path))
    _write(tmp_path, "forget01", [])
    with pytest.raises(ValueError, match="no rows"):
        load_tofu_rows("forget01", str(tmp_path))
    (tmp_path / "forget05.jsonl").write_text('{"question": "q", "answer": "a"}\n{not json\n')
    with pytest.raises(ValueError, match="forget05.jsonl:2"):
        load_tofu_rows("forget05", str(tmp_path))


def test_pad_token_is_set_or_refused(tiny_target):
    _, tokenizer = tiny_target
    tokenizer.pad_token = None
    ensure_pad_token(tokenizer)
    assert tokenizer.pad_token == tokenizer.eos_token
    tokenizer.pad_token = None
    tokenizer.eos_token = None
    with pytest.raises(ValueError, match="pad token"):
        ensure_pad_token(tokenizer)


def test_prompt_and_answer_only_labels(tiny_target):
    _, tokenizer = tiny_target
    question, answer = "Who wrote Moby-Dick?", "Herman Melville"
    assert build_prompt(tokenizer, question) == "Question: Who wrote Moby-Dick?\nAnswer:"
    prompt, completion = format_qa(tokenizer, question, answer)
    assert (prompt, completion) == (build_prompt(tokenizer, question), " Herman Melville")
    feats = tokenize_qa(tokenizer, question, answer)
    n = feats["prompt_length"]
    assert feats["labels"][:n] == [IGNORE_INDEX] * n
    assert feats["labels"][n:] == feats["input_ids"][n:]
    assert feats["input_ids"][-1] == tokenizer.eos_token_id
    assert tokenizer.decode(feats["input_ids"][n:], skip_special_tokens=True).strip() == answer
    short = tokenize_qa(tokenizer, question, answer, max_length=n + 1)
    assert len(short["input_ids"]) == n + 1


def test_collate_left_and_right_padding(tiny_target):
    _, tokenizer = tiny_target
    feats = [
        tokenize_qa(tokenizer, "Q?", "A."),
        tokenize_qa(tokenizer, "A longer question?", "A longer answer."),
    ]
    right = collate_qa(feats, pad_token_id=2, padding_side="right")
    left = collate_qa(feats, pad_token_id=2, padding_side="left")
    n0, width = len(feats[0]["input_ids"]), right["input_ids"].shape[1]
    assert (
        right["input_ids"][0, :n0].tolist()
        == feats[0]["input_ids"]
        == left["input_ids"][0, width - n0 :].tolist()
    )
    assert (
        right["position_ids"][0, :n0].tolist()
        == list(range(n0))
        == left["position_ids"][0, width - n0 :].tolist()
    )
    assert left["attention_mask"][0].tolist() == [0] * (width - n0) + [1] * n0
    assert (left["labels"][0, : width - n0] == IGNORE_INDEX).all()
    with pytest.raises(ValueError, match="padding_side"):
        collate_qa(feats, pad_token_id=2, padding_side="middle")


def test_retain_pairing():
    first = retain_partner_indices(10, 4, seed=0, epoch=0)
    assert first == retain_partner_indices(10, 4, seed=0, epoch=0)
    assert sorted(first[:4]) == [0, 1, 2, 3]  # a permutation, cycled
    assert first[4:8] == first[:4]
    assert sorted(retain_partner_indices(4, 100, seed=0, epoch=1)) != sorted(
        retain_partner_indices(4, 100, seed=0, epoch=2)
    )
    with pytest.raises(ValueError, match="forget set is empty"):
        retain_partner_indices(0, 4)
    with pytest.raises(ValueError, match="retain set is empty"):
        retain_partner_indices(4, 0)
