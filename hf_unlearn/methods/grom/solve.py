"""GROM's closed-form solve and exact leave-one-out audit: pure float64 tensor functions.

Keys are stored as rows: ``forget_keys = X_f^T`` (``[s, d_in]``), ``targets = D^T`` (``[s, d_out]``); ``X_r X_r^T``
and ``X_g X_g^T`` are the uncentred second moments of ``r`` retain and ``g`` general keys. The edit ``P`` of
``y = W x`` minimises

    L(P) = (w_f/s) ||P X_f - D||_F^2 + (w_r/r) ||P X_r||_F^2 + (w_g/g) ||P X_g||_F^2 + mu ||P||_F^2,

    P* = (w_f/s) D X_f^T A^{-1},   A = (w_r/r) X_r X_r^T + (w_g/g) X_g X_g^T + (w_f/s) X_f X_f^T + mu I.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class GROMSolution:
    """``P`` (float64 ``[d_out, d_in]``), the Cholesky factor ``L`` of ``A`` and the forget weight ``c_f``."""

    delta: torch.Tensor
    chol: torch.Tensor
    forget_scale: float


def normal_matrix(
    retain_moment: torch.Tensor, num_retain: int, forget_keys: torch.Tensor, forget_weight: float,
    retain_weight: float, ridge: float, generic_moment: torch.Tensor | None = None, num_generic: int = 0,
    generic_weight: float = 0.0,
) -> torch.Tensor:
    """``A`` in float64 (a term with a zero count or weight is left out)."""
    xf = forget_keys.to(torch.float64)
    s, d = xf.shape
    if s == 0:
        raise ValueError("No forget keys: the forget set has no answer tokens to unlearn.")
    a = (xf.T @ xf).mul_(forget_weight / s)  # in place: one d_in x d_in matrix besides the moments
    if num_retain > 0 and retain_weight > 0:
        a.add_(retain_moment.to(device=a.device, dtype=torch.float64), alpha=retain_weight / num_retain)
    if generic_moment is not None and num_generic > 0 and generic_weight > 0:
        a.add_(generic_moment.to(device=a.device, dtype=torch.float64), alpha=generic_weight / num_generic)
    if ridge:
        a.diagonal().add_(ridge)
    return a


def suggested_ridge(a: torch.Tensor) -> float:
    """``1e-3 * trace(A) / d`` (or ``1e-3`` if ``A = 0``): a ridge that makes ``A`` well conditioned."""
    scale = float(torch.diagonal(a).mean())
    return 1e-3 * scale if scale > 0 else 1e-3


def cholesky_or_explain(a: torch.Tensor, ridge: float) -> torch.Tensor:
    """Lower Cholesky factor of ``A``; a ``ValueError`` suggesting a ridge when ``A`` is singular."""
    a = a.to(torch.float64)
    if not bool(torch.isfinite(a).all()):
        raise ValueError(f"The GROM normal matrix A has non-finite entries (ridge={ridge}, or non-finite keys from a "
                         "model in half precision).")
    singular = False
    if ridge <= 0:
        eig = torch.linalg.eigvalsh(a)
        singular = bool(eig[0] <= 1e-10 * max(float(eig[-1]), 1e-300))
    chol, info = torch.linalg.cholesky_ex(a)
    if singular or int(info) != 0:
        raise ValueError(f"The GROM normal matrix A ({a.shape[0]}x{a.shape[0]}) is singular with ridge={ridge}; set "
                         f"a ridge > 0, e.g. GROMConfig(ridge={suggested_ridge(a):.3g}).")
    return chol


def solve_grom(
    retain_moment: torch.Tensor, num_retain: int, forget_keys: torch.Tensor, targets: torch.Tensor,
    forget_weight: float = 1.0, retain_weight: float = 1.0, ridge: float = 1e-2,
    generic_moment: torch.Tensor | None = None, num_generic: int = 0, generic_weight: float = 0.0,
) -> GROMSolution:
    """``P* = (w_f/s) D X_f^T A^{-1}`` by a float64 Cholesky solve of ``A P^T = (w_f/s) X_f D^T``."""
    xf = forget_keys.to(torch.float64)
    dt = targets.to(device=xf.device, dtype=torch.float64)
    if dt.shape[0] != xf.shape[0]:
        raise ValueError(f"{xf.shape[0]} forget keys but {dt.shape[0]} targets.")
    a = normal_matrix(retain_moment.to(xf.device), num_retain, xf, forget_weight, retain_weight, ridge,
                      generic_moment, num_generic, generic_weight)
    chol = cholesky_or_explain(a, ridge)
    c_f = forget_weight / xf.shape[0]
    return GROMSolution(delta=delta_from_cholesky(chol, xf, dt, c_f), chol=chol, forget_scale=c_f)


def solve_with_factor(chol: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """``A^{-1} B`` from the lower Cholesky factor ``L`` of ``A = L L^T``: ``L Y = B``, then ``L^T X = Y``, by two
    triangular solves, which read ``L`` in place (``torch.cholesky_solve`` copies it: one more ``d x d`` matrix)."""
    return torch.linalg.solve_triangular(chol.mT, torch.linalg.solve_triangular(chol, rhs, upper=False), upper=True)


def delta_from_cholesky(chol: torch.Tensor, forget_keys: torch.Tensor, targets: torch.Tensor,
                        forget_scale: float) -> torch.Tensor:
    """``P = (A^{-1} (c_f X_f D^T))^T`` (float64 ``[d_out, d_in]``) from the lower Cholesky factor of ``A``."""
    xf = forget_keys.to(device=chol.device, dtype=torch.float64)
    rhs = forget_scale * (xf.T @ targets.to(device=chol.device, dtype=torch.float64))  # [d_in, d_out]
    return solve_with_factor(chol, rhs).T.contiguous()


def low_rank_form(solution: GROMSolution, forget_keys: torch.Tensor, targets: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(B_0, A_0)`` with ``P = B_0 A_0`` exactly: ``B_0 = c_f D`` (``[d_out, s]``), ``A_0 = (A^{-1} X_f)^T``."""
    chol = solution.chol
    xf = forget_keys.to(device=chol.device, dtype=torch.float64)
    left = solution.forget_scale * targets.to(device=chol.device, dtype=torch.float64).T
    return left, solve_with_factor(chol, xf.T).T


def woodbury_drop(solution: GROMSolution, keys_i: torch.Tensor, targets_i: torch.Tensor) -> torch.Tensor:
    """Exact change of ``P`` when the ``k`` keys ``X_i`` (``[k, d_in]``) and targets ``D_i`` of one forget example
    leave the objective, ``c = w_f/s`` held fixed (Sherman-Morrison-Woodbury on ``A' = A - c X_i X_i^T``):

        P' - P = c (P X_i - D_i) K^{-1} (A^{-1} X_i)^T,    K = I_k - c X_i^T A^{-1} X_i.
    """
    xi = keys_i.to(device=solution.chol.device, dtype=torch.float64).T  # [d_in, k]
    di = targets_i.to(device=solution.chol.device, dtype=torch.float64).T  # [d_out, k]
    if xi.shape[1] == 0:
        return torch.zeros_like(solution.delta)
    c = solution.forget_scale
    z = solve_with_factor(solution.chol, xi)  # A^{-1} X_i
    k = torch.eye(xi.shape[1], dtype=torch.float64, device=xi.device) - c * (xi.T @ z)
    resid = solution.delta @ xi - di  # P X_i - D_i, [d_out, k]
    return c * torch.linalg.solve(k, resid.T).T @ z.T
