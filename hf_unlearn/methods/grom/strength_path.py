"""GROM's exact strength path: many edits from one key collection. Scaling the targets scales the edit,
``P(c D) = c P(D)``, and with ``R`` the preservation part of the fitted ``A_0`` each ``(w_r, mu)`` is one solve of

    A(w_r, mu) = (w_r / w_r0) R + (w_f/s) X_f X_f^T + mu I,    P = (w_f/s) D X_f^T A(w_r, mu)^{-1}.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .band_cache import BandCache, band_entry
from .config import GROMConfig
from .edit import GROMEdit, _add_deltas, untie_lm_head
from .fit import _fit_grom
from .solve import GROMSolution, cholesky_or_explain, solve_with_factor

DEFAULT_SCALES = (0.25, 0.5, 1.0)
DEFAULT_RETAIN_WEIGHT_FACTORS = (1.0, 10.0, 100.0)


class _PointEdits(Sequence):
    """``edits[i]``: point ``i``'s :class:`~hf_unlearn.methods.grom.GROMEdit`, built on first access and kept."""

    def __init__(self, build: Any, n: int) -> None:
        self._build, self._n, self._built = build, n, {}

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        j = int(i) + (self._n if int(i) < 0 else 0)
        if not 0 <= j < self._n:
            raise IndexError(f"path point {i} out of range ({self._n} points)")
        if j not in self._built:
            self._built[j] = self._build(j)
        return self._built[j]


@dataclass
class GROMPath:
    """Exact GROM edits ordered weak -> strong by ``norms[i] = sum_m ||P_m||_F``: ``points[i]`` (``scale``,
    ``retain_weight``, ``ridge``), its edit ``edits[i]``, deltas ``point_scales[i] * unit_deltas[point_units[i]]``."""

    points: list[dict[str, float]]
    edits: Sequence[GROMEdit]
    record: Any = None
    norms: list[float] = field(default_factory=list)
    unit_deltas: list[dict[str, torch.Tensor]] = field(default_factory=list, repr=False)
    point_units: list[int] = field(default_factory=list, repr=False)
    point_scales: list[float] = field(default_factory=list, repr=False)
    base: GROMEdit | None = field(default=None, repr=False)
    cache_bytes: int | None = None
    cache_seconds: float | None = None

    def __len__(self) -> int:
        return len(self.points)

    def point_deltas(self, i: int) -> dict[str, torch.Tensor]:
        """``{module: P}`` of point ``i`` (float32, on the device the path was solved on)."""
        scale = self.point_scales[i]
        return {n: d * scale if scale != 1.0 else d for n, d in self.unit_deltas[self.point_units[i]].items()}

    def select(
        self, criterion: Any, model: Any, tokenizer: Any, *, cached: bool = True,
        cache_device: str | torch.device | None = None,
    ) -> GROMEdit:
        """Measure ``criterion`` on ``model`` (the unedited base) with each point's edit applied in turn and return the
        edit its rule chooses (record in :attr:`record`); ``cached``: each point runs from band inputs cached once."""
        if not self.points or not self.unit_deltas or self.base is None:
            raise ValueError("The GROM path is empty (build it with fit_grom_path or grom_path_from_edit).")
        base = self.base
        base.verify_base(model)
        if base.untied_lm_head:
            untie_lm_head(model)
        modules = dict(model.named_modules())
        names = sorted({n for u in self.unit_deltas for n in u})
        saved = {n: modules[n].weight.detach().clone() for n in names}
        try:
            measure = _cached_measure(self, criterion, model, tokenizer, names, cache_device) if cached else None
            if measure is None:
                if criterion.original is None:
                    criterion.measure_original(model, tokenizer)
                measure = functools.partial(criterion.measure, model, tokenizer)
            measurements = []
            for i in range(len(self.points)):
                _add_deltas(modules, self.point_deltas(i))
                try:
                    measurements.append(measure())
                finally:
                    _restore(modules, saved)
        finally:
            _restore(modules, saved)
        candidates = [{**p, "edit_norm": norm} for p, norm in zip(self.points, self.norms or [None] * len(self))]
        self.record = criterion.decide(candidates, measurements)
        chosen = self.edits[self.record.index]
        chosen.stats["selection"] = self.record.to_dict()
        return chosen


def _restore(modules: dict[str, Any], saved: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, w in saved.items():
            modules[name].weight.copy_(w)


def _cached_measure(
    path: GROMPath, criterion: Any, model: Any, tokenizer: Any, names: list[str],
    cache_device: str | torch.device | None,
) -> Any:
    """A function measuring the model as it is now from band caches of the criterion's row sets; None, with a
    warning, when a replay does not reproduce the plain forward."""
    start = time.perf_counter()
    try:
        shortcut = band_entry(model, names, tail=True)
    except ValueError as err:
        warnings.warn(f"{err} Measuring the GROM path with full passes.", stacklevel=3)
        return None
    need_original = criterion.original is None
    sets = [(criterion.forget, not need_original and "first"), (criterion.holdout, False),
            (criterion.retain_validation, need_original), (criterion.generic, need_original)]
    at = 2 if need_original else 0

    def cache(entry: Any, rows: Any, keep: Any) -> BandCache | None:
        scorer = functools.partial(criterion._score, model, tokenizer, rows)
        return None if rows is None else BandCache(model, entry, scorer, cache_device, keep_plain=keep)

    for entry in [shortcut] + ([shortcut.plain] if shortcut.plain is not None else []):
        check = cache(entry, *sets[at])
        if check.replays_exactly():
            break
    else:
        warnings.warn(f"{type(model).__name__}: running the blocks from the edited band on cached hidden states does "
                      "not reproduce the plain forward; measuring the GROM path with full passes.", stacklevel=3)
        return None
    caches = [check if i == at else cache(entry, rows, keep) for i, (rows, keep) in enumerate(sets)]
    for c in caches:
        if c is not None:
            c.logits_mode = check.logits_mode
    if need_original:
        criterion.set_original_from_log_probs(caches[2].plain(), None if caches[3] is None else caches[3].plain())
    path.cache_bytes = sum(c.nbytes for c in caches if c is not None)
    path.cache_seconds = time.perf_counter() - start
    share = path.cache_seconds / len(path.points)

    def measure() -> dict[str, Any]:
        begin = time.perf_counter()
        out = criterion.measure_from_log_probs(*[None if c is None else c.current() for c in caches])
        out["seconds"] = time.perf_counter() - begin + share
        return out

    return measure


def _unique(values: Sequence[float], what: str) -> list[float]:
    out = list(dict.fromkeys(float(v) for v in values))
    if not out:
        raise ValueError(f"{what} must not be empty.")
    return out


def _path_grid(
    scales: Sequence[float], retain_weights: Sequence[float] | None, ridges: Sequence[float] | None, w0: float,
    mu0: float,
) -> tuple[list[float], list[float], list[float]]:
    """The validated, de-duplicated axes of a path (defaults from the base ``w_r0``, ``mu_0``)."""
    if retain_weights is None:
        retain_weights = [(w0 or 1.0) * f for f in DEFAULT_RETAIN_WEIGHT_FACTORS]
    axes = {"scales": _unique(scales, "scales"), "retain_weights": _unique(retain_weights, "retain_weights"),
            "ridges": _unique([mu0] if ridges is None else ridges, "ridges")}
    for what, values in axes.items():
        bad = [v for v in values if not math.isfinite(v) or v < 0 or (what == "scales" and v == 0)]
        if bad:
            raise ValueError(f"GROM path {what} must be finite and {'> 0' if what == 'scales' else '>= 0'}; got {bad}.")
    return axes["scales"], axes["retain_weights"], axes["ridges"]


def _preservation_from_factor(edit: GROMEdit) -> dict[str, torch.Tensor]:
    """Each module's ``R = L L^T - (w_f/s) X_f X_f^T - mu_0 I`` (float64), recovered from the fitted factor."""
    out = {}
    for name, sol in edit.solutions.items():
        xf = edit.forget_keys[name].to(device=sol.chol.device, dtype=torch.float64)
        part = sol.chol @ sol.chol.T - sol.forget_scale * (xf.T @ xf)
        part.diagonal().sub_(float(edit.config.ridge))
        out[name] = part
    return out


def unit_solution(
    base: GROMEdit, preservation: dict[str, torch.Tensor], retain_weight: float, ridge: float,
) -> dict[str, GROMSolution]:
    """Each module's exact solution at ``(retain_weight, ridge)`` and scale 1 (float64):
    ``A = (w_r / w_r0) R + (w_f/s) X_f X_f^T + mu I``, ``P^T = A^{-1} ((w_f/s) X_f D^T)``."""
    w0, mu0 = float(base.config.retain_weight), float(base.config.ridge)
    if retain_weight == w0 and ridge == mu0:
        return dict(base.solutions)
    solutions = {}
    for name, sol in base.solutions.items():
        xf = base.forget_keys[name].to(device=sol.chol.device, dtype=torch.float64)
        d = base.targets[name].to(device=xf.device, dtype=torch.float64)
        a = (xf.T @ xf).mul_(sol.forget_scale)  # in place: one d_in x d_in matrix besides R
        if retain_weight > 0:
            a.add_(preservation[name].to(a.device), alpha=retain_weight / (w0 or 1.0))
        if ridge:
            a.diagonal().add_(ridge)
        chol = cholesky_or_explain(a, ridge)
        delta = solve_with_factor(chol, sol.forget_scale * (xf.T @ d)).T.contiguous()
        solutions[name] = GROMSolution(delta=delta, chol=chol, forget_scale=sol.forget_scale)
    return solutions


def _point_edit(base: GROMEdit, solutions: dict[str, GROMSolution], point: dict[str, float]) -> GROMEdit:
    """The full edit of one ``point`` (``scale``, ``retain_weight``, ``ridge``) from its unit ``solutions``."""
    scale, retain_weight, w0 = point["scale"], point["retain_weight"], float(base.config.retain_weight) or 1.0
    point_solutions, deltas, targets = {}, {}, {}
    for name, sol in solutions.items():
        delta, d = sol.delta, base.targets[name].to(dtype=torch.float64)
        if scale != 1.0:
            delta, d = scale * delta, scale * d
        point_solutions[name] = GROMSolution(delta=delta, chol=sol.chol, forget_scale=sol.forget_scale)
        deltas[name] = delta.float().cpu()
        targets[name] = d
    stats = {k: v for k, v in base.stats.items() if k != "selection"}
    stats.update(target_scale=scale, path_point=dict(point))
    changes: dict[str, Any] = {"retain_weight": retain_weight, "ridge": point["ridge"]}
    has_generic = base.stats.get("num_generic_keys") and float(getattr(base.config, "generic_retain_weight", 0)) > 0
    if has_generic:  # the preservation term holds both moments: they scale together
        changes["generic_retain_weight"] = float(base.config.generic_retain_weight) * retain_weight / w0
    return dataclasses.replace(
        base, config=dataclasses.replace(base.config, **changes), deltas=deltas,
        solutions=point_solutions, forget_keys=dict(base.forget_keys), targets=targets, stats=stats,
        layer_scores=dict(base.layer_scores), selected_layers=list(base.selected_layers),
        retain_indices=list(base.retain_indices),
    )


def grom_path_from_edit(
    edit: GROMEdit, scales: Sequence[float] = DEFAULT_SCALES, retain_weights: Sequence[float] | None = None,
    ridges: Sequence[float] | None = None, *, preservation: dict[str, torch.Tensor] | None = None,
) -> GROMPath:
    """The path of every ``(scale, retain_weight, ridge)`` point, solved from an ``edit`` with its audit state;
    ``retain_weights`` default to ``w_r0`` times 1, 10 and 100, ``ridges`` to the edit's."""
    if not edit.solutions:
        raise ValueError("The GROM path needs an edit with its audit state (keys, targets and Cholesky factors).")
    w0, mu0 = float(edit.config.retain_weight), float(edit.config.ridge)
    scales, retain_weights, ridges = _path_grid(scales, retain_weights, ridges, w0, mu0)
    if w0 == 0 and any(w > 0 for w in retain_weights):
        raise ValueError("The base edit has retain_weight=0, so its normal matrix holds no retain moment to rescale; "
                         "fit it with a retain_weight > 0.")
    if preservation is None:
        preservation = _preservation_from_factor(edit)
    axes = list(itertools.product(retain_weights, ridges))
    units, unit_norms = [], []
    for w_r, mu in axes:
        solutions = unit_solution(edit, preservation, w_r, mu)
        units.append({n: s.delta.float() for n, s in solutions.items()})  # on the solve's (the model's) device
        unit_norms.append(float(sum(torch.stack([s.delta.norm() for s in solutions.values()]).tolist())))
        del solutions
    grid = [({"scale": scale, "retain_weight": w_r, "ridge": mu}, u, scale * unit_norms[u])
            for u, (w_r, mu) in enumerate(axes) for scale in scales]
    grid.sort(key=lambda item: item[2])  # stable: ties keep the grid's order

    def build(i: int) -> GROMEdit:
        point = grid[i][0]
        return _point_edit(edit, unit_solution(edit, preservation, point["retain_weight"], point["ridge"]), point)

    return GROMPath(points=[p for p, _, _ in grid], edits=_PointEdits(build, len(grid)),
                    norms=[n for _, _, n in grid], unit_deltas=units, point_units=[u for _, u, _ in grid],
                    point_scales=[p["scale"] for p, _, _ in grid], base=edit)


def fit_grom_path(
    model: Any, tokenizer: Any, forget: Any, retain: Any, config: GROMConfig | None = None, *,
    scales: Sequence[float] = DEFAULT_SCALES, retain_weights: Sequence[float] | None = None,
    ridges: Sequence[float] | None = None, generic_retain: Any = None, device: Any = None, gram_device: Any = None,
) -> GROMPath:
    """Fit GROM once and return the exact edits of every ``scales`` x ``retain_weights`` x ``ridges`` point
    (:func:`grom_path_from_edit`); the grid is validated before the fit."""
    config = config or GROMConfig()
    _path_grid(scales, retain_weights, ridges, float(config.retain_weight), float(config.ridge))  # before any work
    if config.retain_weight == 0 and (retain_weights is None or any(w > 0 for w in retain_weights)):
        config = dataclasses.replace(config, retain_weight=1.0)  # the collection is the same; A keeps X_r X_r^T
    edit, preservation = _fit_grom(model, tokenizer, forget, retain, config, generic_retain, device, gram_device,
                                   with_preservation=True)
    return grom_path_from_edit(edit, scales, retain_weights, ridges, preservation=preservation)
