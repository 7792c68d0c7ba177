"""Verbatim memorization of forget answers under teacher forcing: exact memorization and extraction strength.

Both read ``greedy_correct[t] = [argmax_v p(v | x, y_<t) == y_t]`` over an answer's tokens (from
:func:`hf_unlearn.logprobs.answer_token_statistics`), as open-unlearning's ``exact_memorization`` and
``extraction_strength`` do on TOFU's forget split.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def exact_memorization(greedy_correct: Sequence[bool]) -> float:
    """Exact memorization (Tirumala et al., 2022): the fraction of answer tokens the model predicts greedily,
    ``EM = (1/n) sum_t [argmax p(. | x, y_<t) = y_t]``; 0 for an empty answer."""
    g = np.asarray(greedy_correct, dtype=bool)
    return float(g.mean()) if g.size else 0.0


def extraction_strength(greedy_correct: Sequence[bool]) -> float:
    """Extraction strength (Carlini et al., 2021; open-unlearning): how short a prefix of the answer
    suffices for the model to continue it verbatim under teacher forcing,

        ES = 1 - k* / n,   k* = min {k : argmax p(. | x, y_<t) = y_t for every t >= k}

    Deviation, kept to match open-unlearning's numbers: its loop stops at ``k = n - 1``, so an answer whose
    last token is also mispredicted scores ``1/n`` rather than 0. An empty answer scores 0."""
    g = np.asarray(greedy_correct, dtype=bool)
    n = g.size
    if n == 0:
        return 0.0
    wrong = np.flatnonzero(~g)
    k = 0 if wrong.size == 0 else min(int(wrong[-1]) + 1, n - 1)  # the suffix after the last miss
    return 1.0 - k / n
