"""GROM under torchrun: 2 CPU processes (gloo) over shards of the data give the 1-process edit."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from hf_unlearn.methods.grom import GROMConfig, fit_grom

WORKER = textwrap.dedent(
    """
    import sys
    import torch
    import torch.distributed as dist
    from safetensors.torch import save_file

    from hf_unlearn.data import synthetic_tofu
    from hf_unlearn.methods.grom import GROMConfig, fit_grom
    from hf_unlearn.demo import load_tiny

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    model, tok = load_tiny(sys.argv[1])
    data = synthetic_tofu()
    cfg = GROMConfig(target_modules=["down_proj", "lm_head"], layers="auto", progress=False, batch_size=4)
    edit = fit_grom(model, tok, data["forget10"][:6], data["retain90"][:24], cfg)
    assert edit.stats["processes"] == 2
    if dist.get_rank() == 0:
        out = {f"delta/{k}": v.contiguous() for k, v in edit.deltas.items()}
        out.update({f"influence/{k}": v.float().contiguous() for k, v in edit.influence(2).items()})
        out["layers"] = torch.tensor(edit.selected_layers)
        out["keys"] = torch.tensor([edit.stats["num_forget_keys"], edit.stats["num_retain_keys"]])
        save_file(out, sys.argv[2])
    dist.barrier()
    dist.destroy_process_group()
    """
)


def test_two_processes_equal_one(tiny_pair, tiny_target, synthetic, tmp_path):
    from safetensors.torch import load_file

    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    result_file = tmp_path / "two.safetensors"
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [str(torchrun), "--standalone", "--nproc_per_node", "2", str(worker), str(tiny_pair.target), str(result_file)],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    two = load_file(str(result_file))

    model, tok = tiny_target
    cfg = GROMConfig(target_modules=["down_proj", "lm_head"], layers="auto", progress=False, batch_size=4)
    one = fit_grom(model, tok, synthetic["forget10"][:6], synthetic["retain90"][:24], cfg)
    assert one.stats["processes"] == 1
    assert two["layers"].tolist() == one.selected_layers
    assert two["keys"].tolist() == [one.stats["num_forget_keys"], one.stats["num_retain_keys"]]
    for name, p in one.deltas.items():
        torch.testing.assert_close(two[f"delta/{name}"], p, rtol=1e-4, atol=1e-5)
    for name, p in one.influence(2).items():
        torch.testing.assert_close(two[f"influence/{name}"], p.float(), rtol=1e-4, atol=1e-5)
