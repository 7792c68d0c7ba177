"""Whether bfloat16 autocast is native on this machine, and the resolution of a recipe's ``bf16_autocast="auto"``.

On a CPU without bfloat16 instructions ``torch.autocast("cpu", dtype=torch.bfloat16)`` is emulated and far slower
than float32: a SmolLM2-135M forward + backward on 16 TOFU rows took 418 s under bf16 autocast against 19.4 s in
float32 on a 2-core AVX2 CPU. Native bfloat16 on x86 means the ``avx512_bf16`` or ``amx_bf16`` CPU flags; a CUDA
device counts when ``torch.cuda.is_bf16_supported()``.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch

CPU_BF16_ENV = "HF_UNLEARN_CPU_BF16"
"""Environment override of :func:`cpu_has_native_bf16`: ``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off``."""

NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
"""x86 CPU flags (as ``/proc/cpuinfo`` names them) that make bfloat16 matrix products native."""

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def cpuinfo_flags(path: str | os.PathLike = "/proc/cpuinfo") -> set[str] | None:
    """The union of the ``flags`` lines of a Linux ``/proc/cpuinfo``; ``None`` when it cannot be read or has none."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    flags: set[str] = set()
    found = False
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            found = True
            flags.update(value.split())
    return flags if found else None


def detect_native_bf16(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> bool:
    """The detection behind :func:`cpu_has_native_bf16` (no override): any of :data:`NATIVE_BF16_FLAGS` among the
    ``flags`` of ``cpuinfo``; without a readable ``flags`` line (not Linux) torch's CPU feature probe, where this
    torch build has one; ``False`` when neither answers."""
    flags = cpuinfo_flags(cpuinfo)
    if flags is not None:
        return any(flag in flags for flag in NATIVE_BF16_FLAGS)
    probes = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    try:
        return any(bool(probe()) for probe in probes if probe is not None)
    except Exception:  # a probe this build cannot run: unknown, so not native
        return False


@functools.lru_cache(maxsize=1)
def _detected_native_bf16() -> bool:
    return detect_native_bf16()


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (flags ``avx512_bf16`` or ``amx_bf16``); ``False`` when unknown.

    ``$HF_UNLEARN_CPU_BF16`` (``1``/``0``, read at call time) overrides the detection. Otherwise the flags of
    ``/proc/cpuinfo`` decide on Linux, and torch's CPU feature probe (``torch.cpu._is_avx512_bf16_supported``,
    ``_is_amx_tile_supported``) elsewhere.
    """
    override = os.environ.get(CPU_BF16_ENV, "").strip().lower()
    if override in _TRUE:
        return True
    if override in _FALSE:
        return False
    if override:
        raise ValueError(f"${CPU_BF16_ENV} must be one of {_TRUE + _FALSE}, got {override!r}.")
    return _detected_native_bf16()


def resolve_bf16_autocast(setting: bool | str, device: str | torch.device = "cpu") -> bool:
    """A recipe's ``bf16_autocast`` as a bool: ``True``/``False`` as given; ``"auto"``: bfloat16 autocast only where
    it is native on ``device`` (a CPU: :func:`cpu_has_native_bf16`; a CUDA device: ``torch.cuda.is_bf16_supported()``).
    """
    if isinstance(setting, bool):
        return setting
    if setting != "auto":
        raise ValueError(f"bf16_autocast must be True, False or 'auto', got {setting!r}.")
    kind = torch.device(device).type
    if kind == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if kind == "cpu":
        return cpu_has_native_bf16()
    return False


def bf16_is_native() -> bool:
    """Whether bf16 is native where this process computes: the CUDA device when one is available, else the CPU
    (:func:`resolve_bf16_autocast` of ``"auto"`` on that device)."""
    return resolve_bf16_autocast("auto", "cuda" if torch.cuda.is_available() else "cpu")


def default_eval_autocast() -> str | None:
    """``bench --subject``'s evaluation autocast when ``--eval-autocast`` is not given: ``"bfloat16"`` where bf16 is
    native (:func:`bf16_is_native`: emulated bf16 autocast is many times slower than float32), else ``None``."""
    return "bfloat16" if bf16_is_native() else None
