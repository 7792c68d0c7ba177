"""RMU's objective as pure tensor functions: the control vector, the masked hidden-state MSE and their weighted
sum (:func:`rmu_loss`). Conventions: :mod:`hf_unlearn.methods.base.losses`.

Source: Li et al. 2024, "The WMDP Benchmark: Measuring and Reducing Malicious Use With Unlearning" (arXiv
2403.03218), section 5 (RMU); the TOFU implementation of open-unlearning, ``src/trainer/unlearn/rmu.py``
(``compute_activation_loss``, ``get_control_vector``) with ``configs/trainer/RMU.yaml``.
"""

from __future__ import annotations

import torch

from ..base.losses import _denominator

__all__ = ["activation_mse", "rmu_control_vector", "rmu_loss"]


def rmu_control_vector(hidden_size: int, steering_coeff: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """The fixed target of the forget hidden states: ``c * u / ||u||`` with ``u ~ U[0, 1)^H`` -> ``[H]`` float32.

    As in open-unlearning's ``get_control_vector`` and the WMDP authors' code (``torch.rand``: uniform on
    ``[0, 1)``, not Gaussian, so every coordinate is non-negative), normalised to unit length and scaled by
    ``steering_coeff``. Here ``u`` comes from ``generator`` (the trainer seeds it with the run's ``seed``), where
    open-unlearning draws it from the global RNG at the first step.
    """
    if hidden_size < 1:
        raise ValueError(f"hidden_size must be >= 1, got {hidden_size}.")
    if not steering_coeff > 0:
        raise ValueError(f"steering_coeff must be > 0, got {steering_coeff}.")
    u = torch.rand(hidden_size, generator=generator, dtype=torch.float32)
    return steering_coeff * u / u.norm()


def activation_mse(
    activations: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    num_sequences: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Mean squared error of hidden states over the answer positions, averaged per sequence.

    ``L = (1/S) * sum_b [ sum_t mask_{b,t} * (1/H) * sum_d (a_{b,t,d} - c_{b,t,d})^2 ] / max(1, sum_t mask_{b,t})``

    ``activations`` is ``[B, L, H]``, ``targets`` broadcasts to it (a ``[H]`` control vector, or the frozen
    model's ``[B, L, H]`` hidden states), ``mask`` the ``[B, L]`` answer mask (the hidden states *at* the answer
    tokens' positions, as open-unlearning's ``labels != -100``) and ``S = num_sequences`` (default ``B``): the
    mean over the hidden dimension, over each sequence's answer tokens and over sequences, computed in float32;
    a sequence without answer tokens adds 0 (there it would divide by zero).

    This is the per-sequence mean the WMDP formulation intends, and the form the package and its benchmark run.
    open-unlearning's ``compute_activation_loss`` differs when a batch's answers differ in length: with
    ``s_b = sum_t mask_{b,t} * (1/H) * sum_d (a - c)^2`` and ``n_b`` the answer tokens of sequence ``b``, it
    divides the ``[B]`` sums by the ``[B, 1]`` counts, which broadcasts to a ``[B, B]`` matrix
    ``s_j / n_i`` whose mean is ``mean_b(s_b) * mean_b(1/n_b)``. Each sequence's sum is then scaled by the
    batch's mean inverse length rather than by its own length, so a long answer weighs more than a short one
    (by its length); the two forms agree when every answer in the batch has the same number of tokens.
    """
    diff = (activations.float() - targets.to(device=activations.device, dtype=torch.float32)) ** 2
    per_token = diff.mean(-1) * mask
    per_sequence = per_token.sum(-1) / mask.sum(-1).clamp(min=1)
    return per_sequence.sum() / _denominator(num_sequences, activations.new_tensor(float(activations.shape[0])))


def rmu_loss(
    forget_activations: torch.Tensor,
    control_vector: torch.Tensor,
    forget_mask: torch.Tensor,
    retain_activations: torch.Tensor | None = None,
    ref_retain_activations: torch.Tensor | None = None,
    retain_mask: torch.Tensor | None = None,
    *,
    forget_weight: float = 1.0,
    retain_weight: float = 1.0,
    num_forget_sequences: torch.Tensor | float | None = None,
    num_retain_sequences: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """The RMU objective (WMDP, eq. 1-3; open-unlearning's ``RMU.compute_loss`` with ``retain_loss_type:
    EMBED_DIFF``):

    ``L = forget_weight * MSE(h_l(x_f), c * u) + retain_weight * MSE(h_l(x_r), h0_l(x_r))``

    both terms :func:`activation_mse`: ``h_l`` the trained model's hidden states at layer ``l`` (``[B, L, H]``),
    ``c * u`` the fixed control vector (:func:`rmu_control_vector`, ``[H]``), ``h0_l`` the frozen starting model's
    hidden states on the retain batch. Without retain activations (``retain_weight == 0`` or no retain batch) the
    retain term is left out. The WMDP paper writes the squared L2 norm (a sum over the hidden dimension);
    open-unlearning (and this function) take the mean over it, which divides both terms by ``H``.
    """
    loss = forget_weight * activation_mse(forget_activations, control_vector, forget_mask, num_forget_sequences)
    if retain_activations is not None:
        if ref_retain_activations is None or retain_mask is None:
            raise ValueError("The RMU retain term needs the frozen model's retain activations and the retain mask.")
        loss = loss + retain_weight * activation_mse(
            retain_activations, ref_retain_activations, retain_mask, num_retain_sequences)
    return loss
