"""The one way hf-unlearn uploads to the Hub: :func:`push_folder` (a prepared folder and its card in ONE commit;
the repo id and the token are checked before anything is sent)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


def _resolve_token(token: str | None) -> str:
    from huggingface_hub import get_token

    token = token or get_token()
    if not token:
        raise ValueError(
            "No Hugging Face token: pass token=..., set HF_TOKEN, or run `hf auth login`. Nothing was uploaded."
        )
    return token


def _check_repo_id(repo_id: str) -> None:
    if not isinstance(repo_id, str) or not _HUB_ID.match(repo_id):
        raise ValueError(f"Invalid repo id {repo_id!r}: expected 'name' or 'owner/name'.")


def push_folder(
    folder: str | os.PathLike, repo_id: str, *, card: Any = None, token: str | None = None,
    endpoint: str | None = None, private: bool | None = None, revision: str | None = None,
    commit_message: str, repo_type: str = "model", space_sdk: str | None = None,
    ignore_patterns: Iterable[str] = (), run_as_future: bool = False,
) -> Any:
    """Create ``repo_id`` if needed and upload every file of ``folder`` (and ``card`` as ``README.md``) in one commit;
    return the ``huggingface_hub.CommitInfo`` (or its future with ``run_as_future``).

    ``card`` (a ``ModelCard`` or its text) replaces the folder's ``README.md``; ``token`` defaults to ``HF_TOKEN``
    or the saved login (without one nothing is sent); ``private`` applies to a repo this call creates;
    ``repo_type`` is ``"model"`` or ``"space"`` (with ``space_sdk``); ``ignore_patterns`` as
    ``HfApi.upload_folder``'s.
    """
    _check_repo_id(repo_id)
    token = _resolve_token(token)
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"Cannot push {folder}: it is not a folder.")
    from huggingface_hub import CommitOperationAdd, HfApi
    from huggingface_hub.utils import DEFAULT_IGNORE_PATTERNS, filter_repo_objects

    files = {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()}
    kept = filter_repo_objects(files, ignore_patterns=[*DEFAULT_IGNORE_PATTERNS, *ignore_patterns])
    if card is not None:
        kept = [name for name in kept if name != "README.md"]
    operations = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(files[name])) for name in kept]
    if card is not None:
        operations.append(CommitOperationAdd(path_in_repo="README.md", path_or_fileobj=str(card).encode("utf-8")))
    api = HfApi(endpoint=endpoint, token=token, library_name="hf-unlearn")
    url = api.create_repo(repo_id, private=private, repo_type=repo_type, space_sdk=space_sdk, exist_ok=True)
    return api.create_commit(
        url.repo_id, operations, commit_message=commit_message, repo_type=repo_type, revision=revision,
        run_as_future=run_as_future,
    )
