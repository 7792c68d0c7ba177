"""Documents as data: reading them, cutting them into max_length-token chunks with the loss on every token, and the
trainers taking them as forget and retain sets."""

from __future__ import annotations

import json
import warnings

import datasets
import numpy as np
import pytest
import torch

from hf_unlearn.data import (
    IGNORE_INDEX,
    chunk_documents,
    chunk_token_ids,
    documents_dataset,
    is_documents,
    load_documents,
)
from hf_unlearn.methods.base.pairing import as_dataset, to_trl_format

datasets.disable_progress_bars()

DOCS = [
    "The council approved the new bridge on Tuesday after a long debate.",
    "Fans queued overnight for tickets to the final.",
    "A storm closed the coastal road for three days.",
]


def test_chunk_token_ids_boundaries_and_prefix():
    ids = list(range(10))
    assert chunk_token_ids(ids, 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    # the prefix (a BOS token) is inside max_length: 3 text tokens a chunk
    assert chunk_token_ids(ids, 4, prefix=[99]) == [[99, 0, 1, 2], [99, 3, 4, 5], [99, 6, 7, 8], [99, 9]]
    # a last chunk of one token has nothing to predict and is left out
    assert chunk_token_ids(list(range(9)), 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert chunk_token_ids(list(range(8)), 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]  # no empty chunk at a boundary
    assert chunk_token_ids([], 4) == []
    with pytest.raises(ValueError, match="no room"):
        chunk_token_ids(ids, 1, prefix=[99])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_chunk_token_ids_covers_every_id_once_in_order(seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 1000, size=int(rng.integers(2, 300))).tolist()
    max_length = int(rng.integers(2, 40))
    chunks = chunk_token_ids(ids, max_length)
    assert all(len(c) <= max_length for c in chunks)
    assert all(len(c) == max_length for c in chunks[:-1])
    joined = [t for c in chunks for t in c]
    # every id once, in order; at most the single last id is left out
    assert joined == ids[: len(joined)] and len(ids) - len(joined) in (0, 1)
    assert len(ids) - len(joined) == (1 if len(ids) % max_length == 1 else 0)


def test_chunk_documents_matches_the_joined_tokenization(tiny_pair):
    from hf_unlearn.demo import load_tiny

    _, tok = load_tiny(tiny_pair.target)
    full = tok("\n\n".join(DOCS), add_special_tokens=False)["input_ids"]
    bos = tok.bos_token_id
    assert tok("a")["input_ids"][0] == bos  # the tiny tokenizer starts sequences with BOS
    feats = chunk_documents(DOCS, tok, max_length=16)
    assert len(feats) == -(-len(full) // 15)  # 15 text tokens after each BOS; every token in one chunk
    for f in feats:
        assert f["input_ids"][0] == bos and len(f["input_ids"]) <= 16
        assert f["labels"] == f["input_ids"]  # loss on every token
        assert f["attention_mask"] == [1] * len(f["input_ids"])
    text_tokens = [t for f in feats for t in f["input_ids"][1:]]
    assert text_tokens == full
    assert tok.decode(text_tokens) == "\n\n".join(DOCS)  # the documents joined with a blank line

    padded = chunk_documents(DOCS, tok, max_length=16, padding=True)
    assert all(len(f["input_ids"]) == 16 for f in padded)
    last, plain = padded[-1], feats[-1]
    n = len(plain["input_ids"])
    assert last["input_ids"][:n] == plain["input_ids"] and last["labels"][:n] == plain["labels"]
    assert last["labels"][n:] == [IGNORE_INDEX] * (16 - n)
    assert last["attention_mask"] == [1] * n + [0] * (16 - n)
    assert set(last["input_ids"][n:]) <= {tok.pad_token_id}
    with pytest.raises(ValueError, match="max_length"):
        chunk_documents(DOCS, tok, max_length=1)


def test_load_documents_from_lists_datasets_and_files(tmp_path):
    assert load_documents(DOCS) == DOCS
    assert load_documents([{"text": d} for d in DOCS]) == DOCS
    assert load_documents(datasets.Dataset.from_dict({"text": DOCS, "id": [1, 2, 3]})) == DOCS
    assert load_documents(datasets.Dataset.from_dict({"body": DOCS}), text_key="body") == DOCS
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.txt").write_text(DOCS[0], encoding="utf-8")
    (folder / "b.jsonl").write_text(json.dumps({"text": DOCS[1]}) + "\n\n" + json.dumps(DOCS[2]) + "\n", encoding="utf-8")
    (folder / "c.json").write_text(json.dumps([DOCS[2], {"text": DOCS[0]}]), encoding="utf-8")
    (folder / "notes.md").write_text("ignored", encoding="utf-8")
    assert load_documents(folder / "a.txt") == [DOCS[0]]
    assert load_documents(str(folder / "b.jsonl")) == [DOCS[1], DOCS[2]]
    assert load_documents(folder) == [DOCS[0], DOCS[1], DOCS[2], DOCS[2], DOCS[0]]
    assert documents_dataset(folder / "c.json")["text"] == [DOCS[2], DOCS[0]]

    with pytest.raises(ValueError, match="no document"):
        load_documents([])
    with pytest.raises(ValueError, match="not a text"):
        load_documents(["ok", 3])
    with pytest.raises(ValueError, match="no 'text' field"):
        load_documents([{"body": "x"}])
    with pytest.raises(ValueError, match="no 'text' column"):
        load_documents(datasets.Dataset.from_dict({"body": DOCS}))
    with pytest.raises(FileNotFoundError):
        load_documents(tmp_path / "missing.txt")
    with pytest.raises(ValueError, match="plain text"):
        load_documents("A whole article\nwith lines, passed by mistake as a path.")
    (folder / "bad.jsonl").write_text("{not json\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 1"):
        load_documents(folder / "bad.jsonl")
    with pytest.raises(ValueError, match="not '.md'"):
        load_documents(folder / "notes.md")


def test_documents_become_chunks_for_the_trainers_and_qa_rows_do_not(tiny_pair, synthetic):
    from hf_unlearn.demo import load_tiny

    _, tok = load_tiny(tiny_pair.target)
    assert is_documents(as_dataset(DOCS)) and as_dataset(DOCS).column_names == ["text"]
    assert not is_documents(as_dataset(synthetic["forget10"][:2]))
    assert not is_documents(datasets.Dataset.from_dict({"text": ["a"], "input_ids": [[1]]}))
    prepared = to_trl_format(DOCS, tok, max_length=16)
    assert prepared.column_names == ["input_ids", "labels"]
    expected = chunk_documents(DOCS, tok, 16)
    assert prepared["input_ids"] == [f["input_ids"] for f in expected]
    assert prepared["labels"] == prepared["input_ids"]
    qa = to_trl_format(synthetic["forget10"][:3], tok)
    assert any(label == IGNORE_INDEX for label in qa["labels"][0])  # the QA path keeps answer-only labels


def _config(tmp_path, **overrides):
    from hf_unlearn.methods.base import UnlearningConfig

    values = dict(output_dir=str(tmp_path / "out"), report_to="none", save_strategy="no", gradient_checkpointing=False,
                  disable_tqdm=True, per_device_train_batch_size=4, max_steps=4, logging_steps=1, seed=0,
                  learning_rate=5e-4, max_length=64)
    values.update(overrides)
    return UnlearningConfig(**values)


def _chunk_nll(model, tok, docs, max_length=64):
    from hf_unlearn.data import collate_qa
    from hf_unlearn.logprobs import answer_mask, label_log_probs

    batch = collate_qa([{"input_ids": f["input_ids"], "labels": f["labels"]} for f in chunk_documents(docs, tok, max_length)],
                       tok.pad_token_id)
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits
    lp = label_log_probs(logits, batch["labels"])
    return float(-lp.sum() / answer_mask(batch["labels"]).sum())


@pytest.mark.parametrize("method", ["graddiff", "npo"])
def test_graddiff_and_npo_unlearn_documents(method, tiny_target, tmp_path):
    from hf_unlearn.methods.baselines import GradDiffTrainer, NPOTrainer

    model, tok = tiny_target
    forget = [DOCS[0] * 3, DOCS[1] * 3]
    retain_file = tmp_path / "retain.jsonl"
    retain_file.write_text("".join(json.dumps({"text": d * 3}) + "\n" for d in DOCS[2:] + ["Markets rose in early trading."]),
                           encoding="utf-8")
    before = _chunk_nll(model, tok, forget)
    cls = GradDiffTrainer if method == "graddiff" else NPOTrainer
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = cls(model, _config(tmp_path), train_dataset=forget, retain_dataset=str(retain_file),
                      processing_class=tok)
    assert not [w for w in caught if "truncated" in str(w.message)]  # full-length chunks are not truncated rows
    n_chunks = len(chunk_documents(forget, tok, 64))
    assert len(trainer.forget_dataset) == n_chunks > len(forget)
    assert len(trainer.retain_dataset) == len(chunk_documents(retain_file, tok, 64))
    assert trainer.forget_dataset[0]["labels"] == trainer.forget_dataset[0]["input_ids"]
    assert len(trainer.forget_dataset[0]["input_ids"]) == 64  # a full chunk, which the truncation check would flag
    trainer.train()
    after = _chunk_nll(trainer.model, tok, forget)
    assert after > before + 0.05, (before, after)


def test_documents_in_both_sets_are_refused_before_training(tiny_target, tmp_path):
    from hf_unlearn.methods.baselines import GradDiffTrainer

    model, tok = tiny_target
    with pytest.raises(ValueError, match="also occur in the retain set"):
        GradDiffTrainer(model, _config(tmp_path), train_dataset=DOCS[:2], retain_dataset=DOCS[1:], processing_class=tok)
    with pytest.raises(FileNotFoundError, match="No documents"):
        GradDiffTrainer(model, _config(tmp_path), train_dataset=str(tmp_path / "missing.jsonl"), processing_class=tok)


def _trainer_methods():
    from hf_unlearn.registry import get_method, method_names

    return [name for name in method_names() if get_method(name).is_trainer]


PREFERENCE_METHODS = {"dpo", "idk_dpo"}  # a preferred answer needs a question to answer
REQUIRED_SETTINGS = {"pdu": {"retain_loss_eps": 0.1}, "rmu": {"layer": 1}}


@pytest.mark.parametrize("name", _trainer_methods())
def test_every_trainer_takes_documents_or_says_why_not(name, tiny_target, tmp_path):
    """Every registered trainer trains on document chunks (the loss on every token); the preference methods refuse
    documents in one line before any work, since each forget row needs a question for its preferred answer."""
    from hf_unlearn.registry import get_method

    info = get_method(name)
    assert info.trainer_cls.accepts_documents is (name not in PREFERENCE_METHODS)
    model, tok = tiny_target
    args = info.config_cls(
        output_dir=str(tmp_path / "out"), report_to="none", save_strategy="no", disable_tqdm=True,
        per_device_train_batch_size=2, max_steps=2, logging_steps=1, seed=0, max_length=32,
        **REQUIRED_SETTINGS.get(name, {}))
    forget, retain = [d * 3 for d in DOCS[:2]], [d * 3 for d in DOCS[2:]]
    trainer_class = info.trainer_cls
    if name in PREFERENCE_METHODS:
        with pytest.raises(ValueError, match="question"):
            trainer_class(model=model, args=args, train_dataset=forget, retain_dataset=retain, processing_class=tok)
        return
    trainer = trainer_class(model=model, args=args, train_dataset=forget, retain_dataset=retain, processing_class=tok)
    assert len(trainer.forget_dataset) == len(chunk_documents(forget, tok, 32))
    trained = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    after = dict(trainer.model.named_parameters())
    assert trained and max(float((after[n].detach() - p).abs().max()) for n, p in trained.items()) > 0


def test_fit_or_train_takes_documents_for_a_trainer_with_its_own_metric(tiny_target, tmp_path):
    """``fit_or_train`` gives a trainer documents as they come (plain strings here): ATWU trains on their chunks, and
    its token AUROC, defined on answer tokens, is left out rather than failing on rows without an answer."""
    from hf_unlearn.run import fit_or_train, prepare_inputs

    model, tok = tiny_target
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    forget, retain = [d * 3 for d in DOCS[:2]], [d * 3 for d in DOCS[2:]]
    result = fit_or_train(prepare_inputs("atwu", model, tok, forget, retain, tmp_path / "out", {"max_steps": 2, "per_device_train_batch_size": 2, "max_length": 32, "disable_tqdm": True}))
    assert result.metrics == {} and result.info["global_step"] == 2
    assert any(not torch.equal(p.detach(), before[n]) for n, p in result.model.named_parameters())


def _document_files(root, forget, retain, holdout):
    """A folder of ``.txt`` forget documents, JSON Lines retain documents and a ``.txt`` holdout document."""
    import json

    (root / "forget").mkdir()
    for i, text in enumerate(forget):
        (root / "forget" / f"{i}.txt").write_text(text, encoding="utf-8")
    (root / "retain.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in retain), encoding="utf-8")
    (root / "holdout.txt").write_text(holdout, encoding="utf-8")
    return root / "forget", root / "retain.jsonl", root / "holdout.txt"


def test_the_cli_unlearns_documents_from_files_and_selects_on_holdout_documents(tiny_pair, tmp_path, capsys):
    """``--forget-file`` / ``--retain-file`` / ``--holdout`` take documents (a folder of ``.txt`` files, JSON Lines
    of texts, a ``.txt`` file): the trainer learns on their chunks and ``--select`` measures the criterion on the
    holdout document; a method that needs questions, and documents in both sets, are refused in one line first."""
    from safetensors.torch import load_file

    from hf_unlearn.cli import main
    from hf_unlearn.preconditions import is_documents_file, load_rows

    forget_dir, retain_file, holdout_file = _document_files(
        tmp_path, [d * 3 for d in DOCS[:2]], [d * 3 for d in DOCS[2:]] + [DOCS[0][::-1] * 3], DOCS[1][::-1] * 3)
    assert is_documents_file(forget_dir) and is_documents_file(retain_file) and is_documents_file(holdout_file)
    assert load_rows("forget10", "synthetic", str(retain_file))[0] == {"text": DOCS[2] * 3}
    common = ["--model", str(tiny_pair.target), "--data", "synthetic", "--forget-file", str(forget_dir),
              "--retain-file", str(retain_file), "--max_steps", "2", "--learning_rate", "1e-3", "--max_length", "32"]
    out = tmp_path / "out"
    code = main(["unlearn", "--method", "grad_diff", *common, "--output", str(out), "--select", "--holdout",
                 str(holdout_file), "--selection-steps", "1"])
    assert code == 0, capsys.readouterr().err
    saved, original = load_file(out / "model.safetensors"), load_file(tiny_pair.target / "model.safetensors")
    assert any(not torch.equal(saved[k], original[k]) for k in original)
    record = json.loads((out / "selection_record.json").read_text())
    assert [c["step"] for c in record["candidates"]] == [0, 1, 2]

    assert main(["unlearn", "--method", "dpo", *common, "--output", str(tmp_path / "dpo")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "question" in err and not (tmp_path / "dpo").exists()
    both = common[:common.index("--retain-file") + 1] + [str(forget_dir)] + common[common.index("--retain-file") + 2:]
    assert main(["unlearn", "--method", "grad_diff", *both, "--output", str(tmp_path / "both")]) == 2
    assert "also occur in the retain rows" in capsys.readouterr().err
