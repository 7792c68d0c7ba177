"""Under PEFT the frozen reference of every reference-model objective is the base with its adapter disabled: its
log-probabilities equal those of a separate frozen copy, and no second model is built."""

from __future__ import annotations

import warnings

import pytest
import torch

from hf_unlearn.registry import get_method, method_names

#: Settings under which each trainer method's objective reads the frozen reference (beyond its defaults).
REFERENCE_SETTINGS = {
    "npo": {}, "undial": {}, "dpo": {"alternate_column": "perturbed_answer"}, "idk_dpo": {}, "rmu": {"layer": 1},
    "masc": {}, "grad_diff": {"retain_loss": "kl"}, "atwu": {"forget_loss": "npo"},
    "pdu": {"retain_loss": "kl", "retain_loss_eps": 5.0},
}


def _config(method: str, tmp_path, **settings):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return get_method(method).config_cls(
            output_dir=str(tmp_path / method), report_to="none", save_strategy="no", max_steps=1,
            per_device_train_batch_size=4, **settings)


def test_every_reference_objective_is_covered(tmp_path):
    """Every trainer method whose default objective reads the reference is in the table, and the table's settings
    make each one read it."""
    for name in method_names():
        info = get_method(name)
        if not info.is_trainer or name == "pdu":  # PDU has no default retain bound; it is in the table
            continue
        trainer_cls = info.trainer_cls
        if trainer_cls.needs_reference_model(_config(name, tmp_path)):
            assert name in REFERENCE_SETTINGS, name
    for name, settings in REFERENCE_SETTINGS.items():
        trainer_cls = get_method(name).trainer_cls
        assert trainer_cls.needs_reference_model(_config(name, tmp_path, **settings)), name


@pytest.mark.parametrize("method", sorted(REFERENCE_SETTINGS))
def test_peft_reference_is_the_base_with_the_adapter_disabled(method, tiny_pair, synthetic, tmp_path, monkeypatch):
    from peft import LoraConfig

    from hf_unlearn.demo import load_tiny
    from hf_unlearn.methods.base import reference
    from hf_unlearn.methods.base.trainer import UnlearningTrainer

    built = []
    monkeypatch.setattr(UnlearningTrainer, "_create_reference_model",
                        lambda self, *a, **k: built.append("reference") or pytest.fail("a second model was built"))
    monkeypatch.setattr(reference, "independent_copy", lambda *a, **k: pytest.fail("the model was copied"))
    model, tok = load_tiny(tiny_pair.target)
    frozen, _ = load_tiny(tiny_pair.target)
    info = get_method(method)
    args = _config(method, tmp_path, **REFERENCE_SETTINGS[method])
    lora = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    trainer = info.trainer_cls(
        model, args, train_dataset=synthetic["forget10_perturbed"][:4], retain_dataset=synthetic["retain90"][:4],
        processing_class=tok, peft_config=lora)
    assert trainer.ref_model is None and not built
    with torch.no_grad():  # an adapter that changes the outputs, so the disabled one is told apart
        for name, param in trainer.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.5)
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    for prefix in ("", "retain_"):
        if prefix + "input_ids" not in batch:
            continue
        reference_scores = trainer.reference_scores(batch, prefix).token_log_probs
        with torch.no_grad():
            expected = trainer.score(frozen, batch, prefix).token_log_probs
            policy = trainer.score(trainer.model, batch, prefix).token_log_probs
        torch.testing.assert_close(reference_scores, expected, atol=1e-5, rtol=1e-5)
        assert (policy - expected).abs().max() > 1e-3  # the adapter is on outside the reference pass
