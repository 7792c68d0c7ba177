"""Inputs that cannot be unlearned are refused before any work, through the real CLI entry point.

Each case runs ``hf-unlearn unlearn`` as a user types it (:func:`hf_unlearn.cli.main`, in process, the tiny
model): exit status 2, one ``hf-unlearn: error:`` line naming the file (and line) or the setting, and the folder
tree byte for byte as it was (no output folder, no ``<output>.failed``, no log). The cases: empty or
whitespace-only documents and rows, a symbolic link inside a documents folder, a UTF-8 byte-order mark or a
repeated key in JSON inputs, and a seed outside NumPy's and torch's range.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from hf_unlearn.cli import main


def _snapshot(root: Path) -> dict[str, str]:
    """Every path under ``root`` with the SHA-256 of its bytes (``dir`` for a folder, ``link`` for a link)."""
    return {str(p.relative_to(root)): "link" if p.is_symlink() else "dir" if p.is_dir()
            else hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))}


def _refused_with_nothing_changed(capsys, root: Path, argv: list[str], *fragments: str) -> str:
    before = _snapshot(root)
    code = main(argv)
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert code == 2, (code, err, captured.out[-2000:])
    assert err.startswith("hf-unlearn: error: ") and "\n" not in err and "Traceback" not in captured.out, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    assert _snapshot(root) == before
    return err


def _unlearn(tiny_pair, *extra: str, method: str = "grom") -> list[str]:
    return ["unlearn", "--method", method, "--model", str(tiny_pair.target), "--output", "out", *extra]


QA = {"question": "Who wrote the book?", "answer": "The author wrote it."}
QA2 = {"question": "Where was she born?", "answer": "In a small town."}


@pytest.fixture()
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _documents_folder(folder: Path, texts: dict[str, str]) -> Path:
    folder.mkdir()
    for name, text in texts.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def test_a_folder_of_empty_documents_is_refused_naming_the_file(tiny_pair, here, capsys):
    _documents_folder(here / "forget", {"a.txt": "", "b.txt": "  \n\t\n"})
    _documents_folder(here / "retain", {"c.txt": "Some text to keep."})
    _refused_with_nothing_changed(capsys, here, _unlearn(tiny_pair, "--forget-file", "forget", "--retain-file",
                                                         "retain"), "a.txt", "empty or whitespace-only document")


@pytest.mark.parametrize("lines, where", [
    (['""'], "line 1"),
    (['"A document."', '{"text": "   "}'], "line 2"),
])
def test_a_blank_document_line_is_refused_naming_the_line(tiny_pair, here, capsys, lines, where):
    (here / "forget.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    _documents_folder(here / "retain", {"c.txt": "Some text to keep."})
    _refused_with_nothing_changed(capsys, here, _unlearn(tiny_pair, "--forget-file", "forget.jsonl",
                                                         "--retain-file", "retain"),
                                  f"forget.jsonl: {where}", "whitespace-only document")


def test_a_whitespace_only_answer_is_refused(tiny_pair, here, capsys):
    (here / "forget.jsonl").write_text(json.dumps({"question": "Who?", "answer": " \n "}) + "\n")
    _refused_with_nothing_changed(capsys, here, _unlearn(tiny_pair, "--forget-file", "forget.jsonl",
                                                         "--data", "synthetic"), "forget.jsonl:1", "'answer'")


def test_a_link_inside_a_documents_folder_is_refused(tiny_pair, here, capsys):
    (here / "elsewhere.txt").write_text("A file outside the folder.", encoding="utf-8")
    forget = _documents_folder(here / "forget", {"a.txt": "A document to forget."})
    os.symlink(here / "elsewhere.txt", forget / "b.txt")
    _documents_folder(here / "retain", {"c.txt": "Some text to keep."})
    _refused_with_nothing_changed(capsys, here, _unlearn(tiny_pair, "--forget-file", "forget", "--retain-file",
                                                         "retain"), "b.txt is a symbolic link")


@pytest.mark.parametrize("name, text, fragments", [
    ("forget.jsonl", "\ufeff" + json.dumps(QA) + "\n" + json.dumps(QA2) + "\n", ("forget.jsonl:1", "byte-order mark")),
    ("forget.txt", "\ufeffA document to forget.", ("forget.txt", "byte-order mark")),
    ("forget.jsonl", json.dumps(QA) + "\n" + '{"question": "Q?", "answer": "A.", "answer": "B."}\n',
     ("forget.jsonl:2", "'answer' occurs twice")),
    ("forget.json", '[{"text": "A document.", "text": "Another."}]', ("forget.json", "'text' occurs twice")),
])
def test_a_byte_order_mark_or_a_repeated_key_is_refused(tiny_pair, here, capsys, name, text, fragments):
    (here / name).write_text(text, encoding="utf-8")
    retain = ["--retain-file", "retain"] if name.endswith((".txt", ".json")) else ["--data", "synthetic"]
    if name.endswith((".txt", ".json")):
        _documents_folder(here / "retain", {"c.txt": "Some text to keep."})
    _refused_with_nothing_changed(capsys, here, _unlearn(tiny_pair, "--forget-file", name, *retain), *fragments)


@pytest.mark.parametrize("seed", ["-1", str(2**32)])
def test_a_seed_out_of_range_is_refused_before_the_model_loads(tiny_pair, here, capsys, seed):
    _refused_with_nothing_changed(capsys, here, _unlearn(tiny_pair, "--data", "synthetic", "--seed", seed,
                                                         method="grad_diff"), f"seed={seed}", "2**32 - 1")


def test_a_resume_with_other_settings_or_rows_is_refused_before_the_model_loads(tiny_pair, here, capsys,
                                                                                 monkeypatch):
    run = _unlearn(tiny_pair, "--data", "synthetic", "--save_strategy", "steps", "--save_steps", "1",
                   method="grad_diff")
    assert main([*run, "--max_steps", "1"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    import hf_unlearn.run as run_path

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(run_path, "load_model", no_model)
    _refused_with_nothing_changed(capsys, here, [*run, "--max_steps", "2", "--resume", "--learning_rate", "1e-4"],
                                  "--resume", "learning_rate=1e-05 (now 0.0001)")
    other_rows = [a if a != "synthetic" else "synthetic:1" for a in run]
    _refused_with_nothing_changed(capsys, here, [*other_rows, "--max_steps", "2", "--resume"],
                                  "other forget rows", "other retain rows")
