"""The files of a saved T3 head: ``t3_integrity.json`` records their SHA-256 at save time and
:func:`verify_head_files` checks them at load time."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ...integrity import (
    AdapterIntegrityError,
    check_pinned_digest,
    check_recorded_files,
    confined_file,
    digest_record,
    integrity_entry,
)

__all__ = ["T3_INTEGRITY", "head_files", "t3_integrity_entry", "verify_head_files", "write_head_integrity"]


T3_INTEGRITY = "t3_integrity.json"
INTEGRITY_FORMAT = "hf_unlearn.t3_integrity"


def t3_integrity_entry(folder: str | os.PathLike) -> dict[str, str] | None:
    """The ``{"manifest", "sha256"}`` entry a pushed card carries to pin a saved head (``None`` without one)."""
    return integrity_entry(folder, T3_INTEGRITY)


def head_files(folder: Path) -> list[str]:
    """``config.json`` and the safetensors weights (with their index) in ``folder``."""
    names = []
    for path in sorted(folder.iterdir()):
        name = path.name
        if name == "config.json" or (name.startswith("model") and ".safetensors" in name):
            names.append(name)
    return names


def write_head_integrity(folder: str | os.PathLike) -> Path:
    """Record the SHA-256 of every :func:`head_files` file of ``folder`` in ``t3_integrity.json`` (atomically)."""
    from ...safe_output import atomic_write_json

    folder = Path(folder)
    return atomic_write_json(folder / T3_INTEGRITY, {"format": INTEGRITY_FORMAT,
                                                     **digest_record(folder, head_files(folder))})


def verify_head_files(folder: Path, what: str, expected_sha256: str | None = None) -> None:
    """Refuse (``AdapterIntegrityError``) a head folder whose files ``t3_integrity.json`` does not record or
    match, or (``expected_sha256``) whose record is not the pinned one."""
    check_pinned_digest(folder, expected_sha256, what, T3_INTEGRITY)
    path = confined_file(folder, T3_INTEGRITY, what, T3_INTEGRITY)
    if not path.is_file():
        raise AdapterIntegrityError(f"{what}: there is no {T3_INTEGRITY} to check the head's files against; save it "
                                    "again, or pass verify_integrity=False to load it unchecked.")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise AdapterIntegrityError(f"{what}: {T3_INTEGRITY} cannot be read ({type(err).__name__}); restore the saved "
                                    "file.") from None
    check_recorded_files(folder, record, what, T3_INTEGRITY, on_disk=tuple(head_files(folder)),
                         fix="Restore the saved file or refit the head with fit_t3.")


_HUB_KEYS = ("revision", "token", "cache_dir", "local_files_only", "force_download")


def head_folder(name_or_path: str | os.PathLike, load_kwargs: dict[str, Any]) -> Path:
    """The head's local folder, or the Hub snapshot of its ``t3_integrity.json`` and the files it names."""
    subfolder = load_kwargs.get("subfolder") or None
    local = Path(name_or_path).expanduser()
    if local.is_dir():
        return local / subfolder if subfolder else local
    from huggingface_hub import hf_hub_download
    from huggingface_hub.utils import EntryNotFoundError

    what = f"The T3 head {name_or_path}"
    hub = {k: load_kwargs[k] for k in _HUB_KEYS if load_kwargs.get(k) is not None}

    def download(filename: str) -> Path:
        return Path(hf_hub_download(str(name_or_path), filename, subfolder=subfolder, **hub))

    try:
        manifest = download(T3_INTEGRITY)
    except EntryNotFoundError:
        raise AdapterIntegrityError(f"{what}: the repo has no {T3_INTEGRITY}, so hf-unlearn cannot check its files; "
                                    "push it again with this hf-unlearn, or pass verify_integrity=False.") from None
    folder = manifest.parent
    try:
        files = json.loads(manifest.read_text(encoding="utf-8")).get("files") or {}
    except (ValueError, AttributeError):
        files = {}
    for name in files if isinstance(files, dict) else ():
        confined_file(folder, name, what, T3_INTEGRITY)  # a plain name before it is asked for
        download(name)
    return folder
