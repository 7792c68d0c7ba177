"""Artifact kinds: how each kind of unlearned artifact is carded, recognised and pinned (:data:`ARTIFACT_KINDS`).
The catch-all ``unlearned_model`` (any transformers or PEFT model) is defined here; a method with an artifact of
its own kind registers it with :func:`register_artifact_kind`."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .registry import method_names

__all__ = ["ARTIFACT_KINDS", "ArtifactKind", "config_base_model", "detect_artifact_kind", "read_json", "register_artifact_kind"]


def config_base_model(artifact: Any) -> str | None:
    config = getattr(artifact, "config", None)
    for name in ("base_model_name_or_path", "base_model", "_name_or_path"):
        if value := getattr(config, name, None):
            return str(value)
    return None


def _model_base(artifact: Any) -> str | None:
    """The base a model or PEFT adapter was made from."""
    from peft import PeftModel

    if isinstance(artifact, PeftModel):
        return next(iter(artifact.peft_config.values())).base_model_name_or_path
    return config_base_model(artifact)


def _model_classes() -> tuple[type, ...]:
    from peft import PeftModel
    from transformers import PreTrainedModel

    return (PreTrainedModel, PeftModel)


def _model_library(artifact: Any) -> str:
    from peft import PeftModel

    return "peft" if isinstance(artifact, PeftModel) else "transformers"


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}


@dataclass(frozen=True)
class ArtifactKind:
    """How one kind of unlearned artifact is carded and recognised: ``template`` (a file in ``hub_cards/``),
    ``method`` (``None``: the caller names it), ``classes`` (imported on call), ``library_name`` (card metadata),
    ``base_model``, ``settings`` (read from the artifact), ``folder_matches`` (recognises a saved folder) and
    ``integrity`` (the ``{"manifest", "sha256"}`` entry that pins a saved folder)."""

    name: str
    template: str
    method: str | None = None
    classes: Callable[[], tuple[type, ...]] = field(default=lambda: ())
    library_name: str | Callable[[Any], str] = "transformers"
    base_model: Callable[[Any], str | None] = _model_base
    settings: Callable[[Any], Mapping[str, Any]] = field(default=lambda artifact: {})
    folder_matches: Callable[[Path], bool] = field(default=lambda folder: False)
    integrity: Callable[[Path], dict[str, str] | None] = field(default=lambda folder: None)

    def matches(self, artifact: Any) -> bool:
        return isinstance(artifact, self.classes())

    def library_for(self, artifact: Any) -> str:
        if callable(self.library_name):
            return self.library_name(artifact) if artifact is not None else "transformers"
        return self.library_name


#: Registered kinds, checked in insertion order by :func:`detect_artifact_kind` (the last one,
#: ``unlearned_model``, accepts any transformers model or PEFT model).
ARTIFACT_KINDS: dict[str, ArtifactKind] = {}


def register_artifact_kind(kind: ArtifactKind, *, before: str | None = "unlearned_model") -> None:
    """Add (or replace) an artifact kind, tried before ``before``."""
    items = [(k, v) for k, v in ARTIFACT_KINDS.items() if k != kind.name]
    index = next((i for i, (k, _) in enumerate(items) if k == before), len(items))
    items.insert(index, (kind.name, kind))
    ARTIFACT_KINDS.clear()
    ARTIFACT_KINDS.update(items)


register_artifact_kind(ArtifactKind(
    "unlearned_model", "unlearned_model.md", None, _model_classes, _model_library, folder_matches=lambda f: True,
), before=None)


def detect_artifact_kind(artifact: Any) -> str:
    """Name of the registered kind an artifact (object or saved folder) belongs to."""
    method_names()  # the built-in method folders register their kinds on import
    if isinstance(artifact, (str, os.PathLike)):
        folder = Path(artifact)
        if not folder.is_dir():
            raise ValueError(f"Artifact folder {folder} does not exist.")
        return next(name for name, kind in ARTIFACT_KINDS.items() if kind.folder_matches(folder))
    for name, kind in ARTIFACT_KINDS.items():
        if kind.matches(artifact):
            return name
    raise ValueError(f"Cannot push a {type(artifact).__name__}: expected a PreTrainedModel, a PEFT model, a saved "
                     f"folder or an artifact of a registered kind ({', '.join(ARTIFACT_KINDS)}).")


def _kind(kind: str) -> ArtifactKind:
    method_names()
    if kind not in ARTIFACT_KINDS:
        raise ValueError(f"Unknown artifact kind {kind!r}; registered kinds: {sorted(ARTIFACT_KINDS)}.")
    return ARTIFACT_KINDS[kind]

