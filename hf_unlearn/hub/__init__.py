"""Model cards, publishing and metric Spaces for unlearned artifacts.

- :mod:`~hf_unlearn.hub.cards`: :func:`build_model_card` renders a ``hub_cards/<kind>.md`` template (metadata with
  the evaluator's numbers in ``model-index``, the method with its title, paper and settings, the forget split, the
  quantization check, how to load it); :func:`trainer_model_card` is the unlearning trainers' card.
- :mod:`~hf_unlearn.hub.push`: :func:`push_folder`, the one upload path: a prepared folder plus its card in ONE
  commit. Every artifact's ``push_to_hub`` ends there.
- :mod:`~hf_unlearn.hub.publish`: :func:`push_unlearned` saves an artifact (weights + config + card + report) to
  a temporary folder and pushes it; it refuses, before anything is uploaded, a missing token and a report
  computed for another base model or forget split.
- :mod:`~hf_unlearn.hub.reports`: the card metrics of a report (a :class:`~hf_unlearn.evaluation.TOFUReport` or a
  dict), :func:`check_report_matches` and :func:`report_dict` (the JSON published with an artifact).
- :mod:`~hf_unlearn.artifact_kinds`: :data:`ARTIFACT_KINDS`; adding one is one :func:`register_artifact_kind` call.
- :mod:`~hf_unlearn.hub.spaces`: :func:`push_metric_space` publishes an ``evaluate_metrics/<name>`` module as a
  Gradio Space so ``evaluate.load("<owner>/<name>")`` loads it from that Hub.

Importing this package imports neither torch nor any method module.
"""

from __future__ import annotations

from ..artifact_kinds import ARTIFACT_KINDS, ArtifactKind, detect_artifact_kind, register_artifact_kind
from .cards import METHOD_PAPERS, METHOD_TITLES, build_model_card, trainer_model_card
from .publish import push_unlearned
from .push import push_folder
from .reports import REPORT_METRICS, check_report_matches, report_dict
from .spaces import push_metric_space

__all__ = [
    "ARTIFACT_KINDS",
    "REPORT_METRICS",
    "ArtifactKind",
    "METHOD_PAPERS",
    "METHOD_TITLES",
    "build_model_card",
    "check_report_matches",
    "detect_artifact_kind",
    "push_folder",
    "push_metric_space",
    "push_unlearned",
    "register_artifact_kind",
    "report_dict",
    "trainer_model_card",
]
