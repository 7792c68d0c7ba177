"""Teacher-forced log-probabilities under the T3 distribution, and the evaluator's token scorer.

For every answer token ``y_t`` (exact over the full vocabulary)::

    log q(y_t | x, y_<t) = log_softmax_v( log_softmax(logits_{t-1})_v / T + w * max(log sigmoid(g_{t-1}[v]), floor) )[y_t]

with ``g_{t-1} = U (D pool_{t-1} + c)`` the guidance logits of the causal mean-pooled hidden state of
the prefix. This is the distribution :class:`~hf_unlearn.methods.t3.T3LogitsProcessor` decodes from; one
forward pass of the base per batch gives both the logits and (through a hook) the hidden states,
so TOFU's probability, truth ratio and forget quality score T3 unchanged.
"""

from __future__ import annotations

from typing import Any

import torch

from ...data.prompts import IGNORE_INDEX
from ...logprobs import TokenScorer
from .hidden import HiddenStateHook, causal_mean_pool, check_length
from .modeling import T3Classifier
from .processor import validate_t3_arguments
from .tilt import tilted_log_probs


@torch.no_grad()
def t3_log_probs(
    model: Any,
    classifier: T3Classifier,
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    *,
    temperature: float | None = None,
    tilt_weight: float | None = None,
    log_f_floor: float | None = None,
    allow_temperature_below_one: bool = False,
    check_base_weights: bool = True,
    chunk_positions: int = 1024,
) -> torch.Tensor:
    """Per-token T3 log-probabilities of ``labels`` (``[B, L]``), aligned like
    :func:`hf_unlearn.logprobs.label_log_probs`: ``out[:, t] = log q(labels[:, t] | input_ids[:, :t])``,
    0 where ``labels == -100`` and at ``t = 0``.

    ``temperature`` / ``tilt_weight`` / ``log_f_floor`` default to the head's config values. Unlike greedy
    decoding, these scores depend on ``T`` and ``w`` separately, not only on ``T * w``.
    ``check_base_weights`` compares the model's weights with the head's fingerprint (checked once per model
    state, see :mod:`hf_unlearn.methods.t3.provenance`).
    Padding (``attention_mask == 0``) is excluded from the pooled state, so left and right padding
    give the same numbers. The tilted distribution is built for ``chunk_positions`` scored positions
    at a time (memory ``chunk_positions x vocab``). An input longer than the base's maximum positions
    is refused (truncate it first).
    """
    temperature = classifier.config.temperature if temperature is None else temperature
    tilt_weight = classifier.config.tilt_weight if tilt_weight is None else tilt_weight
    log_f_floor = classifier.config.log_f_floor if log_f_floor is None else log_f_floor
    validate_t3_arguments(temperature, tilt_weight, allow_temperature_below_one, log_f_floor)
    classifier.check_finite()
    classifier.check_base(model, check_weights=check_base_weights)
    check_length(model, input_ids.shape[1], "The scored input")
    captured: list[torch.Tensor] = []
    with HiddenStateHook(model, int(classifier.config.layer), lambda h, m: captured.append(h)):
        logits = model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).logits
    if not captured:
        raise RuntimeError("The T3 hook saw no forward of the base model's decoder.")
    pooled = causal_mean_pool(captured[-1], attention_mask)
    if logits.shape[-1] != int(classifier.config.vocab_size):
        raise ValueError(f"The base returns {logits.shape[-1]} logits but the T3 head {classifier.config.vocab_size}.")

    result = torch.zeros(labels.shape, dtype=torch.float32, device=logits.device)
    targets = labels[:, 1:]
    rows, cols = (targets != IGNORE_INDEX).nonzero(as_tuple=True)  # prefix ends at cols, predicts cols + 1
    head_device = classifier.device
    for start in range(0, len(rows), max(1, int(chunk_positions))):
        b, t = rows[start : start + chunk_positions], cols[start : start + chunk_positions]
        guidance = classifier(pooled[b, t].to(head_device)).logits.to(logits.device)
        log_q = tilted_log_probs(logits[b, t], guidance, temperature, tilt_weight, log_f_floor)
        result[b, t + 1] = log_q.gather(-1, targets[b, t].unsqueeze(-1)).squeeze(-1)
    return result


def t3_scorer(
    model: Any,
    classifier: T3Classifier,
    temperature: float | None = None,
    tilt_weight: float | None = None,
    **kwargs: Any,
) -> TokenScorer:
    """A :data:`hf_unlearn.logprobs.TokenScorer` scoring answers under T3 (for ``answer_log_likelihoods``
    and the TOFU evaluator's ``scorer=``). Arguments are validated once, here; ``kwargs`` go to
    :func:`t3_log_probs`."""
    temperature = classifier.config.temperature if temperature is None else temperature
    tilt_weight = classifier.config.tilt_weight if tilt_weight is None else tilt_weight
    log_f_floor = kwargs.get("log_f_floor")
    validate_t3_arguments(temperature, tilt_weight, kwargs.get("allow_temperature_below_one", False),
                          classifier.config.log_f_floor if log_f_floor is None else log_f_floor)
    classifier.check_finite()
    classifier.check_base(model, check_weights=kwargs.get("check_base_weights", True))

    def scorer(input_ids, attention_mask, position_ids, labels):
        return t3_log_probs(
            model, classifier, input_ids, labels, attention_mask, position_ids,
            temperature=temperature, tilt_weight=tilt_weight, **kwargs,
        )

    return scorer
