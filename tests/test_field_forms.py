"""Where the package's KL retain term and RMU activation loss differ from open-unlearning's forms, as their
docstrings say: each reference form written out from its formula."""

import torch

from hf_unlearn.methods.base.losses import kl_retain_loss
from hf_unlearn.methods.rmu.loss import activation_mse


def _broadcast_activation_loss(a, c, mask):
    """``mean over the [B, B] matrix s_j / n_i`` = ``mean_b(s_b) * mean_b(1/n_b)``."""
    sums = (((a - c) ** 2).mean(-1) * mask).sum(-1)
    return (sums[None, :] / mask.sum(-1)[:, None]).mean()


def _every_position_kl(logits, ref_logits):
    """``sum over every (b, t) of KL(ref || theta) / (B * L)``."""
    log_p, log_ref = torch.log_softmax(logits, -1), torch.log_softmax(ref_logits, -1)
    return (log_ref.exp() * (log_ref - log_p)).sum() / (logits.shape[0] * logits.shape[1])


def test_activation_mse_equals_the_broadcast_form_only_for_equal_answer_lengths():
    g = torch.Generator().manual_seed(0)
    a, c = torch.randn(3, 6, 4, generator=g), torch.randn(4, generator=g)
    equal = torch.tensor([[0, 1, 1, 1, 0, 0]] * 3, dtype=torch.float32)
    torch.testing.assert_close(activation_mse(a, c, equal), _broadcast_activation_loss(a, c, equal))
    unequal = torch.tensor([[0, 1, 0, 0, 0, 0], [0, 1, 1, 1, 1, 1], [0, 1, 1, 0, 0, 0]], dtype=torch.float32)
    per_sequence = ((((a - c) ** 2).mean(-1) * unequal).sum(-1) / unequal.sum(-1)).mean()
    torch.testing.assert_close(activation_mse(a, c, unequal), per_sequence)
    assert abs(activation_mse(a, c, unequal) - _broadcast_activation_loss(a, c, unequal)) > 1e-2


def test_kl_retain_loss_averages_over_answer_positions_not_every_position():
    g = torch.Generator().manual_seed(1)
    logits, ref = torch.randn(2, 7, 5, generator=g), torch.randn(2, 7, 5, generator=g)
    labels = torch.full((2, 7), -100)
    labels[:, 4:] = 1  # positions 3..5 predict the answer tokens at 4..6
    per_position = (torch.log_softmax(ref, -1).exp() * (torch.log_softmax(ref, -1) - torch.log_softmax(logits, -1))).sum(-1)
    torch.testing.assert_close(kl_retain_loss(logits, ref, labels), per_position[:, 3:6].mean())
    assert abs(kl_retain_loss(logits, ref, labels) - _every_position_kl(logits, ref)) > 1e-3
