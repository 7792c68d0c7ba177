"""The device rule of every entry point: :func:`resolve_device` turns ``device=`` / ``--device`` into a device name
(``None`` / ``"auto"``: ``cuda:<LOCAL_RANK>`` under a launch, else CUDA when available, else the CPU; CUDA asked
for without it is refused before any work). Also the launch helpers of the closed-form fits."""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from .locking import _world_size

__all__ = ["AUTO", "DEVICE_HELP", "device_of", "join_launch", "move_to_device",
           "on_main_process", "resolve_device"]

#: The default of ``--device``: CUDA when available, else the CPU.
AUTO = "auto"

DEVICE_HELP = ("where the model runs: auto (default: CUDA when available, else the CPU), cpu, cuda or cuda:N; "
               "recorded in the results")


def resolve_device(device: Any = None) -> str:
    """The device name ``device`` asks for; ``ValueError`` (one line) for CUDA without CUDA, a GPU index the
    machine lacks, or another kind of device."""
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
    """The device of ``model``'s first parameter as a name (``"cpu"`` without parameters)."""
    try:
        return str(next(model.parameters()).device)
    except (AttributeError, StopIteration, TypeError):
        return "cpu"


def move_to_device(model: Any, device: Any = None) -> str:
    """Move ``model`` to the resolved ``device`` when it is elsewhere (``None``: leave it); returns the
    device's name."""
    if device is None:
        return device_of(model)
    import torch

    name = resolve_device(device)
    want, have = torch.device(name), torch.device(device_of(model))
    if want.type == have.type == "cuda" and want.index is None:
        want = torch.device("cuda", torch.cuda.current_device())
    if want != have:
        model.to(name)
    return name


#: How long a process of a launch waits in a collective: rank 0 fits T3's head alone while the others wait in
#: the broadcast of its result, which takes longer than torch's default timeout on a large model.
LAUNCH_TIMEOUT = timedelta(hours=2)


def join_launch() -> bool:
    """Join the process group of a multi-process launch when none is initialised yet; returns whether this
    process is in a group of more than one."""
    import torch.distributed as dist

    if not dist.is_available():
        return False
    if not dist.is_initialized():
        if _world_size() == 1:
            return False
        from accelerate import PartialState

        PartialState(timeout=LAUNCH_TIMEOUT)
    return dist.get_world_size() > 1


def on_main_process(compute: Callable[[], Any]) -> Any:
    """``compute()`` on rank 0 alone, its result broadcast to every process; an error on rank 0 is raised on
    every process (a ``ValueError`` as one, else ``RuntimeError``)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return compute()
    error: BaseException | None = None
    payload: Any = None
    if dist.get_rank() == 0:
        try:
            payload = ("ok", compute())
        except Exception as err:  # shared with the other ranks, then raised here as it was
            error = err
            payload = ("error", type(err).__name__, str(err))
    box = [payload]
    dist.broadcast_object_list(box, src=0)
    if error is not None:
        raise error
    if box[0][0] == "error":
        _, kind, message = box[0]
        raise (ValueError if kind == "ValueError" else RuntimeError)(f"{message} (raised on rank 0)")
    return box[0][1]
