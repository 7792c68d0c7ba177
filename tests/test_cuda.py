"""CUDA paths (``pytest -m cuda`` on a GPU machine; deselected by default and skipped without a GPU): MASC logs
its violation rate beside the CUDA losses, and GROM fits on a CUDA model the edit it fits on the CPU."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_masc_logs_on_cuda(tiny_target, synthetic, tmp_path):
    from hf_unlearn.methods.masc import MASCConfig, MASCTrainer

    model, tok = tiny_target
    args = MASCConfig(
        output_dir=str(tmp_path / "masc"), report_to="none", save_strategy="no", gradient_checkpointing=False,
        disable_tqdm=True, logging_steps=1, seed=0, recipe="llama2-7b", learning_rate=1e-3,
        per_device_train_batch_size=4, use_peft=False, forget_weight=1.0, retain_weight=0.0,
        continuation_min_prefix_tokens=4, continuation_min_suffix_tokens=4, check_every=1, max_steps=3,
    )
    trainer = MASCTrainer(model, args, train_dataset=synthetic["forget10"], processing_class=tok)
    assert trainer.args.device.type == "cuda"
    with pytest.warns(UserWarning, match="step budget"):
        trainer.train()
    assert next(trainer.model.parameters()).device.type == "cuda"
    logged = [h for h in trainer.state.log_history if "masc/violation_rate" in h]
    assert logged and all(0.0 <= h["masc/violation_rate"] <= 1.0 for h in logged)
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in trainer.state.log_history if "loss" in h)


def test_grom_fits_on_cuda_as_on_cpu(tiny_pair, synthetic):
    from hf_unlearn.demo import load_tiny
    from hf_unlearn.methods.grom import GROMConfig, fit_grom

    forget, retain = synthetic["forget10"][:4], synthetic["retain90"][:40]
    config = GROMConfig(target_modules="lm_head", max_rank=3, progress=False)
    cpu_model, tok = load_tiny(tiny_pair.target)
    on_cpu = fit_grom(cpu_model, tok, forget, retain, config)
    gpu_model, tok = load_tiny(tiny_pair.target)
    on_gpu = fit_grom(gpu_model.to("cuda"), tok, forget, retain, config)
    assert set(on_gpu.deltas) == set(on_cpu.deltas)
    for name, delta in on_cpu.deltas.items():
        got = on_gpu.deltas[name].detach().double().cpu()
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, delta.detach().double().cpu(), rtol=1e-3, atol=1e-4 * float(delta.abs().max()))
