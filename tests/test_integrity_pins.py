"""Artifact integrity beyond the digests an artifact carries: GROM file names confined to the adapter folder, a
digest the user pins when loading (``expected_sha256=``) for GROM adapters and T3 heads, the pinned digest in the
pushed model card's front matter, and per-file SHA-256 digests of a T3 head checked at load (a flipped byte is
refused naming the file)."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import torch
from test_t3 import random_head

from hf_unlearn.demo import load_tiny
from hf_unlearn.integrity import AdapterIntegrityError, manifest_digest
from hf_unlearn.methods.grom import GROMConfig, GROMEdit, adapter_digest, fit_grom, load_grom_adapter
from hf_unlearn.methods.t3 import T3Classifier, T3LogitsProcessor


@pytest.fixture(scope="module")
def base(tiny_pair):
    model, tok = load_tiny(tiny_pair.target)
    return model.eval(), tok


@pytest.fixture(scope="module")
def tiny_edit(base, synthetic):
    model, tok = base
    return fit_grom(model, tok, synthetic["forget10"][:6], synthetic["retain90"][:40],
                    GROMConfig(target_modules=["down_proj"], layers=[1], progress=False))


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _edit_metadata(folder, change) -> None:
    path = folder / "grom_metadata.json"
    meta = json.loads(path.read_text())
    change(meta)
    path.write_text(json.dumps(meta))


def _scale_lora_b(folder, factor: float) -> None:
    from safetensors.torch import load_file, save_file

    path = folder / "adapter_model.safetensors"
    state = load_file(str(path))
    for key in [k for k in state if "lora_B" in k]:
        state[key] = state[key] * factor
    save_file(state, str(path), metadata={"format": "pt"})


# ------------------------------------------------------------------------------------------- GROM
@pytest.mark.parametrize("name", ["../outside.safetensors", "/etc/hostname", "sub/adapter.safetensors", ".."])
def test_grom_metadata_file_names_are_confined_to_the_folder(tiny_edit, tmp_path, name):
    out = tmp_path / "a"
    tiny_edit.save_pretrained(out)
    (tmp_path / "outside.safetensors").write_bytes(b"x")

    def add(meta):
        meta["integrity"]["files"][name] = "0" * 64

    _edit_metadata(out, add)
    with pytest.raises(AdapterIntegrityError, match="not a plain file name inside the folder"):
        GROMEdit.from_pretrained(out)
    _edit_metadata(out, lambda meta: meta["integrity"]["files"].pop(name))
    _edit_metadata(out, lambda meta: meta.update(audit_file=name))
    with pytest.raises(AdapterIntegrityError, match="not a plain file name inside the folder"):
        GROMEdit.from_pretrained(out, verify_integrity=False)


def test_a_grom_file_linked_out_of_the_folder_is_refused(tiny_edit, tmp_path):
    out = tmp_path / "a"
    tiny_edit.save_pretrained(out)
    moved = tmp_path / "elsewhere.safetensors"
    shutil.move(out / "adapter_model.safetensors", moved)
    (out / "adapter_model.safetensors").symlink_to(moved)  # the same bytes, but outside the folder
    with pytest.raises(AdapterIntegrityError, match=r"adapter_model\.safetensors is a link to .*outside the folder"):
        GROMEdit.from_pretrained(out)


def test_grom_metadata_must_record_the_adapter_weights(tiny_edit, tmp_path):
    out = tmp_path / "a"
    tiny_edit.save_pretrained(out)
    _scale_lora_b(out, 50.0)
    _edit_metadata(out, lambda meta: meta["integrity"]["files"].pop("adapter_model.safetensors"))
    with pytest.raises(AdapterIntegrityError, match=r"records no digest for adapter_model\.safetensors"):
        GROMEdit.from_pretrained(out)


def test_a_pinned_digest_refuses_an_adapter_rewritten_with_its_metadata(base, tiny_edit, tmp_path):
    """The issue's attack: lora_B x50, its new SHA-256 written into the metadata and the audit dropped. The
    metadata's own digests cannot see it; the digest pinned at save time does."""
    model, _ = base
    out = tmp_path / "a"
    tiny_edit.save_pretrained(out)
    pin = adapter_digest(out)
    assert pin == _sha(out / "grom_metadata.json")
    assert GROMEdit.from_pretrained(out, model=model, expected_sha256=pin).deltas.keys() == tiny_edit.deltas.keys()
    _scale_lora_b(out, 50.0)

    def forge(meta):
        meta["integrity"]["files"]["adapter_model.safetensors"] = _sha(out / "adapter_model.safetensors")
        meta["integrity"]["files"].pop("grom_audit.safetensors")
        meta["audit_file"] = None

    _edit_metadata(out, forge)
    for load in (lambda: GROMEdit.from_pretrained(out, model=model, expected_sha256=pin),
                 lambda: GROMEdit.from_pretrained(out, expected_sha256=pin.upper(), verify_integrity=False),
                 lambda: load_grom_adapter(model, out, expected_sha256=pin)):
        with pytest.raises(AdapterIntegrityError, match=rf"grom_metadata\.json has sha256 .* not the pinned {pin[:12]}"):
            load()
    assert not hasattr(model, "peft_config")
    with pytest.raises(ValueError, match="expected_sha256 must be a hex SHA-256"):
        GROMEdit.from_pretrained(out, expected_sha256="not-a-digest")


def test_a_pushed_grom_card_carries_the_digest_to_pin(hub, tiny_edit):
    from huggingface_hub import ModelCard

    from hf_unlearn.hub import push_unlearned

    push_unlearned(tiny_edit, "tester/pinned-grom", token=hub.token, base_model="tester/tiny-base",
                   forget_split="forget10")
    entry = ModelCard.load("tester/pinned-grom").data.to_dict()["hf_unlearn_integrity"]
    assert entry["manifest"] == "grom_metadata.json" and len(entry["sha256"]) == 64
    pulled = GROMEdit.from_pretrained("tester/pinned-grom", expected_sha256=entry["sha256"])
    for name, p in tiny_edit.deltas.items():
        torch.testing.assert_close(pulled.deltas[name], p, rtol=1e-6, atol=1e-9)  # P recomputed from the audit
    with pytest.raises(AdapterIntegrityError, match="not the pinned"):
        GROMEdit.from_pretrained("tester/pinned-grom", expected_sha256="0" * 64)
    # GROMEdit.push_to_hub's own card carries the entry too
    report = {"forget_quality": 0.5, "model_utility": 0.4, "forget_rouge_l": 0.3, "forget_truth_ratio": 0.6,
              "forget_split": "forget10", "model_name": tiny_edit.base_model_name_or_path}
    tiny_edit.push_to_hub("tester/pinned-grom-2", token=hub.token, report=report)
    entry = ModelCard.load("tester/pinned-grom-2").data.to_dict()["hf_unlearn_integrity"]
    assert entry["manifest"] == "grom_metadata.json"
    assert GROMEdit.from_pretrained("tester/pinned-grom-2", expected_sha256=entry["sha256"]).deltas.keys() == \
        tiny_edit.deltas.keys()


# ------------------------------------------------------------------------------------------- T3
def _flip_last_byte(path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # inside the last tensor's values: the file still parses
    path.write_bytes(bytes(data))


def test_a_saved_t3_head_records_its_file_digests(base, tmp_path):
    model, _ = base
    out = tmp_path / "head"
    random_head(model).save_pretrained(out)
    record = json.loads((out / "t3_integrity.json").read_text())
    assert record["algorithm"] == "sha256"
    assert record["files"] == {name: _sha(out / name) for name in ("config.json", "model.safetensors")}
    loaded = T3Classifier.from_pretrained(out)
    assert loaded.name_or_path == str(out)


def test_a_flipped_byte_in_a_t3_head_is_refused_naming_the_file(base, tmp_path):
    model, _ = base
    out = tmp_path / "head"
    random_head(model).save_pretrained(out)
    _flip_last_byte(out / "model.safetensors")
    with pytest.raises(AdapterIntegrityError, match=r"model\.safetensors was modified after it was saved"):
        T3Classifier.from_pretrained(out)
    with pytest.raises(AdapterIntegrityError, match=r"model\.safetensors was modified"):
        T3LogitsProcessor.from_pretrained(model, str(out))
    assert isinstance(T3Classifier.from_pretrained(out, verify_integrity=False), T3Classifier)  # asked for


def test_a_t3_head_without_its_record_or_with_an_unrecorded_file_is_refused(base, tmp_path):
    model, _ = base
    out = tmp_path / "head"
    random_head(model).save_pretrained(out)
    (out / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(AdapterIntegrityError, match=r"model\.safetensors\.index\.json is not recorded"):
        T3Classifier.from_pretrained(out)
    (out / "model.safetensors.index.json").unlink()
    (out / "t3_integrity.json").unlink()
    with pytest.raises(AdapterIntegrityError, match=r"no t3_integrity\.json.*verify_integrity=False"):
        T3Classifier.from_pretrained(out)


def test_a_pinned_digest_refuses_a_t3_head_rewritten_with_its_record(base, tmp_path):
    model, _ = base
    out = tmp_path / "head"
    random_head(model).save_pretrained(out)
    pin = manifest_digest(out, "t3_integrity.json")
    assert isinstance(T3Classifier.from_pretrained(out, expected_sha256=pin), T3Classifier)
    _flip_last_byte(out / "model.safetensors")
    record = json.loads((out / "t3_integrity.json").read_text())
    record["files"]["model.safetensors"] = _sha(out / "model.safetensors")
    (out / "t3_integrity.json").write_text(json.dumps(record))
    assert isinstance(T3Classifier.from_pretrained(out), T3Classifier)  # the record alone cannot tell
    with pytest.raises(AdapterIntegrityError, match=rf"t3_integrity\.json has sha256 .* not the pinned {pin[:12]}"):
        T3Classifier.from_pretrained(out, expected_sha256=pin)


def test_a_pushed_t3_card_carries_the_digest_to_pin(hub, base):
    from huggingface_hub import ModelCard
    from transformers import AutoModel

    from hf_unlearn.hub import push_unlearned

    model, _ = base
    head = random_head(model)
    push_unlearned(head, "tester/pinned-t3", token=hub.token, base_model="tester/tiny-base", forget_split="forget10")
    entry = ModelCard.load("tester/pinned-t3").data.to_dict()["hf_unlearn_integrity"]
    assert entry["manifest"] == "t3_integrity.json"
    pulled = AutoModel.from_pretrained("tester/pinned-t3", expected_sha256=entry["sha256"])
    assert isinstance(pulled, T3Classifier) and pulled.name_or_path == "tester/pinned-t3"
    torch.testing.assert_close(pulled.up.weight, head.up.weight, rtol=0, atol=0)
    with pytest.raises(AdapterIntegrityError, match="not the pinned"):
        T3Classifier.from_pretrained("tester/pinned-t3", expected_sha256="f" * 64)
