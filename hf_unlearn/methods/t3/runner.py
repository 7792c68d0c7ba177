"""T3's side of the method contract: its runner (fit the head), its decoding (the tilted scorer and logits
processor on a base) and its selector (the one-pass ``(T, w)`` calibration), which :mod:`hf_unlearn.registry`
names for the core."""

from __future__ import annotations

from typing import Any

from ...result import Decoding, Unlearned, num_params

__all__ = ["run_t3", "select_t3", "t3_decoding"]


def t3_decoding(model: Any, head: Any, check_base_weights: bool = True) -> Decoding:
    """Score and generate with ``head`` on ``model`` at the head's own ``temperature`` / ``tilt_weight``:
    :func:`~hf_unlearn.methods.t3.t3_scorer` and a :class:`~hf_unlearn.methods.t3.T3LogitsProcessor` (closed by
    :meth:`Decoding.close`). ``check_base_weights=False`` for a base changed on purpose (an attacked copy)."""
    from transformers import LogitsProcessorList

    from . import T3LogitsProcessor, t3_scorer

    processor = T3LogitsProcessor(model, head, check_base_weights=check_base_weights)
    scorer = t3_scorer(model, head, check_base_weights=check_base_weights)
    return Decoding(scorer, {"logits_processor": LogitsProcessorList([processor])}, close=processor.close)


def run_t3(model: Any, tokenizer: Any, forget: Any, retain: Any, output_dir: Any,
           settings: dict[str, Any]) -> Unlearned:
    """Fit the head (every setting is a :class:`~hf_unlearn.methods.t3.T3ClassifierConfig` field: head, fit, and
    the decoding defaults ``temperature`` / ``tilt_weight``); evaluation scores and generates with the tilted
    distribution, and the base's weights are unchanged."""
    from . import T3ClassifierConfig, fit_t3

    head = fit_t3(model, tokenizer, forget, retain, T3ClassifierConfig(**settings), progress=False)
    model.eval()
    # fit time in two parts: cache_seconds (one forward pass of the base) and train_seconds (the head)
    info = {k: v for k, v in (getattr(head, "fit_report", None) or {}).items() if isinstance(v, (int, float, str))}
    result = Unlearned(method="t3", model=model, artifact=head, settings=dict(settings),
                       trainable_params=num_params(head), total_params=num_params(model), weights_changed=False,
                       info=info)
    result.use_decoding(t3_decoding(model, head))
    return result


def select_t3(run: Any, model: Any, tokenizer: Any, forget: Any, retain: Any, output_dir: Any,
              settings: dict[str, Any], criterion: Any) -> Unlearned:
    """Fit the head once (``run``, the plain run), then :func:`~hf_unlearn.methods.t3.calibrate_t3` writes the
    ``(T, w)`` that ``criterion`` chooses into it; the scorer and the logits processor are rebuilt with them."""
    from . import calibrate_t3

    result = run(model, tokenizer, forget, retain, output_dir, settings)
    head = result.artifact
    record = calibrate_t3(model, tokenizer, head, criterion)
    for processor in result.generation_kwargs["logits_processor"]:
        processor.close()  # the fit's processor, replaced below by one at the calibrated (T, w)
    result.use_decoding(t3_decoding(model, head))
    result.settings.update(temperature=head.config.temperature, tilt_weight=head.config.tilt_weight)
    result.info["selection"] = record.to_dict()
    return result
