"""The one way hf-unlearn uploads to the Hub: :func:`push_folder`.

Every artifact's publishing path prepares a folder (weights, config, report...) and a card, then calls
:func:`push_folder`, which uploads them in ONE commit: :func:`hf_unlearn.hub.push_unlearned` (and
``Unlearned.push_to_hub`` through it), ``GROMEdit.push_to_hub``, the unlearning trainers' ``push_to_hub`` and
:func:`hf_unlearn.hub.push_metric_space`. The repo id and the token are checked before anything is sent.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["push_folder"]

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


def _card_bytes(card: Any) -> bytes:
    """The text of a ``ModelCard`` / ``RepoCard`` (or a plain string) as UTF-8 bytes."""
    text = card if isinstance(card, str) else str(card)
    return text.encode("utf-8")


def push_folder(
    folder: str | os.PathLike, repo_id: str, *, card: Any = None, token: str | None = None,
    endpoint: str | None = None, private: bool | None = None, revision: str | None = None,
    commit_message: str, repo_type: str = "model", space_sdk: str | None = None,
    ignore_patterns: Iterable[str] = (), run_as_future: bool = False,
) -> Any:
    """Create ``repo_id`` if needed and upload every file of ``folder`` (and ``card`` as ``README.md``) in one commit.

    Args:
        folder: a prepared folder; its files keep their relative paths in the repo.
        repo_id: ``"name"`` or ``"owner/name"`` (checked before anything is sent).
        card: a ``huggingface_hub.ModelCard`` / ``RepoCard`` or the card's text; uploaded as ``README.md`` in
            place of any ``README.md`` in ``folder``. ``None``: the folder's own ``README.md``, if any.
        token: a Hub token (default: ``HF_TOKEN`` or the saved login); without one nothing is sent.
        endpoint: the Hub's URL (default: ``HF_ENDPOINT`` or huggingface.co).
        private: visibility of a repo this call creates (an existing repo keeps its own).
        revision: the branch to commit to (default: ``main``).
        commit_message: the commit's title.
        repo_type: ``"model"`` or ``"space"`` (then ``space_sdk``).
        ignore_patterns: ``fnmatch`` patterns of relative paths left out (besides ``.git`` and
            ``.cache/huggingface``), as ``huggingface_hub.HfApi.upload_folder``'s.
        run_as_future: return a ``concurrent.futures.Future`` of the commit instead of waiting for it.

    Returns:
        the ``huggingface_hub.CommitInfo`` (or its future).
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
        operations.append(CommitOperationAdd(path_in_repo="README.md", path_or_fileobj=_card_bytes(card)))
    api = HfApi(endpoint=endpoint, token=token, library_name="hf-unlearn")
    url = api.create_repo(repo_id, private=private, repo_type=repo_type, space_sdk=space_sdk, exist_ok=True)
    return api.create_commit(
        url.repo_id, operations, commit_message=commit_message, repo_type=repo_type, revision=revision,
        run_as_future=run_as_future,
    )
