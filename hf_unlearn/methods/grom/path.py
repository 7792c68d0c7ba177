"""GROM's exact strength path: many edits from one key collection.

``A = (w_r/r) X_r X_r^T + (w_f/s) X_f X_f^T + mu I`` does not depend on the targets ``D``, so scaling the
targets by ``c`` scales the edit exactly:

    P(c D) = (w_f/s) (c D) X_f^T A^{-1} = c P(D).

Changing ``w_r`` or ``mu`` changes only ``A``; its retain part is recovered from the fitted edit's Cholesky
factor ``L`` (``A_0 = L L^T``) as

    R = (w_r0/r) X_r X_r^T = A_0 - (w_f/s) X_f X_f^T - mu_0 I,

and each ``(w_r, mu)`` point is one ``d_in x d_in`` Cholesky solve of

    A(w_r, mu) = (w_r / w_r0) R + (w_f/s) X_f X_f^T + mu I,    P = (w_f/s) D X_f^T A(w_r, mu)^{-1}.

With general rows (``fit_grom(..., generic_retain=rows)``) ``R`` also holds ``(w_g0/g) X_g X_g^T``; the retain
axis then scales both preservation terms together, so a point's config records
``generic_retain_weight = w_g0 w_r / w_r0`` and the point is the exact fit of that config.

:func:`fit_grom_path` runs one :func:`~hf_unlearn.methods.grom.fit_grom` (one key collection; nothing of the targets or
the layer band depends on ``w_r``, ``mu`` or the scale) and solves every other point from it. Each point is a
full :class:`~hf_unlearn.methods.grom.GROMEdit` (it saves, pushes, exports and audits as a fitted one); a scaled point
records its ``target_scale`` in ``stats``. :meth:`GROMPath.select` measures a
:class:`~hf_unlearn.selection.SelectionCriterion` on every point and returns the chosen edit with the
:class:`~hf_unlearn.selection.SelectionRecord` in ``stats["selection"]`` (so ``grom_metadata.json`` and the
model card carry it).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .config import GROMConfig
from .model import GROMEdit, fit_grom
from .solve import GROMSolution, cholesky_or_explain

DEFAULT_SCALES = (0.25, 0.5, 1.0)
DEFAULT_RETAIN_WEIGHT_FACTORS = (1.0, 10.0, 100.0)


@dataclass
class GROMPath:
    """Exact GROM edits at several strengths: ``points[i]`` (``{"scale", "retain_weight", "ridge"}``) and
    ``edits[i]`` the :class:`~hf_unlearn.methods.grom.GROMEdit` of that point, ordered weak -> strong by the edit's size
    ``sum_m ||P_m||_F``. ``record`` is set by :meth:`select`."""

    points: list[dict[str, float]]
    edits: list[GROMEdit]
    record: Any = None
    norms: list[float] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.points)

    def select(self, criterion: Any, model: Any, tokenizer: Any) -> GROMEdit:
        """Measure ``criterion`` (a :class:`~hf_unlearn.selection.SelectionCriterion`) on ``model`` with each
        edit applied in turn and return the edit its rule chooses.

        ``model`` must be the unedited base the path was fitted on; its edited weights are restored exactly
        after each measurement. The original model's figures are measured first when the criterion has none.
        The record goes to :attr:`record` and to the chosen edit's ``stats["selection"]``.
        """
        if not self.edits:
            raise ValueError("The GROM path is empty.")
        self.edits[0].verify_base(model)
        if criterion.original is None:
            criterion.measure_original(model, tokenizer)
        modules = dict(model.named_modules())
        names = sorted({n for e in self.edits for n in e.deltas})
        saved = {n: modules[n].weight.detach().clone() for n in names}
        measurements = []
        try:
            for edit in self.edits:
                edit.apply_(model)
                try:
                    measurements.append(criterion.measure(model, tokenizer))
                finally:
                    with torch.no_grad():
                        for n in names:
                            modules[n].weight.copy_(saved[n])
        finally:
            with torch.no_grad():
                for n in names:
                    modules[n].weight.copy_(saved[n])
        candidates = [{**p, "edit_norm": norm} for p, norm in zip(self.points, self.norms or [None] * len(self))]
        self.record = criterion.decide(candidates, measurements)
        chosen = self.edits[self.record.index]
        chosen.stats["selection"] = self.record.to_dict()
        return chosen


def _unique(values: Sequence[float], what: str) -> list[float]:
    out = list(dict.fromkeys(float(v) for v in values))
    if not out:
        raise ValueError(f"{what} must not be empty.")
    return out


def _path_grid(
    scales: Sequence[float], retain_weights: Sequence[float] | None, ridges: Sequence[float] | None, w0: float,
    mu0: float,
) -> tuple[list[float], list[float], list[float]]:
    """The validated, de-duplicated axes of a path (defaults filled in from the base ``w_r0``, ``mu_0``)."""
    if retain_weights is None:
        retain_weights = [(w0 or 1.0) * f for f in DEFAULT_RETAIN_WEIGHT_FACTORS]
    axes = {"scales": _unique(scales, "scales"), "retain_weights": _unique(retain_weights, "retain_weights"),
            "ridges": _unique([mu0] if ridges is None else ridges, "ridges")}
    for what, values in axes.items():
        bad = [v for v in values if not math.isfinite(v) or v < 0 or (what == "scales" and v == 0)]
        if bad:
            raise ValueError(f"GROM path {what} must be finite and {'> 0' if what == 'scales' else '>= 0'}; got {bad}.")
    return axes["scales"], axes["retain_weights"], axes["ridges"]


def _has_generic(edit: GROMEdit) -> bool:
    """Whether the edit's normal matrix holds a general-rows term ``(w_g/g) X_g X_g^T``."""
    return bool(edit.stats.get("num_generic_keys")) and float(getattr(edit.config, "generic_retain_weight", 0)) > 0


def _point_edit(
    base: GROMEdit, config: GROMConfig, retain_parts: dict[str, torch.Tensor], retain_weight: float, ridge: float,
    scale: float, base_retain_weight: float,
) -> GROMEdit:
    solutions, deltas, targets = {}, {}, {}
    for name, sol in base.solutions.items():
        xf = base.forget_keys[name].to(torch.float64)
        d = base.targets[name].to(device=xf.device, dtype=torch.float64)
        c_f = sol.forget_scale
        a = c_f * (xf.T @ xf)
        if retain_weight > 0:
            a = a + (retain_weight / base_retain_weight) * retain_parts[name].to(xf.device)
        if ridge:
            a = a + ridge * torch.eye(a.shape[0], dtype=torch.float64, device=a.device)
        chol = cholesky_or_explain(a, ridge)
        delta = torch.cholesky_solve(c_f * (xf.T @ d), chol).T.contiguous()
        if scale != 1.0:
            delta, d = scale * delta, scale * d
        solutions[name] = GROMSolution(delta=delta, chol=chol, forget_scale=c_f)
        deltas[name] = delta.float().cpu()
        targets[name] = d
    stats = {k: v for k, v in base.stats.items() if k != "selection"}
    stats.update(target_scale=scale, path_point={"scale": scale, "retain_weight": retain_weight, "ridge": ridge})
    changes: dict[str, Any] = {"retain_weight": retain_weight, "ridge": ridge}
    if _has_generic(base):  # the recovered preservation term holds both moments: they scale together
        changes["generic_retain_weight"] = float(config.generic_retain_weight) * retain_weight / base_retain_weight
    return dataclasses.replace(
        base, config=dataclasses.replace(config, **changes), deltas=deltas,
        solutions=solutions, forget_keys=dict(base.forget_keys), targets=targets, stats=stats,
        layer_scores=dict(base.layer_scores), selected_layers=list(base.selected_layers),
        retain_indices=list(base.retain_indices),
    )


def grom_path_from_edit(
    edit: GROMEdit,
    scales: Sequence[float] = DEFAULT_SCALES,
    retain_weights: Sequence[float] | None = None,
    ridges: Sequence[float] | None = None,
) -> GROMPath:
    """The path of every ``(scale, retain_weight, ridge)`` combination, solved from a fitted ``edit`` (which must
    carry its audit state) without reading any data again. ``retain_weights`` defaults to ``w_r0`` times
    1, 10 and 100 (``w_r0`` the edit's retain weight, or 1 when it is 0), ``ridges`` to the edit's ridge."""
    if not edit.solutions:
        raise ValueError("The GROM path needs an edit with its audit state (keys, targets and Cholesky factors).")
    config = edit.config
    w0, mu0 = float(config.retain_weight), float(config.ridge)
    scales, retain_weights, ridges = _path_grid(scales, retain_weights, ridges, w0, mu0)
    if w0 == 0 and any(w > 0 for w in retain_weights):
        raise ValueError("The base edit has retain_weight=0, so its normal matrix holds no retain moment to rescale; "
                         "fit it with a retain_weight > 0.")
    retain_parts = {}
    for name, sol in edit.solutions.items():
        xf = edit.forget_keys[name].to(device=sol.chol.device, dtype=torch.float64)
        a0 = sol.chol @ sol.chol.T
        part = a0 - sol.forget_scale * (xf.T @ xf)
        if mu0:
            part = part - mu0 * torch.eye(part.shape[0], dtype=torch.float64, device=part.device)
        retain_parts[name] = part
    points, edits, norms = [], [], []
    for w_r, mu, scale in itertools.product(retain_weights, ridges, scales):
        point_edit = _point_edit(edit, config, retain_parts, w_r, mu, scale, w0 or 1.0)
        points.append({"scale": scale, "retain_weight": w_r, "ridge": mu})
        edits.append(point_edit)
        norms.append(float(sum(float(s.delta.norm()) for s in point_edit.solutions.values())))
    order = sorted(range(len(points)), key=lambda i: (norms[i], i))
    return GROMPath(points=[points[i] for i in order], edits=[edits[i] for i in order],
                    norms=[norms[i] for i in order])


def fit_grom_path(
    model: Any,
    tokenizer: Any,
    forget: Any,
    retain: Any,
    config: GROMConfig | None = None,
    *,
    scales: Sequence[float] = DEFAULT_SCALES,
    retain_weights: Sequence[float] | None = None,
    ridges: Sequence[float] | None = None,
    generic_retain: Any = None,
) -> GROMPath:
    """Fit GROM once (``config``; its keys, targets and band) and return the exact edits of every combination of
    ``scales`` x ``retain_weights`` x ``ridges`` (see :func:`grom_path_from_edit` for the defaults: 9 points),
    ordered weak -> strong. ``model`` is not modified; ``generic_retain`` goes to ``fit_grom``. A point equals
    ``fit_grom`` with ``retain_weight``/``ridge`` replaced (up to float rounding), its targets times ``scale``. The
    grid is validated before the fit."""
    config = config or GROMConfig()
    _path_grid(scales, retain_weights, ridges, float(config.retain_weight), float(config.ridge))  # before any work
    if config.retain_weight == 0 and (retain_weights is None or any(w > 0 for w in retain_weights)):
        config = dataclasses.replace(config, retain_weight=1.0)  # the collection is the same; A keeps X_r X_r^T
    extra = {} if generic_retain is None else {"generic_retain": generic_retain}
    edit = fit_grom(model, tokenizer, forget, retain, config, **extra)
    return grom_path_from_edit(edit, scales, retain_weights, ridges)
