"""The device rule of every entry point: :func:`resolve_device` turns ``device=`` / ``--device`` into a device
name, and :func:`device_of` reads the device a model is on (what results and reports record).

``None`` or ``"auto"`` is CUDA when ``torch.cuda.is_available()``, else the CPU; under a launch
(``torchrun`` / ``accelerate launch`` set ``LOCAL_RANK``) it is that process's own GPU, ``cuda:<LOCAL_RANK>``,
so that no process loads its model onto another's GPU. An explicit ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` is
kept; a CUDA device asked for on a machine without CUDA (or a GPU index it does not have) is refused with a
``ValueError`` before any work. This module imports nothing of ``hf_unlearn`` (torch only when called).
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["AUTO", "DEVICE_HELP", "device_of", "resolve_device"]

#: The default of ``--device``: CUDA when available, else the CPU.
AUTO = "auto"

DEVICE_HELP = ("where the model runs: auto (default: CUDA when available, else the CPU), cpu, cuda or cuda:N; "
               "recorded in the results")


def resolve_device(device: Any = None) -> str:
    """The device name that ``device`` asks for: ``None`` / ``"auto"`` -> ``"cuda"`` when
    ``torch.cuda.is_available()`` (``"cuda:<LOCAL_RANK>"`` under a launch) else ``"cpu"``; ``"cpu"``, ``"cuda"``,
    ``"cuda:N"`` (or a ``torch.device``) kept as they are written.

    Raises:
        ValueError: a CUDA device without CUDA, a GPU index the machine does not have, or another kind of
            device (one line naming the value and the choices).
    """
    import torch

    if device is None or (isinstance(device, str) and device.strip().lower() == AUTO):
        if not torch.cuda.is_available():
            return "cpu"
        rank = os.environ.get("LOCAL_RANK", "")
        return f"cuda:{int(rank)}" if rank.isdigit() else "cuda"
    name = str(device).strip().lower()
    try:
        parsed = torch.device(name)
    except (RuntimeError, ValueError):
        parsed = None
    if parsed is None or parsed.type not in ("cpu", "cuda"):
        raise ValueError(f"Unknown device {device!r}: use auto, cpu, cuda or cuda:N.")
    if parsed.type == "cpu":
        return "cpu"
    if not torch.cuda.is_available():
        raise ValueError(f"Device {device!r} asks for CUDA, but torch finds no CUDA GPU on this machine; use "
                         "--device cpu (device='cpu') or auto.")
    if parsed.index is not None and parsed.index >= torch.cuda.device_count():
        raise ValueError(f"Device {device!r}: this machine has {torch.cuda.device_count()} CUDA GPU(s) "
                         f"(cuda:0 to cuda:{torch.cuda.device_count() - 1}).")
    return name


def device_of(model: Any) -> str:
    """The device of ``model``'s first parameter as a name (``"cpu"``, ``"cuda:0"``); ``"cpu"`` for an object
    without parameters."""
    try:
        return str(next(model.parameters()).device)
    except (AttributeError, StopIteration, TypeError):
        return "cpu"
