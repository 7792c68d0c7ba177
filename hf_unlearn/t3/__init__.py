"""T3 (Temper-Then-Tilt): inference-time unlearning with a frozen base model.

Sample from ``softmax(log p(y | x) / T + log f(x, y))`` over the top-k candidates, where ``f`` is
a low-rank classifier on pooled hidden states telling retain (S=1) from forget (S=0) text::

    clf = fit_t3(model, tokenizer, forget, retain, T3ClassifierConfig(rank=20, layer=-1, pooling="mean"))
    out = model.generate(**inputs, logits_processor=LogitsProcessorList(
        [T3LogitsProcessor(model, clf, temperature=2.0, top_k=20)]))
    lp = t3_log_probs(model, clf, input_ids, labels, temperature=2.0, top_k=20)
"""

from .config import T3ClassifierConfig
from .fit import cache_prefix_states, fit_t3
from .modeling import T3Classifier, T3ClassifierOutput
from .processor import T3LogitsProcessor
from .scoring import t3_log_probs, t3_scorer
from .tilt import (
    candidates_with_target,
    pool_candidates,
    prefix_pooled_states,
    scatter_to_vocab,
    tilted_log_probs,
    top_k_candidates,
    tree_attention_mask,
)

__all__ = [
    "T3Classifier", "T3ClassifierConfig", "T3ClassifierOutput", "T3LogitsProcessor", "cache_prefix_states",
    "candidates_with_target", "fit_t3", "pool_candidates", "prefix_pooled_states", "scatter_to_vocab",
    "t3_log_probs", "t3_scorer", "tilted_log_probs", "top_k_candidates", "tree_attention_mask",
]
