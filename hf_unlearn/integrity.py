"""Integrity of saved artifacts and of the base model they belong to: file digests and weight fingerprints.

    digest(W)       = SHA-256(bytes of W in its own dtype, row-major)
    fingerprint(M)  = {name: (shape, dtype, digest(W))} for every name of named_parameters(remove_duplicate=False)

A model matches a fingerprint when it has exactly the recorded names, shapes, dtypes and digests. Digests are
cached per tensor state ``(data_ptr, _version, shape, stride, dtype, device)``: a change through ``param.data`` is
not seen. An artifact's manifest holds a :func:`digest_record` of its files; :func:`manifest_digest` (the manifest's
own SHA-256) is what a user pins (``expected_sha256=``) and a pushed card records."""

from __future__ import annotations

import hashlib
import os
import weakref
from pathlib import Path
from typing import Any

import torch

FINGERPRINT_VERSION = 2
FINGERPRINT_ALGORITHM = "sha256 of the stored bytes (own dtype) of every named parameter"
_HASH_CHUNK = 1 << 26  # elements copied to the host at a time


class BaseModelMismatchError(ValueError):
    """An artifact (an adapter, a decoding head) attached to a base model other than the one it was fitted on."""


class AdapterIntegrityError(ValueError):
    """A saved artifact whose files are not the ones it was saved with."""


# ----- weights ----------------------------------------------------------------------------------------------------


def tensor_sha256(tensor: torch.Tensor) -> str:
    """``SHA-256(bytes of tensor in its stored dtype)``, copied to the host in chunks."""
    digest = hashlib.sha256()
    flat = tensor.detach().reshape(-1)
    for start in range(0, flat.numel(), _HASH_CHUNK):
        block = flat[start:start + _HASH_CHUNK].to("cpu").contiguous()
        digest.update(memoryview(block.view(torch.uint8).numpy()))
    return digest.hexdigest()


# id(tensor) -> (weak reference to it, its state when hashed, digest)
_DIGESTS: dict[int, tuple[weakref.ref, tuple, str]] = {}


def _tensor_state(tensor: torch.Tensor) -> tuple:
    return (tensor.data_ptr(), tensor._version, tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype,
            str(tensor.device))


def _forget(key: int, ref: weakref.ref) -> None:
    if _DIGESTS.get(key, (None,))[0] is ref:
        del _DIGESTS[key]


def cached_tensor_sha256(tensor: torch.Tensor) -> str:
    """:func:`tensor_sha256`, computed once per tensor state while the tensor lives."""
    key, state = id(tensor), _tensor_state(tensor)
    entry = _DIGESTS.get(key)
    if entry is not None and entry[0]() is tensor and entry[1] == state:
        return entry[2]
    digest = tensor_sha256(tensor)
    try:
        ref = weakref.ref(tensor, lambda r, k=key: _forget(k, r))
    except TypeError:  # not weak-referenceable: not cached
        return digest
    _DIGESTS[key] = (ref, state, digest)
    return digest


def plain_model(model: Any) -> Any:
    """The transformers model under a ``PeftModel``."""
    if hasattr(model, "peft_config") and hasattr(model, "get_base_model"):
        return model.get_base_model()
    return model


def model_fingerprint(model: Any) -> dict[str, Any]:
    """``{"version", "algorithm", "parameters": {name: {"shape", "dtype", "sha256"}}}`` of ``model``."""
    params = {
        name: {"shape": list(p.shape), "dtype": str(p.dtype).removeprefix("torch."), "sha256": cached_tensor_sha256(p)}
        for name, p in plain_model(model).named_parameters(remove_duplicate=False)
    }
    return {"version": FINGERPRINT_VERSION, "algorithm": FINGERPRINT_ALGORITHM, "parameters": params}


def fingerprint_differences(recorded: dict[str, Any], model: Any) -> list[str]:
    """One line per parameter where ``model`` differs from the ``recorded`` fingerprint."""
    want = recorded["parameters"]
    got = model_fingerprint(model)["parameters"]
    problems = [f"{name}: missing" for name in want if name not in got]
    dtypes: dict[tuple[str, str], list[str]] = {}
    for name, have in got.items():
        if (need := want.get(name)) is None:
            problems.append(f"{name}: not in the base")
        elif list(have["shape"]) != list(need.get("shape", [])):
            problems.append(f"{name}: shape {have['shape']} != {need.get('shape')}")
        elif have["dtype"] != need.get("dtype"):
            dtypes.setdefault((have["dtype"], str(need.get("dtype"))), []).append(name)
        elif have["sha256"] != need.get("sha256"):
            problems.append(f"{name}: weights differ (sha256 {have['sha256'][:12]} != {str(need.get('sha256'))[:12]})")
    for (have, need), names in dtypes.items():
        problems.append(f"{names[0]}{f' and {len(names) - 1} more weights' if len(names) > 1 else ''}: dtype "
                        f"{have} != {need} (load the base in {need})")
    return problems


def check_model_fingerprint(recorded: dict[str, Any] | None, model: Any, what: str, fix: str) -> None:
    """Refuse (:class:`BaseModelMismatchError`) a ``model`` that does not match the ``recorded``
    fingerprint, or a missing or older-format fingerprint, naming up to four differences and ``fix``."""
    if (not isinstance(recorded, dict) or recorded.get("version") != FINGERPRINT_VERSION
            or not isinstance(recorded.get("parameters"), dict)):
        raise BaseModelMismatchError(f"{what} records no fingerprint of its base model's weights in this "
                                     "hf-unlearn's format, so hf-unlearn cannot check that it belongs to this "
                                     f"model. {fix}")
    if problems := fingerprint_differences(recorded, model):
        shown = "; ".join(problems[:4]) + (f"; and {len(problems) - 4} more" if len(problems) > 4 else "")
        raise BaseModelMismatchError(f"{what} was fitted on another base model ({shown}). {fix}")


# ----- files ------------------------------------------------------------------------------------------------------


def file_sha256(path: str | os.PathLike, chunk_size: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(chunk_size), b""):
            digest.update(block)
    return digest.hexdigest()


def confined_file(folder: Path, name: Any, what: str, manifest: str) -> Path:
    """``folder / name`` for a name read from ``manifest``, refused unless it is one plain name inside
    ``folder`` (no link out of it; a Hub download's links into its cache's ``blobs`` are followed)."""
    plain = isinstance(name, str) and name not in ("", ".", "..") and not any(c in name for c in "/\\\0")
    if not plain:
        raise AdapterIntegrityError(f"{what}: {manifest} names the file {name!r}, which is not a plain file name "
                                    "inside the folder; the metadata was tampered with or damaged. Restore it "
                                    "from the saved artifact.")
    path = folder / name
    if path.is_symlink():
        root = folder.resolve()
        allowed = [root] + ([root.parents[1] / "blobs"] if root.parent.name == "snapshots" else [])
        target = path.resolve()
        if not any(target == r or r in target.parents for r in allowed):
            raise AdapterIntegrityError(f"{what}: {name} is a link to {target}, outside the folder; hf-unlearn "
                                        "reads an artifact's files only from inside its folder. Replace the link "
                                        "by the saved file.")
    return path


def manifest_digest(folder: str | os.PathLike, manifest: str) -> str:
    """The SHA-256 of the artifact's ``manifest``, which records the SHA-256 of each of its other files."""
    return file_sha256(Path(folder) / manifest)


def check_pinned_digest(folder: Path, expected: str | None, what: str, manifest: str) -> None:
    """Refuse a folder whose :func:`manifest_digest` is not ``expected`` (``None``: not checked)."""
    if expected is None:
        return
    want = str(expected).strip().lower()
    if len(want) != 64 or any(c not in "0123456789abcdef" for c in want):
        raise ValueError(f"expected_sha256 must be a hex SHA-256 digest (64 characters), got {expected!r}.")
    path = confined_file(folder, manifest, what, manifest)
    if not path.is_file():
        raise AdapterIntegrityError(f"{what}: {manifest} is missing, so the pinned digest cannot be checked.")
    if (got := manifest_digest(folder, manifest)) != want:
        raise AdapterIntegrityError(f"{what}: {manifest} has sha256 {got[:12]}, not the pinned {want[:12]}: these "
                                    "are not the files that were saved (or pushed) with that digest. Download the "
                                    "artifact again from a source you trust.")


def integrity_entry(folder: str | os.PathLike, manifest: str) -> dict[str, str] | None:
    """``{"manifest", "sha256"}`` a pushed model card carries; ``None`` without such a manifest."""
    if not (Path(folder) / manifest).is_file():
        return None
    return {"manifest": manifest, "sha256": manifest_digest(folder, manifest)}


def digest_record(folder: str | os.PathLike, names: list[str]) -> dict[str, Any]:
    """``{"algorithm": "sha256", "files": {name: SHA-256}}`` of the files ``names`` in ``folder``."""
    return {"algorithm": "sha256", "files": {n: file_sha256(Path(folder) / n) for n in names}}


def check_recorded_files(folder: Path, record: Any, what: str, manifest: str, *, required: tuple[str, ...] = (),
                         on_disk: tuple[str, ...] = (), fix: str = "Restore the saved file.") -> None:
    """Refuse (:class:`AdapterIntegrityError`) a folder whose files differ from ``record``: no sha256
    digests, a ``required`` name or an ``on_disk`` file not listed, a listed name not a plain file inside ``folder``,
    a listed file missing or with another SHA-256."""
    files = record.get("files") if isinstance(record, dict) else None
    if not isinstance(files, dict) or not files or record.get("algorithm", "sha256") != "sha256":
        raise AdapterIntegrityError(f"{what}: {manifest} records no file digests (sha256), so hf-unlearn cannot "
                                    "check that the files are the saved ones. Save it again with this hf-unlearn, "
                                    "or pass verify_integrity=False to load it unchecked.")
    if unlisted := [n for n in required if n not in files]:
        raise AdapterIntegrityError(f"{what}: {manifest} records no digest for {', '.join(unlisted)}, which every "
                                    "saved artifact has; the manifest was edited. Restore it from the saved files.")
    if extra := [n for n in on_disk if n not in files]:
        raise AdapterIntegrityError(f"{what}: {', '.join(extra)} {'is' if len(extra) == 1 else 'are'} not recorded "
                                    f"in {manifest}: not a file it was saved with. Remove it or restore the saved files.")
    for name, want in sorted(files.items()):
        path = confined_file(folder, name, what, manifest)
        if not path.is_file():
            raise AdapterIntegrityError(f"{what}: {name} is missing, but {manifest} says it was saved with it. "
                                        "Restore the file (or download the artifact again).")
        if (got := file_sha256(path)) != want:
            raise AdapterIntegrityError(f"{what}: {name} was modified after it was saved (sha256 {got[:12]} != "
                                        f"recorded {str(want)[:12]}). {fix}")
