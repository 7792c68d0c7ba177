"""``examples/deletion_request.py`` end to end on the tiny model: the records are forgotten, the report and the
published folder are written, and the folder reaches the Hub in one commit. (The per-method scripts in
``examples/scripts`` are tested in ``test_cli_scripts.py``.)"""

from __future__ import annotations

import json
import runpy

from conftest import REPO_ROOT


def test_deletion_request_end_to_end(tiny_pair, tmp_path, capsys, hub):
    from hf_unlearn.data import load_tofu_rows

    records = tmp_path / "delete_me.jsonl"
    to_delete = load_tofu_rows("forget10", "synthetic")
    records.write_text("".join(json.dumps({"question": r["question"], "answer": r["answer"]}) + "\n" for r in to_delete))
    out, repo = tmp_path / "request", tmp_path / "published"
    script = runpy.run_path(str(REPO_ROOT / "examples" / "deletion_request.py"), run_name="deletion_request")
    script["main"]([
        "--model", str(tiny_pair.target), "--records", str(records), "--method", "grom",
        "--retain_data", "synthetic", "--retain_model", str(tiny_pair.retain), "--output_dir", str(out),
        "--repo", str(repo), "--max_new_tokens", "24", "--target_modules", "lm_head",
        "--push_to_hub", "tester/deletion-001", "--hub_token", hub.token,
    ])
    printed = capsys.readouterr().out
    report = json.loads((out / "deletion_report.json").read_text())
    assert report["method"] == "grom" and report["num_records"] == len(to_delete)
    assert report["reference"]["kind"] == "retain model"
    # forgotten: the records' answers are less likely and less often reproduced than by the original
    assert report["after"]["forget_nll"] > report["before"]["forget_nll"] + 0.05
    assert report["after"]["forget_rouge_l"] < report["before"]["forget_rouge_l"]
    assert report["after_nf4"]["forget_rouge_l"] is not None
    # specific: the records' NLL rose far more than the retain rows' (the method's own option reached GROM)
    assert report["settings"]["target_modules"] == ["lm_head"]
    forget_rise = report["after"]["forget_nll"] - report["before"]["forget_nll"]
    assert forget_rise > 3 * (report["after"]["retain_nll"] - report["before"]["retain_nll"])
    # the published folder: the adapter, its model card and the report
    assert (repo / "adapter_model.safetensors").is_file() and (repo / "README.md").is_file()
    assert "grom" in (repo / "README.md").read_text().lower()
    assert json.loads((repo / "deletion_report.json").read_text()) == report
    assert (out / "deletion_report.md").read_text() in printed
    # and the same folder on the Hub, in one commit
    pushed = hub.files("tester/deletion-001")
    assert {"README.md", "adapter_model.safetensors", "adapter_config.json", "deletion_report.json"} <= set(pushed)
    assert pushed["README.md"] == (repo / "README.md").read_bytes()
