"""Calibrating T3's decoding parameters ``(T, w)`` after one head fit: ``T`` and ``w`` enter only at decoding,
``log q = log_softmax(log p / T + w log f)``, so every grid point is scored from one teacher-forced pass of the frozen
base. A point's ``retain_change`` is its greedy regret on the retain rows, ``mean_t (max_v log p_v - log p_g)`` with
``g`` the token greedy decoding under ``(T, w)`` picks; candidates are ordered weak -> strong by ``(T w, T)``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...scoring_pass import RowBatches
from .modeling import T3Classifier
from .processor import validate_t3_arguments
from .scoring import t3_candidate_log_probs, t3_scorer

DEFAULT_TEMPERATURES = (1.0, 1.5, 2.0, 2.5)
DEFAULT_TILT_WEIGHTS = (0.25, 0.5, 1.0, 2.0)
#: The base's own distribution, ``(T, w) = (1, 0)``: scored in the same pass, it gives the original's figures.
_BASE_SETTING = (1.0, 0.0)


def calibration_grid(temperatures: Sequence[float], tilt_weights: Sequence[float]) -> list[dict[str, float]]:
    """The grid's points ordered by ``(T w, T)``; duplicates dropped, invalid values refused."""
    temps = list(dict.fromkeys(float(t) for t in temperatures))
    weights = list(dict.fromkeys(float(w) for w in tilt_weights))
    if not temps or not weights:
        raise ValueError("calibrate_t3 needs at least one temperature and one tilt weight.")
    for t, w in itertools.product(temps, weights):
        validate_t3_arguments(t, w)
    grid = [{"temperature": t, "tilt_weight": w} for t, w in itertools.product(temps, weights)]
    return sorted(grid, key=lambda p: (p["temperature"] * p["tilt_weight"], p["temperature"]))


#: What the calibration's ``retain_change`` measures, as its record says.
RETAIN_MEASURE = (
    "greedy regret on the retain rows: mean over answer positions (teacher-forced) of max_v log p_v - log p_g, g the "
    "token greedy decoding under (T, w) picks; 0 where it picks the base's own token (nats/token)"
)
#: The criterion's row sets, in the order of ``measure_from_log_probs``; the last two are the retain side.
_ROW_SETS = ("forget", "holdout", "retain_validation", "generic")


def _one_pass(
    model: Any, tokenizer: Any, classifier: T3Classifier, criterion: Any, settings: list[tuple[float, float]],
    greedy_settings: list[tuple[float, float]], log_probs: bool = True,
) -> tuple[list[list[list[np.ndarray] | None]], dict[str, list[list[np.ndarray]] | None]]:
    """From one base pass per batch: ``out[k][s]``, setting ``k``'s per-row log-probabilities on row set ``s`` (none
    without ``log_probs``), and ``regrets[name][g]``, greedy setting ``g``'s per-row regrets on the retain sets."""
    sets = [getattr(criterion, name) for name in _ROW_SETS]
    scored = list(settings) if log_probs else []
    out: list[list[list[np.ndarray] | None]] = [[None] * len(sets) for _ in scored]
    regrets: dict[str, list[list[np.ndarray]] | None] = {"retain_validation": None, "generic": None}
    for s, (name, rows) in enumerate(zip(_ROW_SETS, sets)):
        retain_side = name in regrets
        if rows is None or not (retain_side or log_probs):
            continue
        greedy = greedy_settings if retain_side else []
        batches = RowBatches(
            lambda scorer, rows=rows: criterion._score(model, tokenizer, rows, scorer),
            lambda ids, mask, pos, labels, greedy=greedy: t3_candidate_log_probs(
                model, classifier, ids, labels, mask, pos, scored, greedy_settings=greedy),
        )
        for k in range(len(scored)):
            out[k][s] = batches.rows_of([kept[..., k] for kept in batches.kept])
        if retain_side:
            regrets[name] = [batches.rows_of([kept[..., len(scored) + g] for kept in batches.kept])
                             for g in range(len(greedy))]
    return out, regrets


def retain_greedy_figures(regrets: dict[str, list[list[np.ndarray]] | None], n: int) -> list[dict[str, float]]:
    """Per greedy setting: ``retain_greedy_regret``, ``retain_greedy_agreement`` (share of positions where it picks
    the base's token) and ``generic_greedy_regret`` (``None`` without generic rows), means of per-row means."""
    figures: list[dict[str, float]] = [{} for _ in range(n)]
    for name, key in (("retain_validation", "retain"), ("generic", "generic")):
        for g, f in enumerate(figures):
            if regrets[name] is None:
                f[f"{key}_greedy_regret"] = None
                continue
            per_row = [r for r in regrets[name][g] if len(r)]
            f[f"{key}_greedy_regret"] = float(np.mean([r.mean() for r in per_row]))
            if key == "retain":
                f["retain_greedy_agreement"] = float(np.mean([(r == 0).mean() for r in per_row]))
    return figures


def calibrate_t3(
    model: Any, tokenizer: Any, classifier: T3Classifier, criterion: Any,
    temperatures: Sequence[float] = DEFAULT_TEMPERATURES, tilt_weights: Sequence[float] = DEFAULT_TILT_WEIGHTS, *,
    cached: bool = True, device: Any = None,
) -> Any:
    """Score the ``temperatures`` x ``tilt_weights`` grid with ``criterion`` (``cached``: from one pass of the base)
    and write the chosen ``(T, w)`` and the record into ``classifier.config``; returns the record."""
    from ...devices import device_of, move_to_device

    grid = calibration_grid(temperatures, tilt_weights)
    move_to_device(model, device)
    if device is not None:
        classifier.to(device_of(model))
    classifier.check_finite()
    classifier.check_base(model)
    points = [(p["temperature"], p["tilt_weight"]) for p in grid]
    if cached:
        start = time.perf_counter()
        log_probs, regrets = _one_pass(model, tokenizer, classifier, criterion, [_BASE_SETTING, *points], points)
        if criterion.original is None:  # the first measurement's retain figures become the original's
            criterion.measure_from_log_probs(*log_probs[0])
        measurements = [criterion.measure_from_log_probs(*sets) for sets in log_probs[1:]]
        share = (time.perf_counter() - start) / len(grid)
        for m in measurements:
            m["seconds"] = share
    else:
        if criterion.original is None:
            criterion.measure_original(model, tokenizer)
        measurements = [
            criterion.measure(model, tokenizer, scorer=t3_scorer(model, classifier, p["temperature"], p["tilt_weight"]))
            for p in grid
        ]
        _, regrets = _one_pass(model, tokenizer, classifier, criterion, [], points, log_probs=False)
    for m, g in zip(measurements, retain_greedy_figures(regrets, len(grid)), strict=True):
        m["retain_nll_change"] = m["retain_change"]  # the retain change judged is the larger greedy regret
        m.update(g)
        m["retain_change"] = max(v for v in (g["retain_greedy_regret"], g["generic_greedy_regret"]) if v is not None)
    record = criterion.decide(grid, measurements)
    record.rule["retain_measure"] = RETAIN_MEASURE
    chosen = record.chosen
    classifier.config.temperature = float(chosen["temperature"])
    classifier.config.tilt_weight = float(chosen["tilt_weight"])
    classifier.config.calibration = record.to_dict()
    return record
