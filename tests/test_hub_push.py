"""The one upload path, ``hf_unlearn.hub.push.push_folder``, against the local Hub server (tests/hub_server.py):
one commit per push, the card as README.md, ignored entries left out, refusals before any request; and the
unlearning trainers' ``push_to_hub`` going through it."""

from __future__ import annotations

import pytest


def test_push_folder_uploads_the_folder_and_card_in_one_commit(hub, tmp_path):
    from hf_unlearn.hub import push_folder

    folder = tmp_path / "prepared"
    (folder / "sub").mkdir(parents=True)
    (folder / "checkpoint-3").mkdir()
    (folder / "weights.safetensors").write_bytes(b"\x00\x01")
    (folder / "sub" / "extra.json").write_text('{"a": 1}')
    (folder / "README.md").write_text("stale card")
    (folder / "checkpoint-3" / "state.json").write_text("{}")
    (folder / "_scratch").write_text("temporary")
    card = "---\nlicense: mit\ntags:\n- unlearning\n---\n# The card\n"

    info = push_folder(folder, "tester/prepared", card=card, token=hub.token, commit_message="Upload it",
                       ignore_patterns=("_*", "checkpoint-*"))
    commits = hub.commits("tester/prepared")
    assert len(commits) == 2 and commits[-1].oid == info.oid and commits[-1].title == "Upload it"
    files = hub.files("tester/prepared")
    assert {"weights.safetensors", "sub/extra.json", "README.md"} <= set(files)
    assert not any(name.startswith(("checkpoint-", "_")) for name in files)
    assert files["README.md"].decode() == card and files["sub/extra.json"] == b'{"a": 1}'

    # without a card, the folder's own README.md goes up; a second push is a second commit on the same repo
    push_folder(folder, "tester/prepared", token=hub.token, commit_message="Again")
    assert len(hub.commits("tester/prepared")) == 3
    assert hub.files("tester/prepared")["README.md"] == b"stale card"


def test_push_folder_refuses_before_any_request(hub, tmp_path):
    from hf_unlearn.hub import push_folder

    (tmp_path / "f").mkdir()
    with pytest.raises(ValueError, match="Invalid repo id"):
        push_folder(tmp_path / "f", "not a repo id!", token=hub.token, commit_message="x")
    with pytest.raises(ValueError, match="No Hugging Face token"):
        push_folder(tmp_path / "f", "tester/f", commit_message="x")
    with pytest.raises(ValueError, match="not a folder"):
        push_folder(tmp_path / "missing", "tester/f", token=hub.token, commit_message="x")
    assert hub.requests == [] and hub.repos == {}


def test_trainer_push_to_hub_is_one_commit_without_checkpoints(hub, tiny_target, synthetic, tmp_path, monkeypatch):
    from hf_unlearn import NPOTrainer, UnlearningConfig
    from hf_unlearn.hub import push as push_module

    calls = []
    real = push_module.push_folder
    monkeypatch.setattr(push_module, "push_folder", lambda folder, repo_id, **kw: calls.append((folder, repo_id))
                        or real(folder, repo_id, **kw))

    model, tokenizer = tiny_target
    rows = [{"question": r["question"], "answer": r["answer"]} for r in synthetic["forget10"][:4]]
    retain = [{"question": r["question"], "answer": r["answer"]} for r in synthetic["retain90"][:4]]
    args = UnlearningConfig(output_dir=str(tmp_path / "npo"), report_to="none", save_strategy="steps", save_steps=1,
                            max_steps=1, hub_model_id="tester/npo-one-commit")
    trainer = NPOTrainer(model=model, args=args, train_dataset=rows, retain_dataset=retain,
                         processing_class=tokenizer)
    trainer.train()
    assert (tmp_path / "npo" / "checkpoint-1").is_dir()
    info = trainer.push_to_hub(commit_message="Final model", token=hub.token)

    commits = hub.commits("tester/npo-one-commit")
    assert len(commits) == 2 and commits[-1].oid == info.oid and commits[-1].title == "Final model"
    files = hub.files("tester/npo-one-commit")
    assert {"model.safetensors", "config.json", "README.md"} <= set(files)
    assert not any(name.startswith("checkpoint-") for name in files)
    assert "npo" in files["README.md"].decode()
    assert calls == [(str(tmp_path / "npo"), "tester/npo-one-commit")]  # through the one upload path
