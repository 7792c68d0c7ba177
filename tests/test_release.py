"""What runs after a trainer (the evaluation, the NF4 re-check, the attacks) gets its memory: the optimizer states
and the reference model are gone once the result is saved, and the NF4 copy keeps a half-precision model's dtype."""

from __future__ import annotations

import gc
import weakref

import torch

from hf_unlearn.run import fit_or_train, prepare_inputs, save


def test_save_releases_the_optimizer_and_the_reference_before_evaluation(tiny_target, synthetic, tmp_path,
                                                                             monkeypatch):
    from hf_unlearn.methods.base.trainer import UnlearningTrainer

    model, tok = tiny_target
    alive = {}
    real_train = UnlearningTrainer.train

    def train_and_watch(self, *args, **kwargs):
        out = real_train(self, *args, **kwargs)
        alive["optimizer"] = weakref.ref(self.optimizer.optimizer)  # the torch optimizer inside accelerate's wrapper
        alive["reference"] = weakref.ref(self.ref_model)
        alive["states"] = [weakref.ref(t) for s in self.optimizer.optimizer.state.values() for t in s.values()
                           if isinstance(t, torch.Tensor) and t.dim() > 0]
        return out

    monkeypatch.setattr(UnlearningTrainer, "train", train_and_watch)
    inputs = prepare_inputs("npo", model, tok, synthetic["forget10"][:4], synthetic["retain90"][:4], tmp_path / "out",
                            {"max_steps": 1, "per_device_train_batch_size": 4, "learning_rate": 1e-3})
    result = fit_or_train(inputs)
    save(result, inputs, tmp_path / "out")
    gc.collect()
    assert alive["states"] and all(ref() is None for ref in alive["states"])
    assert alive["optimizer"]() is None and alive["reference"]() is None
    trainer = result.info["trainer"]  # kept for save_pretrained, with the trained model
    assert trainer.model is result.model and trainer.optimizer is None and trainer.ref_model is None
    result.save_pretrained(tmp_path / "again")
    assert (tmp_path / "again" / "model.safetensors").is_file()


def test_nf4_copy_of_a_bfloat16_model_stays_in_bfloat16(tiny_target):
    from hf_unlearn.evaluation.quantization import _modules_to_quantize, nf4_roundtrip, quantize_nf4

    model, _ = tiny_target
    model = model.to(torch.bfloat16)
    quantized = quantize_nf4(model)
    assert {p.dtype for p in quantized.parameters()} == {torch.bfloat16}
    originals = dict(_modules_to_quantize(model))
    names = [name for name, _ in _modules_to_quantize(quantized)]
    assert names
    for name in names:
        expected = nf4_roundtrip(originals[name].weight)
        got = quantized.get_submodule(name).weight
        assert not torch.equal(got, originals[name].weight)  # it was quantized
        torch.testing.assert_close(got, expected, atol=0, rtol=0)
    assert next(model.parameters()).dtype is torch.bfloat16  # the input is untouched
