"""Sharded runs: FSDP2's DTensor parameters are seen by every sharding guard, the reference reloaded under FSDP
does not spread over the GPUs, and a launch's process group waits long enough for rank 0's fits."""

from __future__ import annotations

import types

import pytest
import torch


@pytest.fixture()
def one_process_group(monkeypatch):
    import torch.distributed as dist

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29731")
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _sharded_tiny():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, vocab_size=40))
    mesh = init_device_mesh("cpu", (1,))
    head = model.lm_head
    head.weight = torch.nn.Parameter(DTensor.from_local(head.weight.detach(), mesh, [Shard(0)]))
    return model


def test_fsdp2_dtensor_parameters_are_partitioned(one_process_group):
    from hf_unlearn.partitioning import is_partitioned, vocab_size
    from hf_unlearn.selection.callback import SelectionCallback

    model = _sharded_tiny()
    assert is_partitioned(model) and vocab_size(model) == 40
    with pytest.raises(ValueError, match="FSDP"):
        SelectionCallback._check_not_sharded(types.SimpleNamespace(fsdp=""), model)


def test_selection_refused_under_an_accelerate_fsdp_launch(monkeypatch):
    from transformers import LlamaConfig, LlamaForCausalLM

    from hf_unlearn.selection.callback import SelectionCallback

    model = LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, vocab_size=40))
    SelectionCallback._check_not_sharded(types.SimpleNamespace(fsdp=""), model)  # one process: allowed
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(ValueError, match="FSDP"):
        SelectionCallback._check_not_sharded(types.SimpleNamespace(fsdp=""), model)


@pytest.mark.parametrize("kind,fsdp,expected", [("NO", True, None), ("FSDP", False, None), ("MULTI_GPU", False, None),
                                                ("NO", False, "kept")])
def test_reference_reload_under_fsdp_has_no_device_map(kind, fsdp, expected, monkeypatch):
    from hf_unlearn.methods.base import reference
    from hf_unlearn.methods.base.trainer import UnlearningTrainer

    seen = {}
    monkeypatch.setattr(reference, "create_model_from_path", lambda path, **kw: seen.update(kw) or "ref")
    trainer = types.SimpleNamespace(
        args=types.SimpleNamespace(model_init_kwargs={"device_map": "kept"},
                                   distributed_state=types.SimpleNamespace(distributed_type=kind)),
        is_fsdp_enabled=fsdp)
    live = types.SimpleNamespace(dtype=torch.float32)
    assert UnlearningTrainer._reload_reference(trainer, "folder", live, check=False) == "ref"
    assert seen["device_map"] == expected and seen["dtype"] is torch.float32


def test_join_launch_sets_a_long_process_group_timeout(monkeypatch):
    import accelerate
    import torch.distributed as dist

    from hf_unlearn import devices

    given = {}
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(devices, "_world_size", lambda: 2)
    monkeypatch.setattr(accelerate, "PartialState", lambda **kw: given.update(kw))
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    assert devices.join_launch()
    assert given["timeout"] == devices.LAUNCH_TIMEOUT and devices.LAUNCH_TIMEOUT.total_seconds() >= 3600
