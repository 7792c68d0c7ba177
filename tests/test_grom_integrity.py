"""GROM adapter integrity (file digests, audit P against the adapter's B A, a missing audit), and refusals with
clear messages before any forward pass (rows, config values, target modules, damaged metadata)."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from hf_unlearn.integrity import AdapterIntegrityError
from hf_unlearn.methods.grom import GROMConfig, GROMEdit, fit_grom, load_grom_adapter


@pytest.fixture(scope="module")
def tiny_edit(tiny_pair, synthetic):
    from hf_unlearn.demo import load_tiny

    model, tok = load_tiny(tiny_pair.target)
    forget, retain = synthetic["forget10"], synthetic["retain90"]
    return fit_grom(model, tok, forget[:2], retain[:40], GROMConfig(
        target_modules=["down_proj", "lm_head"], layers=[1], progress=False))


def _fresh(tiny_pair):
    from hf_unlearn.demo import load_tiny

    return load_tiny(tiny_pair.target)


def _scale_tensor(path, key_part, factor):
    """Multiply every tensor of the safetensors file whose key contains ``key_part`` by ``factor`` (a hand edit)."""
    from safetensors.torch import load_file, save_file

    state = load_file(str(path))
    hits = [k for k in state if key_part in k]
    assert hits, key_part
    for k in hits:
        state[k] = state[k] * factor
    save_file(state, str(path), metadata={"format": "pt"})


def _rerecord_digest(folder, name):
    """Write the file's current SHA-256 into the metadata: what a careful hand edit would do."""
    meta_path = folder / "grom_metadata.json"
    meta = json.loads(meta_path.read_text())
    meta["integrity"]["files"][name] = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    meta_path.write_text(json.dumps(meta))


def test_digests_recorded_and_clean_adapter_loads(tiny_pair, tiny_edit, tmp_path):
    from hf_unlearn.integrity import file_sha256

    out = tmp_path / "a"
    tiny_edit.save_pretrained(out)
    meta = json.loads((out / "grom_metadata.json").read_text())
    files = meta["integrity"]["files"]
    assert meta["integrity"]["algorithm"] == "sha256"
    assert set(files) == {"adapter_config.json", "adapter_model.safetensors", "grom_audit.safetensors"}
    for name, digest in files.items():
        assert digest == hashlib.sha256((out / name).read_bytes()).hexdigest() == file_sha256(out / name)
    model, _ = _fresh(tiny_pair)
    loaded = GROMEdit.from_pretrained(out, model=model)
    for name, p in tiny_edit.deltas.items():
        torch.testing.assert_close(loaded.deltas[name], p, rtol=1e-6, atol=1e-9)  # P recomputed from the audit
    assert load_grom_adapter(model, out) is not None


def test_lora_b_times_ten_is_refused(tiny_pair, tiny_edit, tmp_path):
    out = tmp_path / "a"
    tiny_edit.save_pretrained(out)
    _scale_tensor(out / "adapter_model.safetensors", "lm_head.lora_B", 10.0)
    model, _ = _fresh(tiny_pair)
    with pytest.raises(AdapterIntegrityError, match=r"adapter_model\.safetensors was modified after it was saved"):
        GROMEdit.from_pretrained(out, model=model)
    with pytest.raises(AdapterIntegrityError, match=r"adapter_model\.safetensors was modified"):
        load_grom_adapter(model, out)
    assert not hasattr(model, "peft_config")  # nothing was wrapped
    # with the digest re-recorded, the audit's P still disagrees with the adapter's B A
    _rerecord_digest(out, "adapter_model.safetensors")
    with pytest.raises(AdapterIntegrityError, match=r"'lm_head'.*differ by a relative Frobenius error of 9"):
        GROMEdit.from_pretrained(out, model=model)


def test_audit_delta_times_ten_is_refused(tiny_pair, tiny_edit, tmp_path):
    out = tmp_path / "a"
    tiny_edit.save_pretrained(out)
    _scale_tensor(out / "grom_audit.safetensors", "targets/model.layers.1.mlp.down_proj", 10.0)
    with pytest.raises(AdapterIntegrityError, match=r"grom_audit\.safetensors was modified after it was saved"):
        GROMEdit.from_pretrained(out)
    _rerecord_digest(out, "grom_audit.safetensors")
    # ||B A - 10 P|| / ||10 P|| = 0.9
    with pytest.raises(AdapterIntegrityError, match=r"'model\.layers\.1\.mlp\.down_proj'.*error of 0\.9"):
        GROMEdit.from_pretrained(out)


def test_deleted_audit_is_refused_unless_allowed(tiny_pair, tiny_edit, tmp_path):
    out = tmp_path / "a"
    tiny_edit.save_pretrained(out)
    (out / "grom_audit.safetensors").unlink()
    model, _ = _fresh(tiny_pair)
    with pytest.raises(AdapterIntegrityError, match=r"grom_audit\.safetensors is missing.*allow_missing_audit=True"):
        GROMEdit.from_pretrained(out, model=model, verify_integrity=False)  # refused by the metadata's audit_file
    with pytest.raises(AdapterIntegrityError, match=r"grom_audit\.safetensors is missing"):
        load_grom_adapter(model, out)
    slim = GROMEdit.from_pretrained(out, model=model, allow_missing_audit=True, verify_integrity=False)
    for name, p in tiny_edit.deltas.items():  # P = B A from the float32 factors
        torch.testing.assert_close(slim.deltas[name], p, rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="audit state"):
        slim.influence(0)
    # and the edited adapter alone, even with the audit allowed to be absent, is still caught by its digest
    _scale_tensor(out / "adapter_model.safetensors", "lora_B", 10.0)
    with pytest.raises(AdapterIntegrityError, match="was modified"):
        GROMEdit.from_pretrained(out, allow_missing_audit=True)


def test_metadata_without_digests_is_refused_unless_unchecked(tiny_edit, tmp_path):
    out = tmp_path / "a"
    tiny_edit.save_pretrained(out, save_audit=False)
    meta = json.loads((out / "grom_metadata.json").read_text())
    assert set(meta["integrity"]["files"]) == {"adapter_config.json", "adapter_model.safetensors"}
    del meta["integrity"]
    (out / "grom_metadata.json").write_text(json.dumps(meta))
    with pytest.raises(AdapterIntegrityError, match=r"records no file digests.*verify_integrity=False"):
        GROMEdit.from_pretrained(out)
    assert set(GROMEdit.from_pretrained(out, verify_integrity=False).deltas) == set(tiny_edit.deltas)


def test_damaged_metadata_and_missing_module_have_clear_errors(tiny_edit, tmp_path):
    from safetensors.torch import load_file, save_file

    out = tmp_path / "a"
    tiny_edit.save_pretrained(out, save_audit=False)
    good = (out / "grom_metadata.json").read_text()
    (out / "grom_metadata.json").write_text(good[: len(good) // 2])
    with pytest.raises(ValueError, match=r"grom_metadata\.json is not valid JSON.*Restore the file") as info:
        GROMEdit.from_pretrained(out)
    assert not isinstance(info.value, json.JSONDecodeError)
    (out / "grom_metadata.json").write_text(json.dumps({"config": {}}))
    with pytest.raises(ValueError, match=r"grom_metadata\.json has no \['modules'\] entry"):
        GROMEdit.from_pretrained(out)
    (out / "grom_metadata.json").write_text(good)
    state = load_file(str(out / "adapter_model.safetensors"))
    save_file({k: v for k, v in state.items() if ".lm_head." not in k}, str(out / "adapter_model.safetensors"),
              metadata={"format": "pt"})
    _rerecord_digest(out, "adapter_model.safetensors")
    with pytest.raises(ValueError, match=r"adapter_model\.safetensors has no LoRA factors for module 'lm_head'"):
        GROMEdit.from_pretrained(out)


# ----- refusals before any work ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ridge", "suppression_margin", "forget_weight", "retain_weight",
                                  "generic_retain_weight", "specificity_smoothing", "corruption_norm"])
@pytest.mark.parametrize("value", [float("inf"), float("nan"), -1.0])
def test_non_finite_or_negative_numbers_name_the_field_and_range(name, value):
    with pytest.raises(ValueError, match=rf"GROMConfig\.{name} must be .*a finite number.*[>]=? 0.*got {value}"):
        GROMConfig(**{name: value})


def test_huge_suppression_margin_gives_a_clear_error(tiny_pair, synthetic):
    model, tok = _fresh(tiny_pair)
    with pytest.raises(ValueError, match=r"not finite.*suppression_margin"):
        fit_grom(model, tok, synthetic["forget10"][:2], synthetic["retain90"][:10],
                 GROMConfig(target_modules="lm_head", suppression_margin=1e308, progress=False))


class _CountForwards:
    def __init__(self, model):
        self.calls = 0
        self.handle = model.register_forward_pre_hook(self)

    def __call__(self, module, args):
        self.calls += 1


def test_bad_rows_and_unknown_modules_are_refused_before_any_forward_pass(tiny_pair, synthetic):
    from hf_unlearn.methods.grom.inputs import _prepare

    model, tok = _fresh(tiny_pair)
    forget, retain = synthetic["forget10"][:4], synthetic["retain90"][:20]
    counter = _CountForwards(model)
    cases = [
        (["a string"], retain, GROMConfig(progress=False), r"forget row 0 is a str .*not a dict.*'question' and 'answer'"),
        ("one string", retain, GROMConfig(progress=False), r"forget set must be a list of rows"),
        ([{"question": "q?"}], retain, GROMConfig(progress=False), r"forget row 0 has no 'answer' field"),
        ([{"question": "q?", "answer": None}], retain, GROMConfig(progress=False), r"'answer' must be a string"),
        ([{"question": "q?", "answer": 3}], retain, GROMConfig(progress=False), r"'answer' must be a string, got int"),
        ([{"question": "q?", "answer": "  "}], retain, GROMConfig(progress=False), r"forget row 0 has an empty answer"),
        (forget, [*retain, 7], GROMConfig(progress=False), r"retain row 20 is a int"),
        (forget, retain, GROMConfig(target_modules="no_such_proj", progress=False), r"matches no module"),
        (forget, retain, GROMConfig(candidate_layers=[5], progress=False), r"candidate_layers \[5\] have no"),
    ]
    for f, r, cfg, message in cases:
        with pytest.raises(ValueError, match=message):
            _prepare(model, tok, f, r, cfg, None)
        with pytest.raises(ValueError, match=message):
            fit_grom(model, tok, f, r, cfg)
    for cfg, message in ((GROMConfig(target_modules="no_such_proj"), "matches no module"),
                         (GROMConfig(target_modules="up_proj"), "residual stream"),
                         (GROMConfig(layers=[7]), r"layers \[7\] have no"),
                         (GROMConfig(candidate_layers=[0, 5]), r"candidate_layers \[5\] have no")):
        with pytest.raises(ValueError, match=message):
            cfg.check_for(model)  # the model-level checks alone (what the CLI runs before creating folders)
    GROMConfig(target_modules=["down_proj", "lm_head"]).check_for(model)
    assert counter.calls == 0
    prep = _prepare(model, tok, forget, retain, GROMConfig(progress=False), None)
    assert [t.name for t in prep.layered + prep.heads] == ["model.layers.1.mlp.down_proj"] and prep.candidates == [1]
    assert len(prep.forget_feats) == 4 and len(prep.retain_feats) == 20
    assert counter.calls == 0
    counter.handle.remove()


def test_tensor_digest_is_of_the_stored_bytes():
    from hf_unlearn.integrity import tensor_sha256

    w = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    digest = tensor_sha256(w)
    assert digest == hashlib.sha256(w.numpy().tobytes()).hexdigest()
    assert tensor_sha256(w.T.contiguous().T) == digest  # layout does not matter
    half = w.to(torch.bfloat16)
    assert tensor_sha256(half) == hashlib.sha256(half.view(torch.int16).numpy().tobytes()).hexdigest() != digest
    bumped = w.clone()
    bumped[0, 0] += 1e-3
    assert tensor_sha256(bumped) != digest
