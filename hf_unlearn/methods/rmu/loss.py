"""RMU's objective as pure tensor functions (Li et al. 2024, WMDP, arXiv 2403.03218, section 5): the control
vector, the masked hidden-state MSE and their weighted sum. Conventions: :mod:`hf_unlearn.methods.base.losses`.
"""

from __future__ import annotations

import torch

from ..base.losses import _denominator


def rmu_control_vector(hidden_size: int, steering_coeff: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """The fixed target of the forget hidden states: ``c * u / ||u||`` with ``u ~ U[0, 1)^H`` drawn from
    ``generator`` (uniform as in the WMDP authors' code) -> ``[H]`` float32."""
    if hidden_size < 1:
        raise ValueError(f"hidden_size must be >= 1, got {hidden_size}.")
    if not steering_coeff > 0:
        raise ValueError(f"steering_coeff must be > 0, got {steering_coeff}.")
    u = torch.rand(hidden_size, generator=generator, dtype=torch.float32)
    return steering_coeff * u / u.norm()


def activation_mse(
    activations: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor,
    num_sequences: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Mean squared error of hidden states over the answer positions, averaged per sequence.

    ``L = (1/S) * sum_b [ sum_t mask_{b,t} * (1/H) * sum_d (a_{b,t,d} - c_{b,t,d})^2 ] / max(1, sum_t mask_{b,t})``

    ``activations``: ``[B, L, H]``, ``targets`` broadcast to it, ``S = num_sequences``; in float32, a sequence
    without answer tokens adds 0. Deviation: open-unlearning's ``compute_activation_loss`` broadcasts ``[B]`` sums
    against ``[B, 1]`` counts, ``mean_b(s_b) * mean_b(1/n_b)``, which weighs sequences by length when a batch's
    answers differ; this per-sequence mean is what the package and its benchmark run (``docs/methods/rmu.md``).
    """
    diff = (activations.float() - targets.to(device=activations.device, dtype=torch.float32)) ** 2
    per_token = diff.mean(-1) * mask
    per_sequence = per_token.sum(-1) / mask.sum(-1).clamp(min=1)
    return per_sequence.sum() / _denominator(num_sequences, activations.new_tensor(float(activations.shape[0])))


def rmu_loss(
    forget_activations: torch.Tensor, control_vector: torch.Tensor, forget_mask: torch.Tensor,
    retain_activations: torch.Tensor | None = None, ref_retain_activations: torch.Tensor | None = None,
    retain_mask: torch.Tensor | None = None, *, forget_weight: float = 1.0, retain_weight: float = 1.0,
    num_forget_sequences: torch.Tensor | float | None = None,
    num_retain_sequences: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """The RMU objective (WMDP, eq. 1-3), both terms :func:`activation_mse`:

    ``L = forget_weight * MSE(h_l(x_f), c * u) + retain_weight * MSE(h_l(x_r), h0_l(x_r))``

    ``h_l``: hidden states at layer ``l``, ``c * u``: :func:`rmu_control_vector`, ``h0_l``: the frozen model's;
    without retain activations the retain term is left out. The MSE is a mean over the hidden dimension (as
    open-unlearning), not the paper's sum.
    """
    loss = forget_weight * activation_mse(forget_activations, control_vector, forget_mask, num_forget_sequences)
    if retain_activations is not None:
        if ref_retain_activations is None or retain_mask is None:
            raise ValueError("The RMU retain term needs the frozen model's retain activations and the retain mask.")
        loss = loss + retain_weight * activation_mse(
            retain_activations, ref_retain_activations, retain_mask, num_retain_sequences)
    return loss
