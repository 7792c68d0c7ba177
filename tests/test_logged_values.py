"""Logged values land on one device, so a step's values stack on a GPU as on the CPU."""

from __future__ import annotations

import torch

from hf_unlearn.methods.base.losses import scalar_on_device


def test_floats_and_tensors_land_on_the_given_device():
    # "meta" stands in for an accelerator device: a value left on the CPU would keep device type "cpu".
    values = [scalar_on_device(0.25, "meta"), scalar_on_device(torch.tensor([1.5]), "meta"),
              scalar_on_device(torch.tensor(2, dtype=torch.int64), "meta")]
    assert all(v.device.type == "meta" and v.shape == () and v.dtype == torch.float32 for v in values)
    assert torch.stack(values).device.type == "meta"


def test_values_keep_their_number_and_drop_the_graph():
    x = torch.tensor(3.0, requires_grad=True)
    logged = scalar_on_device(x * 2, "cpu")
    assert not logged.requires_grad
    assert abs(float(logged) - 6.0) < 1e-6
    assert abs(float(scalar_on_device(0.125, "cpu")) - 0.125) < 1e-9
