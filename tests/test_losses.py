"""Baseline losses of hf_unlearn.methods.baselines.loss against slow per-example references on random tensors."""

from __future__ import annotations

import math

import pytest
import torch

from hf_unlearn.logprobs import answer_mask, label_log_probs
from hf_unlearn.methods.base.losses import kl_retain_loss, nll_loss, sequence_log_probs
from hf_unlearn.methods.baselines.loss import baseline_loss, grad_ascent_loss, npo_loss, simnpo_loss


def _random_batch(seed: int = 0, batch: int = 5, length: int = 9, vocab: int = 11):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, length, vocab, generator=g, dtype=torch.float64) * 2
    labels = torch.randint(0, vocab, (batch, length), generator=g)
    prompt = torch.randint(1, length - 2, (batch,), generator=g)
    pad = torch.randint(0, 3, (batch,), generator=g)
    for b in range(batch):
        labels[b, : prompt[b]] = -100
        if pad[b]:
            labels[b, length - pad[b] :] = -100
    return logits, labels


def _slow_token_log_probs(logits, labels):
    """Per example, per answer token: log softmax(logits[t-1])[labels[t]] as a list of lists of floats."""
    out = []
    for b in range(labels.shape[0]):
        row = []
        for t in range(1, labels.shape[1]):
            y = int(labels[b, t])
            if y == -100:
                continue
            z = [float(v) for v in logits[b, t - 1]]
            m = max(z)
            lse = m + math.log(sum(math.exp(v - m) for v in z))
            row.append(z[y] - lse)
        out.append(row)
    return out


def test_answer_mask_and_sequence_log_probs_match_slow_reference():
    logits, labels = _random_batch()
    lp = label_log_probs(logits, labels)
    mask = answer_mask(labels)
    slow = _slow_token_log_probs(logits, labels)
    assert mask.sum(-1).tolist() == [len(r) for r in slow]
    assert torch.allclose(sequence_log_probs(lp, mask), torch.tensor([sum(r) for r in slow], dtype=lp.dtype), atol=1e-5)


def test_nll_and_grad_ascent_match_slow_reference():
    logits, labels = _random_batch(1)
    lp, mask = label_log_probs(logits, labels), answer_mask(labels)
    slow = _slow_token_log_probs(logits, labels)
    n = sum(len(r) for r in slow)
    expected_nll = -sum(sum(r) for r in slow) / n
    assert nll_loss(lp, mask).item() == pytest.approx(expected_nll, rel=1e-5)
    assert grad_ascent_loss(lp, mask).item() == pytest.approx(-expected_nll, rel=1e-5)
    # an explicit denominator (accumulation-step total) replaces the batch count
    assert nll_loss(lp, mask, num_tokens=3 * n).item() == pytest.approx(expected_nll / 3, rel=1e-5)


def test_kl_retain_matches_slow_reference_and_is_zero_at_reference():
    logits, labels = _random_batch(2)
    ref_logits = logits + torch.randn(logits.shape, generator=torch.Generator().manual_seed(9), dtype=logits.dtype)
    total, count = 0.0, 0
    for b in range(labels.shape[0]):
        for t in range(1, labels.shape[1]):
            if int(labels[b, t]) == -100:
                continue
            p = torch.softmax(logits[b, t - 1], -1).tolist()
            q = torch.softmax(ref_logits[b, t - 1], -1).tolist()
            total += sum(qi * (math.log(qi) - math.log(pi)) for pi, qi in zip(p, q))
            count += 1
    assert kl_retain_loss(logits, ref_logits, labels).item() == pytest.approx(total / count, rel=1e-5)
    assert kl_retain_loss(logits, logits, labels).item() == pytest.approx(0.0, abs=1e-6)
    # direction: KL(ref || theta), not KL(theta || ref)
    assert kl_retain_loss(logits, ref_logits, labels).item() != pytest.approx(
        kl_retain_loss(ref_logits, logits, labels).item(), rel=1e-3
    )


def test_grad_diff_combines_forget_ascent_and_retain():
    logits, labels = _random_batch(3)
    lp, mask = label_log_probs(logits, labels), answer_mask(labels)
    slow = _slow_token_log_probs(logits, labels)
    mean_lp = sum(sum(r) for r in slow) / sum(len(r) for r in slow)
    retain = torch.tensor(0.7, dtype=torch.float64)
    got = baseline_loss("grad_ascent", lp, mask, retain, forget_weight=2.0, retain_weight=0.5)
    assert got.item() == pytest.approx(2.0 * mean_lp + 0.35, rel=1e-5)


@pytest.mark.parametrize("beta", [0.1, 1.0, 4.0])
def test_npo_matches_slow_reference(beta):
    g = torch.Generator().manual_seed(4)
    lp = -torch.rand(6, generator=g, dtype=torch.float64) * 40
    ref = -torch.rand(6, generator=g, dtype=torch.float64) * 40
    expected = sum(
        -(2 / beta) * math.log(1 / (1 + math.exp(beta * (a - r)))) for a, r in zip(lp.tolist(), ref.tolist())
    ) / 6
    assert npo_loss(lp, ref, beta).item() == pytest.approx(expected, rel=1e-6)
    # at theta == ref the loss is (2/beta) log 2, and it falls as the forget likelihood falls (right sign)
    assert npo_loss(ref, ref, beta).item() == pytest.approx(2 / beta * math.log(2), rel=1e-6)
    assert npo_loss(ref - 5, ref, beta).item() < npo_loss(ref, ref, beta).item()


def test_npo_gradient_is_gradient_ascent_weighted_by_sigmoid():
    lp = torch.tensor([-3.0, -10.0], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([-5.0, -4.0], dtype=torch.float64)
    beta = 0.5
    npo_loss(lp, ref, beta).backward()
    # d/dlp of -(2/beta) log sigmoid(-beta (lp - ref)) / B  =  2 sigmoid(beta (lp - ref)) / B
    expected = [2 / (1 + math.exp(-beta * (a - r))) / 2 for a, r in zip([-3.0, -10.0], [-5.0, -4.0])]
    assert lp.grad.tolist() == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("beta,delta", [(4.5, 0.0), (2.5, 1.0), (0.5, -0.5)])
def test_simnpo_matches_slow_reference(beta, delta):
    logits, labels = _random_batch(5)
    lp, mask = label_log_probs(logits, labels), answer_mask(labels)
    slow = _slow_token_log_probs(logits, labels)
    expected = 0.0
    for row in slow:
        x = -beta * sum(row) / len(row) - delta
        expected += -(2 / beta) * math.log(1 / (1 + math.exp(-x)))
    expected /= len(slow)
    got = simnpo_loss(sequence_log_probs(lp, mask), mask.sum(-1), beta, delta)
    assert got.item() == pytest.approx(expected, rel=1e-5)
    # sequence-level denominators: the sum divided by an accumulation-step total
    got_sum = simnpo_loss(sequence_log_probs(lp, mask), mask.sum(-1), beta, delta, num_sequences=10)
    assert got_sum.item() == pytest.approx(expected * len(slow) / 10, rel=1e-5)


@pytest.mark.parametrize("fn", ["npo", "simnpo"])
def test_non_positive_beta_is_refused(fn):
    lp = torch.tensor([-1.0])
    with pytest.raises(ValueError, match="beta > 0"):
        npo_loss(lp, lp, 0.0) if fn == "npo" else simnpo_loss(lp, torch.tensor([3]), -1.0)
