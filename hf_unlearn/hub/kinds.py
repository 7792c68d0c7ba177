"""Artifact kinds: how each kind of unlearned artifact is carded and recognised.

Artifact kinds live in :data:`ARTIFACT_KINDS`; adding one is one :func:`register_artifact_kind` call (a template
in ``hub_cards/`` plus the classes of the artifact and how to recognise a saved folder). An in-memory artifact's
kind is found with ``isinstance`` against those classes, which are imported only when a kind is checked, so
importing this module imports no method module.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ARTIFACT_KINDS", "ArtifactKind", "detect_artifact_kind", "register_artifact_kind"]


def _config_base(artifact: Any) -> str | None:
    config = getattr(artifact, "config", None)
    for name in ("base_model_name_or_path", "base_model", "_name_or_path"):
        value = getattr(config, name, None)
        if value:
            return str(value)
    return None


def _model_base(artifact: Any) -> str | None:
    """The base a model or PEFT adapter was made from (for a PEFT model, its adapter config's base)."""
    from peft import PeftModel

    if isinstance(artifact, PeftModel):
        return next(iter(artifact.peft_config.values())).base_model_name_or_path
    return _config_base(artifact)


def _grom_classes() -> tuple[type, ...]:
    from ..methods.grom.model import GROMEdit

    return (GROMEdit,)


def _t3_classes() -> tuple[type, ...]:
    from ..methods.t3.modeling import T3Classifier

    return (T3Classifier,)


def _model_classes() -> tuple[type, ...]:
    from peft import PeftModel
    from transformers import PreTrainedModel

    return (PreTrainedModel, PeftModel)


def _grom_settings(edit: Any) -> dict[str, Any]:
    return dict(edit.config.saved_dict())


def _t3_settings(head: Any) -> dict[str, Any]:
    keep = ("rank", "layer", "pooling", "temperature", "tilt_weight", "hidden_size", "vocab_size")
    return {k: getattr(head.config, k) for k in keep if getattr(head.config, k, None) is not None}


def _model_library(artifact: Any) -> str:
    from peft import PeftModel

    return "peft" if isinstance(artifact, PeftModel) else "transformers"


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}


def _folder_is_grom(folder: Path) -> bool:
    from ..methods.grom.peft_export import GROM_METADATA

    return (folder / "adapter_config.json").is_file() and (folder / GROM_METADATA).is_file()


def _folder_is_t3(folder: Path) -> bool:
    from ..methods.t3.config import T3ClassifierConfig

    return _read_json(folder / "config.json").get("model_type") == T3ClassifierConfig.model_type


@dataclass(frozen=True)
class ArtifactKind:
    """How one kind of unlearned artifact is carded and recognised.

    ``template``: file name in ``hub_cards/``. ``method``: the fixed method of this kind (``None``
    when the caller names it). ``classes``: returns the classes whose instances are of this kind
    (imported on call, so that importing this module stays light). ``library_name``: card metadata
    (a callable gets the artifact). ``base_model``: the base model an artifact was made from.
    ``settings``: default method settings read from the artifact. ``folder_matches``: recognises a
    saved folder by the files its ``save_pretrained`` writes.
    """

    name: str
    template: str
    method: str | None = None
    classes: Callable[[], tuple[type, ...]] = field(default=lambda: ())
    library_name: str | Callable[[Any], str] = "transformers"
    base_model: Callable[[Any], str | None] = _model_base
    settings: Callable[[Any], Mapping[str, Any]] = field(default=lambda artifact: {})
    folder_matches: Callable[[Path], bool] = field(default=lambda folder: False)

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
    """Add (or replace) an artifact kind; by default it is tried before the catch-all kind."""
    items = [(k, v) for k, v in ARTIFACT_KINDS.items() if k != kind.name]
    index = next((i for i, (k, _) in enumerate(items) if k == before), len(items))
    items.insert(index, (kind.name, kind))
    ARTIFACT_KINDS.clear()
    ARTIFACT_KINDS.update(items)


register_artifact_kind(ArtifactKind(
    "unlearned_model", "unlearned_model.md", None, _model_classes, _model_library, folder_matches=lambda f: True,
), before=None)
register_artifact_kind(ArtifactKind(
    "grom_adapter", "grom_adapter.md", "grom", _grom_classes, "peft",
    base_model=lambda edit: edit.base_model_name_or_path, settings=_grom_settings, folder_matches=_folder_is_grom,
))
register_artifact_kind(ArtifactKind(
    "t3_classifier", "t3_classifier.md", "t3", _t3_classes, "transformers", base_model=_config_base,
    settings=_t3_settings, folder_matches=_folder_is_t3,
))


def detect_artifact_kind(artifact: Any) -> str:
    """Name of the registered kind an artifact (object or saved folder) belongs to."""
    if isinstance(artifact, (str, os.PathLike)):
        folder = Path(artifact)
        if not folder.is_dir():
            raise ValueError(f"Artifact folder {folder} does not exist.")
        return next(name for name, kind in ARTIFACT_KINDS.items() if kind.folder_matches(folder))
    for name, kind in ARTIFACT_KINDS.items():
        if kind.matches(artifact):
            return name
    raise ValueError(
        f"Cannot push a {type(artifact).__name__}: expected a PreTrainedModel, a PEFT model, a GROMEdit, "
        "a T3Classifier or a saved folder."
    )


def _kind(kind: str) -> ArtifactKind:
    if kind not in ARTIFACT_KINDS:
        raise ValueError(f"Unknown artifact kind {kind!r}; registered kinds: {sorted(ARTIFACT_KINDS)}.")
    return ARTIFACT_KINDS[kind]

