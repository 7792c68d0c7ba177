"""Publishing an unlearned artifact: :func:`push_unlearned` saves it (weights + config + card + report) to a
temporary folder and uploads it with :func:`hf_unlearn.hub.push.push_folder` in ONE commit; it refuses, before
anything is uploaded, a missing token, a report computed for another base model or forget split, and an artifact
that writes pickle files."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..artifact_kinds import ArtifactKind, _kind, detect_artifact_kind, read_json
from ..result import Unlearned
from .cards import build_model_card
from .push import _check_repo_id, _resolve_token, push_folder
from .reports import _load_report, _report_value, check_report_matches, report_dict

_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


def _save_artifact(artifact: Any, folder: Path) -> None:
    if isinstance(artifact, (str, os.PathLike)):
        src = Path(artifact)
        for path in src.rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.name != "README.md":
                (folder / path.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, folder / path.relative_to(src))
    else:
        artifact.save_pretrained(str(folder))
    pickled = [p.name for p in folder.rglob("*") if p.suffix in _PICKLE_SUFFIXES]
    if pickled:
        raise ValueError(f"Refusing to push pickle files {pickled}: hf-unlearn publishes safetensors only.")
    if not any(p.suffix == ".safetensors" for p in folder.rglob("*")):
        raise ValueError(f"The artifact wrote no .safetensors weights to {folder}; nothing to push.")


def push_unlearned(
    artifact: Any, repo_id: str, report: Mapping[str, Any] | str | os.PathLike | None = None,
    token: str | None = None, private: bool | None = None, *, kind: str | None = None,
    method: str | None = None, settings: Mapping[str, Any] | None = None, forget_split: str | None = None,
    dataset: str | None = None, base_model: str | None = None, quantization: Mapping[str, Any] | None = None,
    tokenizer: Any = None, license: str | None = None, commit_message: str | None = None,
    endpoint: str | None = None, selection: Mapping[str, Any] | None = None,
):
    """Push an unlearned artifact (an :class:`~hf_unlearn.result.Unlearned`, an artifact of a registered kind, a
    trainer's model or adapter, or a saved folder) with its model card, report and selection record to the Hub in
    one commit; return the ``CommitInfo``. Refused before anything is uploaded: no token, a report for another
    base model (``base_model`` or the artifact's) or forget split, a report lacking the card metrics, a card
    template missing a field, an artifact saving pickle files.
    """
    _check_repo_id(repo_id)
    token = _resolve_token(token)
    if isinstance(artifact, Unlearned):
        method = method or artifact.method
        settings = dict(artifact.settings) if settings is None else settings
        selection = selection if selection is not None else artifact.info.get("selection")
        artifact = artifact.artifact
    kind = kind or detect_artifact_kind(artifact)
    spec = _kind(kind)
    report = _load_report(report)
    is_folder = isinstance(artifact, (str, os.PathLike))
    recorded = _folder_base(Path(artifact)) if is_folder else spec.base_model(artifact)
    card_base = base_model or recorded
    if not card_base:
        raise ValueError(f"Cannot tell which base model this {kind} was made from; pass base_model=.")
    if forget_split is None and report is not None:
        forget_split = _report_value(report, "forget_split")
    own_names = (artifact,) if is_folder else (  # the folder it was saved to / loaded from
        getattr(artifact, "name_or_path", None), getattr(getattr(artifact, "config", None), "_name_or_path", None))
    aliases = tuple(str(m) for m in (recorded, *own_names) if m)
    if report is not None:
        check_report_matches(report, card_base, forget_split, aliases=aliases)
    if settings is None:
        settings = {} if is_folder else dict(spec.settings(artifact))
    if selection is None:
        from ..selection import selection_record_of

        selection = selection_record_of(artifact)
    library = "peft" if is_folder and (Path(artifact) / "adapter_config.json").is_file() else None
    library = library or spec.library_for(None if is_folder else artifact)
    card = build_model_card(
        kind, card_base, method, settings, report, forget_split=forget_split, dataset=dataset,
        quantization=quantization, repo_id=repo_id, library_name=library, license=license,
        base_model_aliases=aliases, selection=selection,
    )
    message = commit_message or f"Upload {kind} ({card.data.tags[1]}, forgot {forget_split})"
    return _upload(artifact, spec, card, repo_id, selection=selection, tokenizer=tokenizer, report=report,
                   token=token, endpoint=endpoint, private=private, commit_message=message)


def _upload(artifact: Any, spec: ArtifactKind, card: Any, repo_id: str, *, selection: Mapping[str, Any] | None,
            tokenizer: Any, report: Any, token: str, endpoint: str | None, private: bool | None,
            commit_message: str) -> Any:
    """Write the artifact (safetensors only), its integrity pin in the card (``hf_unlearn_integrity``, what
    ``expected_sha256=`` pins when loading), the selection record, the tokenizer and the report into a temporary
    folder, and push it as one commit."""
    with tempfile.TemporaryDirectory(prefix="hf-unlearn-push-") as tmp:
        folder = Path(tmp)
        _save_artifact(artifact, folder)
        integrity = spec.integrity(folder)  # {manifest, sha256} of the artifact's integrity record, if it has one
        if integrity is not None:
            card.data.hf_unlearn_integrity = integrity
        if selection is not None:
            (folder / "selection_record.json").write_text(json.dumps(selection, indent=2, default=str))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(folder))
        if report is not None:
            (folder / "unlearning_report.json").write_text(json.dumps(report_dict(report), indent=2, default=str))
        return push_folder(
            folder, repo_id, card=card, token=token, endpoint=endpoint, private=private, commit_message=commit_message
        )


def _folder_base(folder: Path) -> str | None:
    for name, keys in (("adapter_config.json", ("base_model_name_or_path",)),
                       ("config.json", ("base_model_name_or_path", "base_model", "_name_or_path"))):
        data = read_json(folder / name)
        for key in keys:
            if data.get(key):
                return str(data[key])
    return None
