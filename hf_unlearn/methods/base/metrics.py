"""The scalars an unlearning trainer logs beside the loss, recorded per step on the accelerator's device."""

from __future__ import annotations

import torch

__all__ = ["scalar_on_device"]


def scalar_on_device(value: torch.Tensor | float, device: torch.device | str) -> torch.Tensor:
    """A logged value as a detached 0-d float32 tensor on ``device``, so that one step's values stack on one
    device and recording one forces no host sync."""
    if torch.is_tensor(value):
        return value.detach().float().reshape(()).to(device)
    return torch.tensor(float(value), dtype=torch.float32, device=device)
