"""Calibrating T3's decoding parameters ``(T, w)`` on the data, after one head fit.

``T`` and ``w`` enter only at decoding time, ``log q = log_softmax(log p / T + w log f)``, and the base is frozen, so
every grid point is scored from one teacher-forced pass over the criterion's rows
(:func:`~hf_unlearn.methods.t3.scoring.candidate_answer_log_probs`); the same pass gives the original model's retain
figures. A point's ``retain_change`` is its greedy regret on the retain rows,
``mean_t (max_v log p_v - log p_g)`` with ``g`` the token greedy decoding under ``(T, w)`` picks
(:func:`~hf_unlearn.methods.t3.tilt.greedy_regret`); the teacher-forced NLL change stays in the record as
``retain_nll_change``. Candidates are ordered weak -> strong by ``T w`` (the greedy-equivalent tilt), then ``T``.
The chosen ``temperature`` and ``tilt_weight`` and the record go into the head's config. The default grid and its
origin: ``docs/methods/t3.md``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ...data.prompts import IGNORE_INDEX
from ...scoring_pass import RowBatches
from .modeling import T3Classifier
from .processor import validate_t3_arguments
from .scoring import _base_pass, candidate_answer_log_probs, t3_scorer
from .tilt import greedy_regret

DEFAULT_TEMPERATURES = (1.0, 1.5, 2.0, 2.5)
DEFAULT_TILT_WEIGHTS = (0.25, 0.5, 1.0, 2.0)
#: The base's own distribution, ``(T, w) = (1, 0)``: scored in the same pass, it gives the original's figures.
_BASE_SETTING = (1.0, 0.0)


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


#: What the calibration's ``retain_change`` measures, as its record says.
RETAIN_MEASURE = (
    "greedy regret on the retain rows: mean over answer positions (teacher-forced) of max_v log p_v - log p_g, g the "
    "token greedy decoding under (T, w) picks; 0 where it picks the base's own token (nats/token)"
)
#: The criterion's row sets, in the order of ``measure_from_log_probs``; the last two are the retain side.
_ROW_SETS = ("forget", "holdout", "retain_validation", "generic")


@torch.no_grad()
def _scores_and_regrets(model: Any, classifier: T3Classifier, input_ids: torch.Tensor, labels: torch.Tensor,
                        attention_mask: Any, position_ids: Any, settings: list[tuple[float, float]],
                        greedy_settings: list[tuple[float, float]]) -> torch.Tensor:
    """``[B, L, K + G]`` from one forward of the base: the answer-token log-probabilities of the ``K`` ``settings``
    (:func:`~hf_unlearn.methods.t3.scoring.candidate_answer_log_probs`) and the
    :func:`~hf_unlearn.methods.t3.tilt.greedy_regret` of the ``G`` ``greedy_settings``, aligned as
    :func:`~hf_unlearn.methods.t3.scoring.t3_log_probs` (``out[:, t]`` is label ``t``'s), ``2^20 / V`` positions
    at a time."""
    logits, pooled = _base_pass(model, classifier, input_ids, attention_mask, position_ids)
    floor = classifier.config.log_f_floor
    k = len(settings)
    out = torch.zeros((*labels.shape, k + len(greedy_settings)), dtype=torch.float32, device=logits.device)
    rows, cols = (labels[:, 1:] != IGNORE_INDEX).nonzero(as_tuple=True)
    step = max(1, 2**20 // logits.shape[-1])
    for start in range(0, len(rows), step):
        b, t = rows[start : start + step], cols[start : start + step]
        guidance = classifier(pooled[b, t].to(classifier.device)).logits.to(logits.device)
        if k:
            out[b, t + 1, :k] = candidate_answer_log_probs(logits[b, t], guidance, labels[b, t + 1], settings, floor)
        out[b, t + 1, k:] = greedy_regret(logits[b, t], guidance, greedy_settings, floor)
    return out


def _one_pass(
    model: Any, tokenizer: Any, classifier: T3Classifier, criterion: Any, settings: list[tuple[float, float]],
    greedy_settings: list[tuple[float, float]], log_probs: bool = True,
) -> tuple[list[list[list[np.ndarray] | None]], dict[str, list[list[np.ndarray]] | None]]:
    """From one base pass per batch of the criterion's own scoring loop (:class:`~hf_unlearn.scoring_pass.RowBatches`):
    ``out[k][s]``, setting ``k``'s per-row answer-token log-probabilities on the row set ``s`` (forget, holdout,
    retain_validation, generic; None without generic rows, and all None when ``log_probs`` is false, which
    passes over the retain sets only); and ``regrets[name][g]``, greedy setting ``g``'s per-row greedy regrets on
    the retain sets (``"retain_validation"``, ``"generic"``: None without generic rows)."""
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
            lambda ids, mask, pos, labels, greedy=greedy: _scores_and_regrets(
                model, classifier, ids, labels, mask, pos, scored, greedy),
        )
        for k in range(len(scored)):
            out[k][s] = batches.rows_of([kept[..., k] for kept in batches.kept])
        if retain_side:
            regrets[name] = [batches.rows_of([kept[..., len(scored) + g] for kept in batches.kept])
                             for g in range(len(greedy))]
    return out, regrets


def retain_greedy_figures(regrets: dict[str, list[list[np.ndarray]] | None], n: int) -> list[dict[str, float]]:
    """Per greedy setting (``n`` of them), what its greedy decoding changes on the retain rows, from the per-row
    greedy regrets of :func:`_one_pass`: ``retain_greedy_regret`` (the mean over the retain-validation rows of each
    row's mean regret), ``retain_greedy_agreement`` (the mean over those rows of the fraction of answer positions
    where it picks the base's token) and ``generic_greedy_regret`` (the same on the generic rows; ``None`` without
    them)."""
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


def _judge_retain_by_greedy_decoding(measurements: list[dict[str, Any]], greedy: list[dict[str, float]]) -> None:
    """Make each measurement's ``retain_change`` (what the rule holds within the tolerance) the larger of its
    retain and generic greedy regrets; the teacher-forced change it replaces stays as ``retain_nll_change``."""
    for m, g in zip(measurements, greedy, strict=True):
        m["retain_nll_change"] = m["retain_change"]
        m.update(g)
        m["retain_change"] = max(v for v in (g["retain_greedy_regret"], g["generic_greedy_regret"]) if v is not None)


def calibrate_t3(
    model: Any,
    tokenizer: Any,
    classifier: T3Classifier,
    criterion: Any,
    temperatures: Sequence[float] = DEFAULT_TEMPERATURES,
    tilt_weights: Sequence[float] = DEFAULT_TILT_WEIGHTS,
    *,
    cached: bool = True,
    device: Any = None,
) -> Any:
    """Score the ``temperatures`` x ``tilt_weights`` grid with ``criterion`` and write the chosen ``(T, w)`` into
    ``classifier.config`` (``temperature``, ``tilt_weight``, and the record as ``calibration``); returns the
    :class:`~hf_unlearn.selection.SelectionRecord`. With ``cached`` (the default) every point and the original's
    retain figures come from one pass of the base; ``cached=False`` runs one tilted-scorer pass per point (the same
    measurements up to float rounding). Settings are validated before any pass. ``device``: where to score
    (:func:`hf_unlearn.devices.resolve_device`; default where the base is)."""
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
    _judge_retain_by_greedy_decoding(measurements, retain_greedy_figures(regrets, len(grid)))
    record = criterion.decide(grid, measurements)
    record.rule["retain_measure"] = RETAIN_MEASURE
    chosen = record.chosen
    classifier.config.temperature = float(chosen["temperature"])
    classifier.config.tilt_weight = float(chosen["tilt_weight"])
    classifier.config.calibration = record.to_dict()
    return record
