"""Calibrating T3's decoding parameters ``(T, w)`` on the data, after one head fit.

``T`` and ``w`` enter only at decoding time (``log q = log_softmax(log p / T + w log f)``), and the base is frozen, so
every grid point is scored from one teacher-forced pass over the criterion's rows: each batch runs the base once,
the head gives ``log f`` at the answer positions, and every candidate's answer-token log-probability is one
``logsumexp`` over the vocabulary per position
(:func:`~hf_unlearn.methods.t3.scoring.candidate_answer_log_probs`). The same pass gives the untilted base's
log-probabilities, i.e. the original model's retain figures. :func:`calibrate_t3` measures a
:class:`~hf_unlearn.selection.SelectionCriterion` at every ``(T, w)`` from those log-probabilities
(:meth:`~hf_unlearn.selection.SelectionCriterion.measure_from_log_probs`), applies its rule, and writes the chosen
``temperature`` and ``tilt_weight`` into the head's config together with the record (``config.calibration``), so
``save_pretrained`` / ``push_to_hub`` carry them and :meth:`~hf_unlearn.methods.t3.T3LogitsProcessor.from_pretrained`
decodes with them. ``cached=False`` measures each point with its own pass of the tilted scorer instead (the
reference the one-pass path is tested against).

The default grid, ``T`` in 1, 1.5, 2, 2.5 and ``w`` in 0.25, 0.5, 1, 2 (16 points), spans the authors' released
sweep (locuslab/open-unlearning ``community/methods/T3/run.sh``: ``base_temp=2.5``, ``guidance_scale=1``; their
config class defaults to ``base_temp=1``, ``guidance_scale=1``): tempering (``T > 1``) is what lowers answers the
base has memorised, which a tilt alone cannot suppress, and ``w = 2`` doubles their tilt. ``w = 0.25`` is a
weaker tilt than any the authors ran. On SmolLM2-135M's tuning authors (forget10 authors 5-8) a grid with
``w = 0.1`` too showed the weak end undershooting (``T = 1``: NLL shift gap -2.8 at ``w = 0.1``, -2.5 at 0.25,
-0.5 at 0.5, +6.9 at 1), so ``w = 0.1`` was left out and the rule's point stayed ``T = 1, w = 0.5``.

Retain damage is judged by what the tilted greedy decoding changes, not by the teacher-forced NLL: each point's
``retain_change`` (what the rule holds within ``retain_tolerance``) is its greedy regret on the retain-validation
(and generic) rows, the mean over answer positions of ``max_v log p_v - log p_g`` with ``g`` the token greedy
decoding under ``(T, w)`` picks (:func:`~hf_unlearn.methods.t3.tilt.greedy_regret`; one more pass of the base over
those rows). It is 0 wherever the tilted decoding keeps the base's token, so a tempering alone costs nothing and
``(T, w)`` costs what ``(1, T w)`` does; the teacher-forced NLL change, which tempering raises on every row by
construction and which vetoed every ``T > 1`` point, stays in the record as ``retain_nll_change``. The forget side
(the NLL shift gap to the holdout rows) is still measured teacher-forced under ``(T, w)``.

Order of the grid, weak -> strong: greedy decoding from ``log p / T + w log f`` picks the same token as from
``log p + T w log f``, so ``T w`` is the greedy-equivalent tilt; candidates are sorted by ``T w``, then by ``T``
(which further flattens sampling and the teacher-forced scores).
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
from .scoring import _base_pass, t3_candidate_log_probs, t3_scorer
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


def _one_pass_log_probs(
    model: Any, tokenizer: Any, classifier: T3Classifier, criterion: Any, settings: list[tuple[float, float]]
) -> list[list[list[np.ndarray] | None]]:
    """``out[k][s]``: setting ``k``'s per-row answer-token log-probabilities on the criterion's row set ``s``
    (forget, holdout, retain_validation, generic; None without generic rows), from one base pass per batch of the
    criterion's own scoring loop (:class:`~hf_unlearn.scoring_pass.RowBatches`)."""
    sets = [criterion.forget, criterion.holdout, criterion.retain_validation, criterion.generic]
    out: list[list[list[np.ndarray] | None]] = [[None] * len(sets) for _ in settings]
    for s, rows in enumerate(sets):
        if rows is None:
            continue
        batches = RowBatches(
            lambda scorer, rows=rows: criterion._score(model, tokenizer, rows, scorer),
            lambda ids, mask, pos, labels: t3_candidate_log_probs(model, classifier, ids, labels, mask, pos, settings),
        )
        for k in range(len(settings)):
            out[k][s] = batches.rows_of([kept[..., k] for kept in batches.kept])
    return out


#: What the calibration's ``retain_change`` measures, as its record says.
RETAIN_MEASURE = (
    "greedy regret on the retain rows: mean over answer positions (teacher-forced) of max_v log p_v - log p_g, g the "
    "token greedy decoding under (T, w) picks; 0 where it picks the base's own token (nats/token)"
)


@torch.no_grad()
def _greedy_regret_batch(model: Any, classifier: T3Classifier, input_ids: torch.Tensor, labels: torch.Tensor,
                         attention_mask: Any, position_ids: Any, settings: list[tuple[float, float]]) -> torch.Tensor:
    """``[B, L, K]``: :func:`~hf_unlearn.methods.t3.tilt.greedy_regret` of every setting at every answer position
    (aligned as the log-probabilities: ``out[:, t]`` is the position that predicts ``labels[:, t]``), from one
    forward of the base, ``2^20 / V`` positions at a time."""
    logits, pooled = _base_pass(model, classifier, input_ids, attention_mask, position_ids)
    out = torch.zeros((*labels.shape, len(settings)), dtype=torch.float32, device=logits.device)
    rows, cols = (labels[:, 1:] != IGNORE_INDEX).nonzero(as_tuple=True)
    step = max(1, 2**20 // logits.shape[-1])
    for start in range(0, len(rows), step):
        b, t = rows[start : start + step], cols[start : start + step]
        guidance = classifier(pooled[b, t].to(classifier.device)).logits.to(logits.device)
        out[b, t + 1] = greedy_regret(logits[b, t], guidance, settings, classifier.config.log_f_floor)
    return out


def retain_greedy_figures(model: Any, tokenizer: Any, classifier: T3Classifier, criterion: Any,
                          settings: list[tuple[float, float]]) -> list[dict[str, float]]:
    """Per setting, what its greedy decoding changes on the criterion's retain rows (``retain_validation``, and
    ``generic`` when given), from one pass of the base over them: ``retain_greedy_regret`` (the mean over rows of
    each row's mean :func:`~hf_unlearn.methods.t3.tilt.greedy_regret`), ``retain_greedy_agreement`` (the mean
    over rows of the fraction of answer positions where it picks the base's token), ``generic_greedy_regret``
    (``None`` without generic rows)."""
    figures: list[dict[str, float]] = [{} for _ in settings]
    for name, rows in (("retain", criterion.retain_validation), ("generic", criterion.generic)):
        if rows is None:
            for f in figures:
                f[f"{name}_greedy_regret"] = None
            continue
        batches = RowBatches(
            lambda scorer, rows=rows: criterion._score(model, tokenizer, rows, scorer),
            lambda ids, mask, pos, labels: _greedy_regret_batch(model, classifier, ids, labels, mask, pos, settings),
        )
        for k, f in enumerate(figures):
            per_row = [r for r in batches.rows_of([kept[..., k] for kept in batches.kept]) if len(r)]
            f[f"{name}_greedy_regret"] = float(np.mean([r.mean() for r in per_row]))
            if name == "retain":
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
    """Score the ``temperatures`` x ``tilt_weights`` grid (16 points by default) with ``criterion`` and write the
    chosen ``(T, w)`` into ``classifier.config`` (``temperature``, ``tilt_weight`` and ``calibration``, the
    record as a dict). Returns the :class:`~hf_unlearn.selection.SelectionRecord`, whose measurements'
    ``retain_change`` is the greedy regret on the retain rows (:func:`retain_greedy_figures`; the teacher-forced
    change kept as ``retain_nll_change``) and whose ``rule["retain_measure"]`` says so.

    With ``cached`` (the default) all points and the original model's retain figures (the frozen base, untilted,
    when the criterion has none) come from one pass of the base over the criterion's rows; each measurement's
    ``seconds`` is its share of that pass. ``cached=False`` runs the original's pass and one tilted-scorer pass
    per point (the same measurements up to float rounding, about one pass per point). Every setting is validated
    before any pass; the head and the base are not modified otherwise.

    ``device``: ``None`` (default) scores where the base is; ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"``
    (:func:`hf_unlearn.devices.resolve_device`) moves the base and the head there first (refused before any work
    when the machine lacks it). A criterion with a ``device`` of its own moves the base there when it scores.
    """
    from ...devices import device_of, move_to_device

    grid = calibration_grid(temperatures, tilt_weights)
    move_to_device(model, device)
    if device is not None:
        classifier.to(device_of(model))
    classifier.check_finite()
    classifier.check_base(model)
    if cached:
        start = time.perf_counter()
        settings = [_BASE_SETTING] + [(p["temperature"], p["tilt_weight"]) for p in grid]
        log_probs = _one_pass_log_probs(model, tokenizer, classifier, criterion, settings)
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
    greedy = retain_greedy_figures(model, tokenizer, classifier, criterion,
                                   [(p["temperature"], p["tilt_weight"]) for p in grid])
    _judge_retain_by_greedy_decoding(measurements, greedy)
    record = criterion.decide(grid, measurements)
    record.rule["retain_measure"] = RETAIN_MEASURE
    chosen = record.chosen
    classifier.config.temperature = float(chosen["temperature"])
    classifier.config.tilt_weight = float(chosen["tilt_weight"])
    classifier.config.calibration = record.to_dict()
    return record
