"""T3's calibration judges retain damage by what the tilted greedy decoding changes: the greedy regret against a
slow reference, zero for points greedy-identical to the base, positive for a point that changes the retain
answers, equal for greedy-equivalent points; tempering's exact effect on TOFU's truth ratio, on constructed
distributions."""

from __future__ import annotations

import math

import pytest
import torch

from hf_unlearn.methods.t3.scoring import candidate_answer_log_probs
from hf_unlearn.methods.t3.tilt import greedy_regret


def _slow_regret(base, guidance, temperature, tilt_weight):
    out = []
    for z, g in zip(base.tolist(), guidance.tolist()):
        lse = math.log(sum(math.exp(v) for v in z))
        log_p = [v - lse for v in z]
        s = [lp / temperature + tilt_weight * -math.log1p(math.exp(-x)) for lp, x in zip(log_p, g)]
        picked = max(range(len(s)), key=lambda v: (s[v], -v))
        out.append(max(log_p) - log_p[picked])
    return out


def test_greedy_regret_equals_its_slow_reference():
    torch.manual_seed(0)
    base, guidance = torch.randn(7, 11) * 3, torch.randn(7, 11) * 2
    settings = [(1.0, 0.0), (2.0, 0.0), (1.0, 1.0), (2.5, 2.0)]
    got = greedy_regret(base, guidance, settings)
    for k, (t, w) in enumerate(settings):
        assert got[:, k].tolist() == pytest.approx(_slow_regret(base, guidance, t, w), abs=1e-5)


def test_retain_measure_leaves_greedy_identical_points_alone_and_penalises_changed_answers():
    # four retain positions, the base sure of its answer token 0; the head dislikes token 0 at the last position
    base = torch.tensor([[4.0, 1.0, 0.0, -1.0]] * 4)
    guidance = torch.full((4, 4), 3.0)
    guidance[3, 0] = -6.0
    gold = torch.zeros(4, dtype=torch.long)
    settings = [(1.0, 0.0), (2.5, 0.0), (2.0, 0.25), (1.0, 0.5), (1.0, 2.0)]
    regret = greedy_regret(base, guidance, settings)
    nll = -candidate_answer_log_probs(base, guidance, gold, settings)
    # tempering alone: the teacher-forced NLL rises by construction, the greedy answers do not change
    assert nll[:, 1].mean() > nll[:, 0].mean() + 0.3
    assert regret[:, 1].abs().max() == 0 and regret[:, 0].abs().max() == 0
    # (2, 0.25) decodes greedily as (1, 0.5): the same regret, here none (the tilt is too weak to flip the answer)
    assert regret[:, 2].tolist() == pytest.approx(regret[:, 3].tolist(), abs=1e-6)
    assert regret[:, 2].abs().max() == 0
    # a tilt that changes the last retain answer is penalised by the base's log-probability it gives up
    log_p = torch.log_softmax(base[3], -1)
    assert regret[3, 4] == pytest.approx(float(log_p[0] - log_p[1]), abs=1e-5) and regret[:3, 4].abs().max() == 0


def test_tempering_shrinks_the_log_truth_ratio_by_t_on_shared_normalisers():
    """TOFU's truth ratio ``exp(loss_para - mean loss_pert)`` with per-token losses: where the paraphrased and the
    perturbed answer tokens are scored under the same next-token distributions, tempering divides ``log tr`` by
    ``T`` exactly (the normaliser cancels), so ``T > 1`` moves every truth ratio towards 1 by construction."""
    torch.manual_seed(1)
    logits = torch.randn(6, 9) * 4  # six positions shared by both answers
    para, pert = torch.randint(0, 9, (6,)), torch.randint(0, 9, (6,))
    zeros = torch.zeros_like(logits)
    for temperature in (1.5, 2.5):
        settings = [(1.0, 0.0), (temperature, 0.0)]
        loss_para = -candidate_answer_log_probs(logits, zeros, para, settings).mean(0)
        loss_pert = -candidate_answer_log_probs(logits, zeros, pert, settings).mean(0)
        log_tr = loss_para - loss_pert
        assert float(log_tr[1]) == pytest.approx(float(log_tr[0]) / temperature, rel=1e-4)
