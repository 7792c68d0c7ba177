"""Copies of trained models run their own weights, whatever depth TRL's instance ``forward`` patch sits at."""

from __future__ import annotations

import functools

import torch

from hf_unlearn.model_copy import independent_copy


def test_copy_of_a_masc_lora_result_runs_its_own_weights(tiny_target, synthetic, tmp_path):
    """MASC trains a LoRA adapter: TRL patches ``forward`` on the wrapped model (``base_model.model``), not on the
    ``PeftModel``. A copy (the attacks' and the NF4 re-check's) must still compute with its own weights: zeroing the
    copy must change its outputs and leave the original's alone."""
    from hf_unlearn.evaluation.quantization import merged_copy
    from hf_unlearn.run import fit_or_train, prepare_inputs

    model, tokenizer = tiny_target
    result = fit_or_train(prepare_inputs("masc", model, tokenizer, synthetic["forget10"][:8], synthetic["retain90"][:8], tmp_path, {"max_steps": 1, "learning_rate": 1e-4, "per_device_train_batch_size": 4}))
    trained = result.model
    assert any("forward" in vars(m) for m in trained.modules())  # the patch this test is about is there
    ids = tokenizer(["Question: who?\nAnswer:"], return_tensors="pt")
    with torch.no_grad():
        before = trained.eval()(**ids).logits.clone()
        for copy in (independent_copy(trained), merged_copy(trained)):
            for p in copy.parameters():
                p.zero_()
            zeroed = copy.eval()(**ids).logits
            assert (zeroed - before).abs().max() > 1e-3  # the copy ran its own (zeroed) weights
        torch.testing.assert_close(trained(**ids).logits, before)  # the original is untouched


def test_instance_wrappers_that_refer_only_to_the_copy_are_kept():
    """A ``forward`` wrapper bound to the module itself (as accelerate's hooks are) survives the copy."""
    layer = torch.nn.Linear(2, 2)
    layer.forward = functools.partial(lambda module, x: type(module).forward(module, x) * 2, layer)
    copy = independent_copy(layer)
    assert "forward" in vars(copy)
    x = torch.ones(1, 2)
    torch.testing.assert_close(copy(x), 2 * torch.nn.functional.linear(x, copy.weight, copy.bias))
