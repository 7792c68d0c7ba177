"""NF4 re-check: the round trip equals a slow reference, and the real ``Linear4bit`` path agrees with it on shapes
that bitsandbytes' AVX512-BF16 CPU kernel accepts and refuses, with that kernel's path forced on and off."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from torch import nn

from hf_unlearn.evaluation import quantize_nf4
from hf_unlearn.evaluation.quantization import (
    NF4_BLOCKSIZE,
    NF4_CODE,
    cpu_packed_kernel_accepts,
    nf4_roundtrip,
)
from hf_unlearn.logprobs import answer_nll


def nf4_roundtrip_reference(weight: torch.Tensor, blocksize: int = NF4_BLOCKSIZE) -> torch.Tensor:
    """Slow pure-torch NF4 round trip (no double quantization): per block, the nearest code value times absmax."""
    flat = weight.detach().float().reshape(-1)
    code = torch.tensor(NF4_CODE)
    out = torch.empty_like(flat)
    for start in range(0, flat.numel(), blocksize):
        block = flat[start : start + blocksize]
        scale = block.abs().max()
        if scale == 0:
            out[start : start + blocksize] = 0.0
            continue
        index = (block[:, None] / scale - code[None, :]).abs().argmin(dim=1)
        out[start : start + blocksize] = code[index] * scale
    return out.reshape(weight.shape).to(weight.dtype)


@pytest.mark.parametrize("shape", [(176, 64), (64, 176), (96, 64), (32, 128), (5, 13)])
def test_nf4_roundtrip_equals_slow_reference(shape):
    torch.manual_seed(0)
    weight = torch.randn(*shape) * 0.05
    fast = nf4_roundtrip(weight)
    torch.testing.assert_close(fast, nf4_roundtrip_reference(weight), rtol=0, atol=1e-6)
    assert not torch.equal(fast, weight)
    assert len(torch.unique(fast[: min(shape[0], 1)].reshape(-1)[:64])) <= 16  # 16 code values per block


def test_cpu_kernel_shape_rule():
    assert cpu_packed_kernel_accepts(64, 192) and cpu_packed_kernel_accepts(192, 64)
    assert not cpu_packed_kernel_accepts(176, 64)  # N % 32 != 0: "N must be divisible by block_n"
    assert not cpu_packed_kernel_accepts(64, 176)  # a row that is not whole 64-weight blocks
    assert not cpu_packed_kernel_accepts(80, 80)


SHAPES = {"refused": (80, 176), "accepted": (64, 192)}  # (hidden, intermediate): every linear refused / accepted


def _tiny_llama(shapes: str) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, intermediate = SHAPES[shapes]
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=96, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=64, tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).eval()


def _logits(model: nn.Module) -> torch.Tensor:
    ids = torch.arange(24).reshape(2, 12) % 96
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def test_roundtrip_model_holds_exact_nf4_weights_and_leaves_input(tiny_target, synthetic):
    model, tokenizer = tiny_target
    original = model.model.layers[0].mlp.down_proj.weight.detach().clone()
    head = model.lm_head.weight.detach().clone()
    quantized = quantize_nf4(model)
    torch.testing.assert_close(quantized.model.layers[0].mlp.down_proj.weight, nf4_roundtrip(original))
    torch.testing.assert_close(quantized.lm_head.weight, head)  # the output head stays full precision
    torch.testing.assert_close(model.model.layers[0].mlp.down_proj.weight, original)  # input untouched
    rows = synthetic["forget10"][:8]
    qs, ans = [r["question"] for r in rows], [r["answer"] for r in rows]
    before = answer_nll(model, tokenizer, qs, ans, batch_size=8)
    after = answer_nll(quantized, tokenizer, qs, ans, batch_size=8)
    assert np.abs(after - before).mean() < 0.1  # 4-bit error, not garbage
    assert after.mean() < 1.0  # still recalls what it memorised


def test_nf4_quantization_merges_peft_adapters(tiny_target, synthetic):
    from peft import LoraConfig, get_peft_model

    model, tokenizer = tiny_target
    rows = synthetic["retain90"][:6]
    qs, ans = [r["question"] for r in rows], [r["answer"] for r in rows]
    base_nll = answer_nll(model, tokenizer, qs, ans, batch_size=6)
    torch.manual_seed(0)
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["down_proj"], init_lora_weights=False))
    merged_nll = answer_nll(peft_model, tokenizer, qs, ans, batch_size=6)
    assert np.abs(merged_nll - base_nll).mean() > 0.2  # the random adapter really changes the model
    quantized = quantize_nf4(peft_model)
    assert not hasattr(quantized, "peft_config") or not quantized.peft_config
    assert np.abs(answer_nll(quantized, tokenizer, qs, ans, batch_size=6) - merged_nll).mean() < 0.1
    np.testing.assert_allclose(answer_nll(peft_model, tokenizer, qs, ans, batch_size=6), merged_nll, rtol=1e-5)


FORCE_AVX512BF16_ENV = "HF_UNLEARN_FORCE_AVX512BF16"
"""``1`` / ``0``: every test of this module sees bitsandbytes' ``has_avx512bf16`` forced on / off (CI runs the
module once with each, so the kernel path this CPU does not take is covered too); unset: the CPU's real flag."""


def _forced_avx512bf16() -> bool | None:
    value = os.environ.get(FORCE_AVX512BF16_ENV, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"{FORCE_AVX512BF16_ENV} must be 0 or 1, got {value!r}")
    return None if value == "" else value == "1"


@pytest.fixture(autouse=True)
def _avx512bf16_flag(monkeypatch):
    """Force the flag ``Linear4bit`` reads when it is built (``support_avx512bf16_for_cpu``), if asked to."""
    forced = _forced_avx512bf16()
    if forced is not None:
        import bitsandbytes.nn.modules as bnb_modules

        monkeypatch.setattr(bnb_modules, "has_avx512bf16", lambda: forced)
    return forced


def test_forced_avx512bf16_flag_reaches_linear4bit():
    import bitsandbytes as bnb
    import bitsandbytes.functional as functional

    forced = _forced_avx512bf16()
    want = bool(functional.has_avx512bf16()) if forced is None else forced
    assert bool(bnb.nn.Linear4bit(64, 32, bias=False).support_avx512bf16_for_cpu) == want


def _kernel_cases():
    import bitsandbytes.functional as functional

    real = bool(functional.has_avx512bf16())
    # (forced AVX512-BF16 flag, shapes). Accepted shapes run the packed kernel only where the CPU really has the
    # feature; refused shapes must never reach it, whatever the flag says.
    cases = [(False, "refused"), (False, "accepted"), (True, "refused")]
    if real:
        cases.append((True, "accepted"))
    forced = _forced_avx512bf16()
    return cases if forced is None else [case for case in cases if case[0] == forced]


@pytest.mark.parametrize(("avx512bf16", "shapes"), _kernel_cases())
def test_bnb_path_agrees_with_roundtrip_on_every_kernel_path(monkeypatch, avx512bf16, shapes):
    import bitsandbytes as bnb
    import bitsandbytes.nn.modules as bnb_modules

    monkeypatch.setattr(bnb_modules, "has_avx512bf16", lambda: avx512bf16)
    model = _tiny_llama(shapes)
    real = quantize_nf4(model, method="bnb")
    roundtrip = quantize_nf4(model, method="roundtrip")
    block = real.model.layers[0]
    layers = [block.mlp.up_proj, block.mlp.down_proj, block.self_attn.q_proj, block.self_attn.o_proj]
    for layer in layers:
        # refused shapes fall back to their own dequantized NF4 weights; accepted ones stay real Linear4bit
        assert isinstance(layer, bnb.nn.Linear4bit) == (shapes == "accepted"), (shapes, type(layer).__name__)
    reference = _logits(roundtrip)
    out = _logits(real)
    assert torch.isfinite(out).all()
    # same NF4 weights; only the matmul precision of the kernel differs (bf16 in the packed CPU kernel)
    assert (out - reference).abs().max() <= 0.02 * reference.abs().max() + 1e-4
    full = _logits(model)
    assert (reference - full).abs().max() > 1e-5  # quantization really happened


def test_bnb_path_refuses_a_quantized_model(monkeypatch):
    model = _tiny_llama("refused")
    real = quantize_nf4(model, method="bnb")
    with pytest.raises(ValueError, match="already quantized"):
        quantize_nf4(real)
    with pytest.raises(ValueError, match="method"):
        quantize_nf4(model, method="int3")


def test_nf4_copy_of_a_trainer_trained_model_runs_its_own_quantized_weights(tiny_target, synthetic, tmp_path):
    """A model trained by an SFTTrainer subclass carries an instance ``forward`` that calls the original's bound
    forward; the NF4 copy must still compute with its own quantized weights (it once gave the original's logits
    exactly, so every trainer-trained row's NF4 re-check measured the unquantized model)."""
    from hf_unlearn.run import fit_or_train, prepare_inputs

    model, tokenizer = tiny_target
    fresh = type(model)(model.config)
    fresh.load_state_dict(model.state_dict())
    result = fit_or_train(prepare_inputs("grad_diff", fresh, tokenizer, synthetic["forget10"][:8], synthetic["retain90"][:8], tmp_path, {"max_steps": 1, "learning_rate": 1e-5, "per_device_train_batch_size": 4}))
    trained = result.model
    quantized = quantize_nf4(trained)
    clean = type(model)(model.config)  # the same trained weights in a model no trainer has touched
    clean.load_state_dict(trained.state_dict())
    expected = quantize_nf4(clean.eval())
    ids = tokenizer(["Question: who?\nAnswer:"], return_tensors="pt")
    with torch.no_grad():
        got, want, unquantized = (m.eval()(**ids).logits for m in (quantized, expected, trained))
    assert (got - unquantized).abs().max() > 1e-3  # not the original's outputs
    torch.testing.assert_close(got, want)
