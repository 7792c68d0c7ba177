"""The closed-form fits on the user's device: ``fit_grom`` / ``fit_grom_path`` / ``fit_t3`` / ``calibrate_t3``
take ``device=`` (CUDA monkeypatched as available: the model is asked for the chosen device; without CUDA a CUDA
device is refused before any forward pass), GROM's ``gram_device`` and float32 Gram blocks, T3's ``cache_device``
and MASC's violation rate on the device keep the numbers, and under ``torchrun`` (2 gloo processes, no process
group started by the caller) GROM equals the one-process fit and T3 hands every rank rank 0's head."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import fake_cuda

from hf_unlearn.methods.grom import GROMConfig, fit_grom
from hf_unlearn.methods.t3 import T3ClassifierConfig, fit_t3

GROM = {"target_modules": ["down_proj", "lm_head"], "layers": "auto", "progress": False, "batch_size": 4}
T3 = {"layer": 1, "epochs": 2, "batch_size": 4, "forget_batch_size": 2}


def _rows(synthetic):
    return synthetic["forget10"][:6], synthetic["retain90"][:24]


def test_fits_ask_the_model_for_the_chosen_device(tiny_target, synthetic, monkeypatch, moves):
    from hf_unlearn.methods.grom import fit_grom_path

    fake_cuda(monkeypatch, True)
    model, tok = tiny_target
    forget, retain = _rows(synthetic)
    fit_grom(model, tok, forget, retain, GROMConfig(**GROM), device="auto")
    assert moves[:1] == ["cuda"], moves
    moves.clear()
    fit_grom_path(model, tok, forget, retain, GROMConfig(**GROM), scales=(1.0,), device="cuda:0")
    assert moves[:1] == ["cuda:0"], moves
    moves.clear()
    fit_t3(model, tok, forget, retain, T3ClassifierConfig(**T3), progress=False, device="cuda")
    assert moves[:1] == ["cuda"], moves
    moves.clear()
    fit_grom(model, tok, forget, retain, GROMConfig(**GROM))  # default: where the model is
    assert not [d for d in moves if d.startswith("cuda")], moves


def test_calibrate_t3_moves_the_base_and_the_head(tiny_target, synthetic, monkeypatch, moves):
    from hf_unlearn.methods.t3 import calibrate_t3
    from hf_unlearn.selection import SelectionCriterion

    model, tok = tiny_target
    forget, retain = _rows(synthetic)
    head = fit_t3(model, tok, forget, retain, T3ClassifierConfig(**T3), progress=False)
    criterion = SelectionCriterion(forget, synthetic["holdout10"][:6], synthetic["retain90"][30:34])
    fake_cuda(monkeypatch, True)
    moves.clear()  # the fit placed its head
    calibrate_t3(model, tok, head, criterion, temperatures=(1.0,), tilt_weights=(0.5,), device="auto")
    assert moves[:2] == ["cuda", "cpu"], moves  # the base, then the head to the base's (unmoved) device


def test_cuda_without_cuda_is_refused_before_any_forward(tiny_target, synthetic, monkeypatch):
    from hf_unlearn.methods.grom import fit_grom_path

    fake_cuda(monkeypatch, False)
    model, tok = tiny_target
    forget, retain = _rows(synthetic)

    def forward(*args, **kwargs):
        raise AssertionError("the model ran although the device was refused")

    monkeypatch.setattr(model, "forward", forward)
    for fit in (lambda: fit_grom(model, tok, forget, retain, GROMConfig(**GROM), device="cuda"),
                lambda: fit_grom(model, tok, forget, retain, GROMConfig(**GROM), gram_device="cuda"),
                lambda: fit_grom_path(model, tok, forget, retain, GROMConfig(**GROM), device="cuda:0"),
                lambda: fit_t3(model, tok, forget, retain, T3ClassifierConfig(**T3), device="cuda"),
                lambda: fit_t3(model, tok, forget, retain, T3ClassifierConfig(**T3), cache_device="cuda")):
        with pytest.raises(ValueError, match="no CUDA GPU"):
            fit()


def test_grom_gram_options_keep_the_numbers(tiny_pair, synthetic, monkeypatch):
    """``gram_device="cpu"`` on a CPU model is the default computation; float32 Gram blocks (what a CUDA device
    forms) added to the float64 accumulator give the float64 edit within float32 rounding."""
    from hf_unlearn.demo import load_tiny
    from hf_unlearn.methods.grom import keys

    forget, retain = _rows(synthetic)
    config = GROMConfig(**GROM)
    model, tok = load_tiny(tiny_pair.target)
    plain = fit_grom(model, tok, forget, retain, config, generic_retain=synthetic["world_facts"][:4])
    host = fit_grom(model, tok, forget, retain, config, generic_retain=synthetic["world_facts"][:4],
                    gram_device="cpu")
    for name, delta in plain.deltas.items():
        assert torch.equal(host.deltas[name], delta), name
    monkeypatch.setattr(keys, "_gram_block_dtype", lambda device: torch.float32)
    blocks = fit_grom(model, tok, forget, retain, config, generic_retain=synthetic["world_facts"][:4])
    assert blocks.selected_layers == plain.selected_layers
    for name, delta in plain.deltas.items():
        torch.testing.assert_close(blocks.deltas[name], delta, rtol=1e-3, atol=1e-4 * float(delta.abs().max()))


def test_t3_cache_on_the_host_keeps_the_head(tiny_pair, synthetic):
    from hf_unlearn.demo import load_tiny

    forget, retain = _rows(synthetic)
    model, tok = load_tiny(tiny_pair.target)
    plain = fit_t3(model, tok, forget, retain, T3ClassifierConfig(**T3), progress=False)
    host = fit_t3(model, tok, forget, retain, T3ClassifierConfig(**T3), progress=False, cache_device="cpu")
    for (name, a), (_, b) in zip(plain.state_dict().items(), host.state_dict().items()):
        assert torch.equal(a, b), name
    assert plain.fit_report["heldout_bce_per_epoch"] == host.fit_report["heldout_bce_per_epoch"]


def test_masc_violation_rate_on_the_device_equals_the_counts():
    from hf_unlearn.methods.masc.loss import violation_rate_tensor

    torch.manual_seed(0)
    margins, mask = torch.randn(4, 9), torch.rand(4, 9) > 0.3
    violations, positions = int(((margins > 0.2) & mask).sum()), int(mask.sum())
    rate = violation_rate_tensor(margins, mask, 0.2)
    assert rate.dtype == torch.float64 and rate.item() == violations / positions
    assert violation_rate_tensor(margins, torch.zeros_like(mask), 0.2).item() == 0.0


WORKER = textwrap.dedent(
    """
    import sys
    import torch
    import torch.distributed as dist
    from safetensors.torch import save_file

    from hf_unlearn.demo import load_tiny
    from hf_unlearn.data import synthetic_tofu
    from hf_unlearn.methods.grom import GROMConfig, fit_grom
    from hf_unlearn.methods.t3 import T3ClassifierConfig, fit_t3

    torch.set_num_threads(1)
    model, tok = load_tiny(sys.argv[1])
    data = synthetic_tofu()
    forget, retain = data["forget10"][:6], data["retain90"][:24]
    edit = fit_grom(model, tok, forget, retain, GROMConfig(**{grom}))  # joins the launch's group itself
    assert dist.is_initialized() and edit.stats["processes"] == 2
    head = fit_t3(model, tok, forget, retain, T3ClassifierConfig(**{t3}), progress=False)
    out = {{f"delta/{{k}}": v.contiguous() for k, v in edit.deltas.items()}}
    out.update({{f"head/{{k}}": v.contiguous() for k, v in head.state_dict().items()}})
    save_file(out, f"{{sys.argv[2]}}.{{dist.get_rank()}}")
    dist.barrier()
    dist.destroy_process_group()
    """
)


def test_two_processes_fit_grom_and_t3_as_one(tiny_pair, synthetic, tmp_path):
    from safetensors.torch import load_file

    from hf_unlearn.demo import load_tiny

    worker = tmp_path / "worker.py"
    worker.write_text(WORKER.format(grom=repr(GROM), t3=repr(T3)))
    result = tmp_path / "fit"
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [str(torchrun), "--standalone", "--nproc_per_node", "2", str(worker), str(tiny_pair.target), str(result)],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [load_file(f"{result}.{rank}") for rank in (0, 1)]
    model, tok = load_tiny(tiny_pair.target)
    forget, retain = _rows(synthetic)
    one = fit_grom(model, tok, forget, retain, GROMConfig(**GROM))
    for name, delta in one.deltas.items():
        torch.testing.assert_close(ranks[0][f"delta/{name}"], delta, rtol=1e-4, atol=1e-6 * float(delta.abs().max()))
    head = fit_t3(model, tok, forget, retain, T3ClassifierConfig(**T3), progress=False)
    for name, value in head.state_dict().items():
        assert torch.equal(ranks[0][f"head/{name}"], ranks[1][f"head/{name}"]), name  # rank 0's head on both
        torch.testing.assert_close(ranks[0][f"head/{name}"], value)


@pytest.mark.parametrize("gram_device", [None, "cpu"])
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_grom_fits_on_cuda_with_float32_blocks_as_on_cpu(tiny_pair, synthetic, gram_device):
    from hf_unlearn.demo import load_tiny

    forget, retain = _rows(synthetic)
    cpu_model, tok = load_tiny(tiny_pair.target)
    on_cpu = fit_grom(cpu_model, tok, forget, retain, GROMConfig(**GROM))
    gpu_model, _ = load_tiny(tiny_pair.target)
    on_gpu = fit_grom(gpu_model, tok, forget, retain, GROMConfig(**GROM), device="cuda", gram_device=gram_device)
    assert next(gpu_model.parameters()).device.type == "cuda" and on_gpu.selected_layers == on_cpu.selected_layers
    for name, delta in on_cpu.deltas.items():
        torch.testing.assert_close(on_gpu.deltas[name], delta, rtol=1e-3, atol=1e-4 * float(delta.abs().max()))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_t3_fits_on_cuda_with_the_cache_on_the_host(tiny_pair, synthetic):
    from hf_unlearn.demo import load_tiny

    forget, retain = _rows(synthetic)
    model, tok = load_tiny(tiny_pair.target)
    on_gpu = fit_t3(model, tok, forget, retain, T3ClassifierConfig(**T3), progress=False, device="cuda")
    host = fit_t3(model, tok, forget, retain, T3ClassifierConfig(**T3), progress=False, cache_device="cpu")
    assert next(host.parameters()).device.type == "cuda"
    for a, b in zip(on_gpu.state_dict().values(), host.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
