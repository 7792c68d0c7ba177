"""Calibrating T3's decoding parameters ``(T, w)`` on the data, after one head fit.

``T`` and ``w`` enter only at decoding time (``log q = log_softmax(log p / T + w log f)``), so each grid point
costs one teacher-forced pass with :func:`~hf_unlearn.methods.t3.t3_scorer` over the criterion's rows, and the head is
fitted once. :func:`calibrate_t3` measures a :class:`~hf_unlearn.selection.SelectionCriterion` at every
``(T, w)``, applies its rule, and writes the chosen ``temperature`` and ``tilt_weight`` into the head's config
together with the record (``config.calibration``), so ``save_pretrained`` / ``push_to_hub`` carry them and
:meth:`~hf_unlearn.methods.t3.T3LogitsProcessor.from_pretrained` decodes with them.

Order of the grid, weak -> strong: greedy decoding from ``log p / T + w log f`` picks the same token as from
``log p + T w log f``, so ``T w`` is the greedy-equivalent tilt; candidates are sorted by ``T w``, then by ``T``
(which further flattens sampling and the teacher-forced scores).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from .modeling import T3Classifier
from .processor import validate_t3_arguments
from .scoring import t3_scorer

DEFAULT_TEMPERATURES = (1.0, 1.5, 2.0)
DEFAULT_TILT_WEIGHTS = (0.3, 0.5, 1.0)


def calibration_grid(temperatures: Sequence[float], tilt_weights: Sequence[float]) -> list[dict[str, float]]:
    """Every ``{"temperature": T, "tilt_weight": w}`` of the grid, ordered weak -> strong by ``(T w, T)``;
    duplicates are dropped and invalid values refused (``T >= 1`` finite, ``w`` finite)."""
    temps = list(dict.fromkeys(float(t) for t in temperatures))
    weights = list(dict.fromkeys(float(w) for w in tilt_weights))
    if not temps or not weights:
        raise ValueError("calibrate_t3 needs at least one temperature and one tilt weight.")
    for t, w in itertools.product(temps, weights):
        validate_t3_arguments(t, w)
    grid = [{"temperature": t, "tilt_weight": w} for t, w in itertools.product(temps, weights)]
    return sorted(grid, key=lambda p: (p["temperature"] * p["tilt_weight"], p["temperature"]))


def calibrate_t3(
    model: Any,
    tokenizer: Any,
    classifier: T3Classifier,
    criterion: Any,
    temperatures: Sequence[float] = DEFAULT_TEMPERATURES,
    tilt_weights: Sequence[float] = DEFAULT_TILT_WEIGHTS,
) -> Any:
    """Score the ``temperatures`` x ``tilt_weights`` grid (9 points by default) with ``criterion`` and write the
    chosen ``(T, w)`` into ``classifier.config`` (``temperature``, ``tilt_weight`` and ``calibration``, the
    record as a dict). Returns the :class:`~hf_unlearn.selection.SelectionRecord`.

    The original model's retain figures (the frozen base, untilted) are measured first when the criterion has
    none. Every setting is validated before any pass; the head and the base are not modified otherwise.
    """
    grid = calibration_grid(temperatures, tilt_weights)
    classifier.check_base(model)
    if criterion.original is None:
        criterion.measure_original(model, tokenizer)
    measurements = [
        criterion.measure(model, tokenizer, scorer=t3_scorer(model, classifier, p["temperature"], p["tilt_weight"]))
        for p in grid
    ]
    record = criterion.decide(grid, measurements)
    chosen = record.chosen
    classifier.config.temperature = float(chosen["temperature"])
    classifier.config.tilt_weight = float(chosen["tilt_weight"])
    classifier.config.calibration = record.to_dict()
    return record
