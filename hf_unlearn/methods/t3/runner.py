"""T3's fit as the registry runs it (:class:`T3Fit`)."""

from __future__ import annotations

from typing import Any

from ...registry import MethodFit
from ...result import Decoding, Unlearned, num_params
from .modeling import T3Classifier

__all__ = ["T3Fit"]


class T3Fit(MethodFit):
    """T3 as a registered method: the head (:class:`~hf_unlearn.methods.t3.T3Classifier`) on a frozen base."""

    artifact_cls = T3Classifier
    artifact_kind = "t3_classifier"

    def decoding(self, model: Any, head: Any, check_base_weights: bool = True) -> Decoding:
        """Score and generate with ``head`` on ``model`` at the head's ``(T, w)``."""
        from transformers import LogitsProcessorList

        from .processor import T3LogitsProcessor
        from .scoring import t3_scorer

        processor = T3LogitsProcessor(model, head, check_base_weights=check_base_weights)
        scorer = t3_scorer(model, head, check_base_weights=check_base_weights)
        return Decoding(scorer, {"logits_processor": LogitsProcessorList([processor])}, close=processor.close)

    def __call__(self, model: Any, tokenizer: Any, forget: Any, retain: Any, config: Any) -> Unlearned:
        """Fit the head; evaluation scores and generates with the tilted distribution on the unchanged base."""
        from .fit import fit_t3

        head = fit_t3(model, tokenizer, forget, retain, config, progress=False)
        model.eval()
        # fit time in two parts: cache_seconds (one forward pass of the base) and train_seconds (the head)
        info = {k: v for k, v in (getattr(head, "fit_report", None) or {}).items() if isinstance(v, (int, float, str))}
        result = Unlearned(method="t3", model=model, artifact=head, settings={}, trainable_params=num_params(head),
                           total_params=num_params(model), weights_changed=False, info=info)
        result.use_decoding(self.decoding(model, head))
        return result

    def select(self, model: Any, tokenizer: Any, forget: Any, retain: Any, config: Any, criterion: Any) -> Unlearned:
        """Fit the head, then write the ``(T, w)`` ``criterion`` chooses into it (:func:`calibrate_t3`)."""
        from .calibration import calibrate_t3

        result = self(model, tokenizer, forget, retain, config)
        head = result.artifact
        record = calibrate_t3(model, tokenizer, head, criterion)
        for processor in result.generation_kwargs["logits_processor"]:
            processor.close()  # the fit's processor, replaced below by one at the calibrated (T, w)
        result.use_decoding(self.decoding(model, head))
        result.settings.update(temperature=head.config.temperature, tilt_weight=head.config.tilt_weight)
        result.info["selection"] = record.to_dict()
        return result
