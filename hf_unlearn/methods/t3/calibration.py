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
decoding under ``(T, w)`` picks (:func:`~hf_unlearn.methods.t3.tilt.greedy_regret`, from the same pass). It is 0 wherever the tilted decoding keeps the base's token, so a tempering alone costs nothing and
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
    """Score the ``temperatures`` x ``tilt_weights`` grid (16 points by default) with ``criterion`` and write the
    chosen ``(T, w)`` into ``classifier.config`` (``temperature``, ``tilt_weight`` and ``calibration``, the
    record as a dict). Returns the :class:`~hf_unlearn.selection.SelectionRecord`, whose measurements'
    ``retain_change`` is the greedy regret on the retain rows (:func:`retain_greedy_figures`, from the same pass;
    with ``cached=False``, one more pass over the retain rows; the teacher-forced
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
