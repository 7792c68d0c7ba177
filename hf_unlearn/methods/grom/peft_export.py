"""Export of a GROM edit as a PEFT LoRA adapter.

A LoRA layer computes ``W x + (lora_alpha / r) B A x``. With ``lora_alpha = r`` the scaling is 1, so
factors with ``B @ A == P`` reproduce the edit ``W + P`` exactly. ``P = (w_f/s) D X_f^T A^{-1}`` has rank
at most ``min(s, d_in, d_out)``; its thin SVD ``P = U S V^T`` (float64) gives ``B = U_k S_k^{1/2}``,
``A = S_k^{1/2} V_k^T`` with ``k`` the numerical rank, or ``k = max_rank`` when that is smaller, in which
case the relative Frobenius error ``||P - B A||_F / ||P||_F = sqrt(sum_{j>k} S_j^2 / sum_j S_j^2)`` is
reported. All modules share one LoRA rank ``r`` (the largest ``k``); smaller factors are zero-padded,
which leaves ``B @ A`` unchanged.

:func:`save_adapter` writes the adapter through :mod:`hf_unlearn.safe_output` (a new folder is built beside
the target and swapped in when complete) and refuses non-finite factors before writing. It records the SHA-256
digest of every file it writes besides the metadata (``adapter_config.json``, ``adapter_model.safetensors``,
``grom_audit.safetensors``) under ``integrity`` in ``grom_metadata.json``; :func:`verify_integrity` checks them,
after confining every file name the metadata gives to the adapter folder (:func:`confined_file`). Those digests
live in the metadata itself, so they catch accidents and naive edits, not an attacker who rewrites the metadata
too: :func:`adapter_digest`, the SHA-256 of ``grom_metadata.json`` (and so, through its records, of every file),
is what a user pins when loading (``expected_sha256=``) and what a pushed model card records.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ADAPTER_WEIGHTS = "adapter_model.safetensors"
GROM_METADATA = "grom_metadata.json"
GROM_AUDIT = "grom_audit.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_FILES = (ADAPTER_CONFIG, ADAPTER_WEIGHTS, GROM_METADATA, GROM_AUDIT)
INTEGRITY_ALGORITHM = "sha256"


class AdapterIntegrityError(ValueError):
    """A saved GROM adapter whose files are not the ones it was saved with (edited, replaced or missing)."""


def file_digests(folder: Path, names: list[str]) -> dict[str, str]:
    """``{file name: SHA-256}`` of the files ``names`` in ``folder``."""
    from .provenance import file_sha256

    return {n: file_sha256(folder / n) for n in names}


def confined_file(folder: Path, name: Any, what: str, manifest: str = GROM_METADATA) -> Path:
    """``folder / name`` for a file name read from ``manifest``, refused (:class:`AdapterIntegrityError`) unless it
    is one plain name inside ``folder``: no ``..``, no absolute path, no separator, and no link that leads out of
    the folder (a Hub download's links into its cache's ``blobs`` folder are followed)."""
    plain = isinstance(name, str) and name not in ("", ".", "..") and not any(c in name for c in "/\\\0")
    if not plain:
        raise AdapterIntegrityError(
            f"{what}: {manifest} names the file {name!r}, which is not a plain file name inside the folder; the "
            "metadata was tampered with or damaged. Restore it from the saved artifact."
        )
    path = folder / name
    if path.is_symlink():
        root = folder.resolve()
        allowed = [root] + ([root.parents[1] / "blobs"] if root.parent.name == "snapshots" else [])
        target = path.resolve()
        if not any(target == r or r in target.parents for r in allowed):
            raise AdapterIntegrityError(
                f"{what}: {name} is a link to {target}, outside the folder; hf-unlearn reads an artifact's files "
                "only from inside its folder. Replace the link by the saved file."
            )
    return path


def adapter_digest(folder: str | os.PathLike, manifest: str = GROM_METADATA) -> str:
    """The digest that identifies a saved artifact: the SHA-256 of its ``manifest`` (a GROM adapter's
    ``grom_metadata.json``), which records the SHA-256 of each of its other files. Pin it when loading
    (``expected_sha256=``) to refuse an artifact whose files and metadata were both rewritten."""
    from .provenance import file_sha256

    return file_sha256(Path(folder) / manifest)


def check_pinned_digest(folder: Path, expected: str | None, what: str, manifest: str = GROM_METADATA) -> None:
    """Refuse (:class:`AdapterIntegrityError`) a folder whose :func:`adapter_digest` is not ``expected``
    (``None``: nothing pinned, nothing checked)."""
    if expected is None:
        return
    want = str(expected).strip().lower()
    if len(want) != 64 or any(c not in "0123456789abcdef" for c in want):
        raise ValueError(f"expected_sha256 must be a hex SHA-256 digest (64 characters), got {expected!r}.")
    path = confined_file(folder, manifest, what, manifest)
    if not path.is_file():
        raise AdapterIntegrityError(f"{what}: {manifest} is missing, so the pinned digest cannot be checked.")
    got = adapter_digest(folder, manifest)
    if got != want:
        raise AdapterIntegrityError(
            f"{what}: {manifest} has sha256 {got[:12]}, not the pinned {want[:12]}: these are not the files that "
            "were saved (or pushed) with that digest. Download the artifact again from a source you trust."
        )


def integrity_entry(folder: str | os.PathLike, manifest: str) -> dict[str, str] | None:
    """``{"manifest", "sha256"}``: the :func:`adapter_digest` of ``manifest`` in ``folder``, the entry a pushed
    model card carries as ``hf_unlearn_integrity`` (the digest to pass as ``expected_sha256=`` when loading);
    ``None`` when the folder holds no such manifest."""
    if not (Path(folder) / manifest).is_file():
        return None
    return {"manifest": manifest, "sha256": adapter_digest(folder, manifest)}


def grom_integrity_entry(folder: str | os.PathLike) -> dict[str, str] | None:
    """The :func:`integrity_entry` of a saved GROM adapter (its ``grom_metadata.json``)."""
    return integrity_entry(folder, GROM_METADATA)


def record_integrity(card: Any, folder: Path) -> dict[str, str] | None:
    """Put the :func:`grom_integrity_entry` of ``folder`` into the front matter of the model card ``card`` as
    ``hf_unlearn_integrity``; return it (``None`` when the folder holds no GROM metadata)."""
    entry = grom_integrity_entry(folder)
    if entry is not None:
        card.data.hf_unlearn_integrity = entry
    return entry


def verify_integrity(folder: Path, metadata: dict[str, Any], what: str,
                     required: tuple[str, ...] = (ADAPTER_CONFIG, ADAPTER_WEIGHTS)) -> None:
    """Refuse (:class:`AdapterIntegrityError`) a folder whose files differ from the digests ``metadata`` records.

    Every file listed under ``metadata["integrity"]["files"]`` must be a plain name inside the folder
    (:func:`confined_file`), exist and have its recorded SHA-256, and every name of ``required`` (the adapter
    files, and the audit the metadata names) must be listed. A metadata without an integrity record is refused too
    (nothing says the files are the saved ones).
    """
    record = metadata.get("integrity")
    if not isinstance(record, dict) or not isinstance(record.get("files"), dict) or not record["files"]:
        raise AdapterIntegrityError(
            f"{what}: {GROM_METADATA} records no file digests, so hf-unlearn cannot check that "
            f"{ADAPTER_WEIGHTS} is the saved edit. Refit and save it again with this hf-unlearn, or pass "
            "verify_integrity=False to load it unchecked."
        )
    if record.get("algorithm", INTEGRITY_ALGORITHM) != INTEGRITY_ALGORITHM:
        raise AdapterIntegrityError(f"{what}: unknown integrity algorithm {record.get('algorithm')!r} in {GROM_METADATA}.")
    unlisted = [n for n in required if n not in record["files"]]
    if unlisted:
        raise AdapterIntegrityError(
            f"{what}: {GROM_METADATA} records no digest for {', '.join(unlisted)}, which every saved adapter has; "
            "the metadata was edited. Restore it from the saved adapter."
        )
    from .provenance import file_sha256

    for name, want in sorted(record["files"].items()):
        path = confined_file(folder, name, what)
        if not path.is_file():
            raise AdapterIntegrityError(
                f"{what}: {name} is missing, but {GROM_METADATA} says it was saved with the adapter. Restore the "
                "file from the saved adapter (or download the repo again)."
            )
        got = file_sha256(path)
        if got != want:
            raise AdapterIntegrityError(
                f"{what}: {name} was modified after it was saved (sha256 {got[:12]} != recorded {str(want)[:12]}). "
                f"Its weights are not the fitted GROM edit; restore the saved file or refit with fit_grom."
            )


@dataclass
class LoraFactors:
    """``lora_A`` (``[k, d_in]``), ``lora_B`` (``[d_out, k]``), the rank ``k``, the relative Frobenius error
    ``||P - B A||_F / ||P||_F`` (float64 round-off when not truncated) and whether ``max_rank`` cut the rank."""

    lora_A: torch.Tensor
    lora_B: torch.Tensor
    rank: int
    relative_error: float
    truncated: bool


def lora_factors(delta: torch.Tensor, max_rank: int | None = None, rtol: float = 1e-10) -> LoraFactors:
    """Rank-``k`` factors of ``P`` from its float64 SVD (``k`` = numerical rank, capped by ``max_rank``)."""
    p = delta.to(torch.float64)
    u, s, vh = torch.linalg.svd(p, full_matrices=False)
    total = float((s**2).sum())
    rank = int((s > rtol * s[0]).sum()) if s.numel() and s[0] > 0 else 0
    rank = max(rank, 1)
    truncated = max_rank is not None and rank > max_rank
    if truncated:
        rank = max_rank
    tail = float((s[rank:] ** 2).sum())
    err = (tail / total) ** 0.5 if total > 0 else 0.0
    root = s[:rank].sqrt()
    return LoraFactors(
        lora_A=root[:, None] * vh[:rank], lora_B=u[:, :rank] * root[None, :], rank=rank, relative_error=err, truncated=truncated
    )


def lora_config(module_names: list[str], rank: int, base_model_name_or_path: str | None = None) -> Any:
    """``LoraConfig`` targeting exactly ``module_names`` with ``r = lora_alpha = rank`` (scaling 1), no dropout."""
    from peft import LoraConfig

    return LoraConfig(
        r=rank,
        lora_alpha=rank,
        target_modules=list(module_names),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=base_model_name_or_path,
        inference_mode=True,
    )


def adapter_state_dict(factors: dict[str, LoraFactors], rank: int, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """PEFT's saved-adapter key layout: ``base_model.model.<module>.lora_{A,B}.weight``, zero-padded to ``rank``."""
    out = {}
    for name, f in factors.items():
        a = torch.zeros(rank, f.lora_A.shape[1], dtype=torch.float64)
        b = torch.zeros(f.lora_B.shape[0], rank, dtype=torch.float64)
        a[: f.rank] = f.lora_A.cpu()
        b[:, : f.rank] = f.lora_B.cpu()
        out[f"base_model.model.{name}.lora_A.weight"] = a.to(dtype).contiguous()
        out[f"base_model.model.{name}.lora_B.weight"] = b.to(dtype).contiguous()
    return out


def _check_finite(tensors: dict[str, torch.Tensor], what: str) -> None:
    bad = [k for k, v in tensors.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        raise ValueError(
            f"Refusing to save a GROM {what} with non-finite values (NaN/inf) in {bad[:4]}: the solve diverged "
            "(e.g. non-finite keys from a model in half precision, or a huge suppression_margin). Nothing was written."
        )


def save_adapter(
    path: str | os.PathLike,
    config: Any,
    state_dict: dict[str, torch.Tensor],
    metadata: dict[str, Any],
    audit: dict[str, torch.Tensor] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``adapter_config.json``, ``adapter_model.safetensors``, ``grom_metadata.json`` (and, with ``audit``,
    ``grom_audit.safetensors``) into the folder ``path``; the metadata gets an ``integrity`` record with the
    SHA-256 of each other file.

    Non-finite factors or audit tensors are refused before anything is written. A missing or empty ``path`` is
    built as a whole beside it and swapped in when complete (:func:`hf_unlearn.safe_output.atomic_directory`).
    A folder holding other files (e.g. the CLI's run folder with its logs) keeps them: the adapter files are
    written into a temporary subfolder first and then renamed into place one by one (each rename is atomic); a
    folder that already holds adapter files is refused unless ``overwrite``, and then stale adapter files (an
    audit file the new save does not write) are removed.
    """
    import shutil
    import tempfile

    from safetensors.torch import save_file

    from ...safe_output import OutputDirError, atomic_directory, atomic_write_json, output_lock

    _check_finite(state_dict, "adapter")
    if audit is not None:
        _check_finite(audit, "audit state")

    def write(folder: Path) -> None:
        config.save_pretrained(str(folder))
        save_file(state_dict, str(folder / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        written = [ADAPTER_CONFIG, ADAPTER_WEIGHTS]
        if audit is not None:
            save_file({k: v.contiguous() for k, v in audit.items()}, str(folder / GROM_AUDIT), metadata={"format": "pt"})
            written.append(GROM_AUDIT)
        record = {"algorithm": INTEGRITY_ALGORITHM, "files": file_digests(folder, written)}
        atomic_write_json(folder / GROM_METADATA, {**metadata, "integrity": record})

    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputDirError(f"Output path {path} exists and is not a folder.")
    if not path.exists() or not any(path.iterdir()):
        with atomic_directory(path, overwrite=True) as tmp:
            write(tmp)
        return path
    clash = sorted(n for n in ADAPTER_FILES if (path / n).exists())
    if clash and not overwrite:
        raise OutputDirError(
            f"{path} already holds an adapter ({', '.join(clash)}); pass overwrite=True to replace it."
        )
    with output_lock(path):  # no other process writes into the folder while the files are renamed in
        tmp = Path(tempfile.mkdtemp(prefix=".grom-adapter.tmp-", dir=path))
        try:
            write(tmp)
            written = {p.name for p in tmp.iterdir()}
            for name in ADAPTER_FILES:
                if name not in written and (path / name).exists():
                    (path / name).unlink()
            for name in sorted(written):
                os.replace(tmp / name, path / name)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def to_peft_model(model: Any, config: Any, state_dict: dict[str, torch.Tensor]) -> Any:
    """Wrap ``model`` (in place, as ``get_peft_model`` does) in a ``PeftModel`` carrying the factors."""
    from peft import get_peft_model, set_peft_model_state_dict

    peft_model = get_peft_model(model, config)
    device = next(model.parameters()).device
    result = set_peft_model_state_dict(peft_model, {k: v.to(device) for k, v in state_dict.items()})
    unexpected = getattr(result, "unexpected_keys", None) or []
    if unexpected:
        raise RuntimeError(f"PEFT did not accept the GROM factors: unexpected keys {unexpected[:4]}")
    peft_model.eval()
    return peft_model
