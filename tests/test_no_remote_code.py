"""No code shipped with a model ever runs, and no prompt offers to run it.

Every ``Auto*.from_pretrained`` / ``Auto*.from_config`` call of the package and its examples passes
``trust_remote_code=False`` (read from the source, so a new call without it fails here). Through the real CLI
entry point (``unlearn`` and ``eval``), a model folder whose ``config.json`` or ``tokenizer_config.json`` asks for its own code (``auto_map``,
an unknown ``model_type``) is refused in one line before anything loads, even when the user would answer ``y`` at
transformers' "Do you wish to run the custom code?" prompt: the prompt never shows, the model's Python file never
runs, and the folder tree is unchanged.
"""

from __future__ import annotations

import ast
import hashlib
import json
import shutil
from pathlib import Path

import pytest

from hf_unlearn.cli import main

REPO = Path(__file__).resolve().parents[1]
SCANNED = [*(REPO / "hf_unlearn").rglob("*.py"), *(REPO / "examples").rglob("*.py"),
           *(REPO / "benchmarks").rglob("*.py")]


def _auto_loads_without_false(path: Path) -> list[str]:
    """``file:line`` of each ``Auto*.from_pretrained(...)`` / ``Auto*.from_config(...)`` call in ``path`` without
    the keyword ``trust_remote_code=False``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("from_pretrained", "from_config")):
            continue
        owner = node.func.value
        if not (isinstance(owner, ast.Name) and owner.id.startswith("Auto")):
            continue
        if not any(k.arg == "trust_remote_code" and isinstance(k.value, ast.Constant) and k.value.value is False
                   for k in node.keywords):
            found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    return found


def test_every_auto_load_passes_trust_remote_code_false():
    assert len(SCANNED) > 50
    missing = [where for path in SCANNED for where in _auto_loads_without_false(path)]
    assert missing == []


def test_the_scan_finds_a_load_without_it(tmp_path):
    probe = REPO / "examples" / "_probe_scan.py"  # inside the repository, as relative_to needs
    try:
        probe.write_text("from transformers import AutoTokenizer\nt = AutoTokenizer.from_pretrained('x')\n"
                         "u = AutoTokenizer.from_pretrained('x', trust_remote_code=False)\n")
        assert _auto_loads_without_false(probe) == ["examples/_probe_scan.py:2"]
    finally:
        probe.unlink()


def _snapshot(root: Path) -> dict[str, str]:
    """Every path under ``root`` with the SHA-256 of its bytes (``dir`` for a folder)."""
    return {str(p.relative_to(root)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))}


CODE = "import pathlib\npathlib.Path({marker!r}).write_text('ran')\n"


def _code_model(tiny_pair, folder: Path, where: str) -> Path:
    """A copy of the tiny model whose ``where`` file asks for the model's own code, which writes a marker file
    beside the folder when it is imported."""
    shutil.copytree(tiny_pair.target, folder)
    marker = str(folder.parent / "code_ran")
    for name in ("configuration_own.py", "modeling_own.py", "tokenization_own.py"):
        (folder / name).write_text(CODE.format(marker=marker))
    config_path = folder / where
    data = json.loads(config_path.read_text()) if config_path.is_file() else {}
    if where == "config.json":
        data.update(model_type="own_model", auto_map={"AutoConfig": "configuration_own.OwnConfig",
                                                      "AutoModelForCausalLM": "modeling_own.OwnModel"})
    elif where == "tokenizer_config.json":
        data["auto_map"] = {"AutoTokenizer": ["tokenization_own.OwnTokenizer", None]}
    else:  # an unknown model_type alone
        config_path = folder / "config.json"
        data = json.loads(config_path.read_text())
        data["model_type"] = "own_model"
    config_path.write_text(json.dumps(data))
    return folder


@pytest.mark.parametrize("command, where, fragment", [
    ("unlearn", "config.json", "auto_map"),
    ("unlearn", "tokenizer_config.json", "auto_map"),
    ("unlearn", "model_type", "model_type 'own_model'"),
    ("eval", "config.json", "auto_map"),
])
def test_a_model_asking_for_its_own_code_is_refused_before_it_loads(tiny_pair, tmp_path, monkeypatch, capsys,
                                                                      command, where, fragment):
    model = _code_model(tiny_pair, tmp_path / "model", where)
    prompts: list[str] = []

    def answer_yes(prompt=""):  # what a user at a terminal might answer
        prompts.append(prompt)
        return "y"

    monkeypatch.setattr("builtins.input", answer_yes)
    monkeypatch.chdir(tmp_path)
    before = _snapshot(tmp_path)
    argv = (["unlearn", "--method", "grad_diff", "--output", str(tmp_path / "out"), "--max_steps", "1"]
            if command == "unlearn" else ["eval", "--output", str(tmp_path / "report.json")])
    code = main([*argv, "--model", str(model), "--data", "synthetic"])
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert code == 2, (code, err, captured.out[-2000:])
    assert err.startswith("hf-unlearn: error: ") and "\n" not in err and fragment in err, err
    assert "never runs code shipped with a model" in err
    assert prompts == [] and "custom code" not in captured.out
    assert not (tmp_path / "code_ran").exists()
    assert _snapshot(tmp_path) == before
