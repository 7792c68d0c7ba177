"""Model cards (:func:`build_model_card`), the one upload path (:func:`push_folder`: a prepared folder and its card
in one commit), publishing an artifact with its report (:func:`push_unlearned`), report checks and metric Spaces
(:func:`push_metric_space`). Importing this package imports neither torch nor any method module."""

from __future__ import annotations

from ..artifact_kinds import ARTIFACT_KINDS, ArtifactKind, detect_artifact_kind, register_artifact_kind
from .cards import METHOD_PAPERS, METHOD_TITLES, build_model_card, trainer_model_card
from .publish import push_unlearned
from .push import push_folder
from .reports import REPORT_METRICS, check_report_matches, report_dict
from .spaces import push_metric_space

__all__ = [
    "ARTIFACT_KINDS", "REPORT_METRICS", "ArtifactKind", "METHOD_PAPERS", "METHOD_TITLES", "build_model_card",
    "check_report_matches", "detect_artifact_kind", "push_folder", "push_metric_space", "push_unlearned",
    "register_artifact_kind", "report_dict", "trainer_model_card",
]
