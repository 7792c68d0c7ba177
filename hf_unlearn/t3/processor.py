"""``T3LogitsProcessor``: Temper-Then-Tilt decoding through ``model.generate(logits_processor=...)``.

At every step the processor takes the top-k candidates ``v`` of the tempered distribution, scores
``log f(x, y_<t v)`` for all of them in ONE forward of the base decoder that reuses the prefix
(the processor keeps its own KV cache of the sequence and a running sum of the answer tokens'
pooled hidden states), and returns ``log_softmax_{v in C_t}(log p(v)/T + w log f(v))`` on the
candidates and ``-inf`` elsewhere (see :mod:`hf_unlearn.t3.tilt`).

The per-step forward feeds the token(s) appended since the previous step together with the k
candidates; a tree-shaped 4D attention mask lets the new tokens attend causally to the cached
prefix and each candidate attend to the prefix and itself only, all candidates at the same
position. The candidate keys are then cropped from the cache. The caller's generation cache is
never touched.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from transformers import DynamicCache, LogitsProcessor

from .hidden import check_attention, crop_cache_to, layer_hidden, positions_from_mask
from .modeling import T3Classifier
from .tilt import pool_candidates, scatter_to_vocab, tilted_log_probs, top_k_candidates, tree_attention_mask


def validate_t3_arguments(
    temperature: float, top_k: int, tilt_weight: float, allow_temperature_below_one: bool
) -> None:
    """Refuse settings outside T3's definition (``T >= 1`` unless explicitly overridden, ``top_k >= 1``)."""
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
        raise ValueError(f"top_k must be an integer >= 1, got {top_k!r}.")
    if not math.isfinite(float(temperature)) or float(temperature) <= 0:
        raise ValueError(f"temperature must be a finite positive number, got {temperature!r}.")
    if float(temperature) < 1.0 and not allow_temperature_below_one:
        raise ValueError(
            f"temperature={temperature} < 1: T3 tempers with T >= 1 (T < 1 sharpens the memorised peaks it is "
            "meant to flatten). Pass allow_temperature_below_one=True to use it anyway."
        )
    if not math.isfinite(float(tilt_weight)):
        raise ValueError(f"tilt_weight must be finite, got {tilt_weight!r}.")


class T3LogitsProcessor(LogitsProcessor):
    """Temper-Then-Tilt as a ``LogitsProcessor``.

    Args:
        model: the frozen base causal LM, the same one that ``generate`` runs.
        classifier: a :class:`T3Classifier` fitted on ``model`` (refused otherwise).
        temperature: ``T >= 1``; ``T = 1`` is the pure classifier tilt.
        top_k: size of the candidate set.
        tilt_weight: ``w`` in ``log p / T + w log f``.
        pad_token_id: padding id used to recognise LEFT padding of the prompt (leading pad tokens);
            default: the model's generation config / config pad id.
        allow_temperature_below_one: explicit override of the ``T >= 1`` check.
        check_base_name: compare the base's name or path with the classifier's record.

    Use it with greedy decoding or sampling (``do_sample=True``; leave generate's own
    ``temperature`` at 1 and its ``top_k`` at 0 or >= this ``top_k``). The prompt (the input at
    the first call) defines where the answer starts; its left padding is recognised by leading
    ``pad_token_id`` tokens. The state resets automatically when a new ``generate`` call starts
    (the input is neither the previous input plus one token nor the same prompt with another
    continuation); call :meth:`reset` to force it (e.g. before continuing an earlier output).
    Beam search works: when beams are reordered the processor re-encodes the sequences once,
    keeping the prompt boundary.
    """

    def __init__(
        self,
        model: Any,
        classifier: T3Classifier,
        temperature: float = 2.0,
        top_k: int = 20,
        tilt_weight: float = 1.0,
        *,
        pad_token_id: int | None = None,
        allow_temperature_below_one: bool = False,
        check_base_name: bool = True,
    ) -> None:
        validate_t3_arguments(temperature, top_k, tilt_weight, allow_temperature_below_one)
        classifier.check_base(model, check_name=check_base_name)
        check_attention(model)
        self.model = model
        try:
            device = next(model.parameters()).device
        except StopIteration:  # pragma: no cover - a model always has parameters
            device = torch.device("cpu")
        self.classifier = classifier.to(device).eval()
        self.temperature = float(temperature)
        self.top_k = int(top_k)
        self.tilt_weight = float(tilt_weight)
        self.layer = int(classifier.config.layer)
        self.pooling = classifier.config.pooling
        if pad_token_id is None:
            gen = getattr(model, "generation_config", None)
            pad_token_id = getattr(gen, "pad_token_id", None) if gen is not None else None
            if pad_token_id is None:
                pad_token_id = getattr(model.config, "pad_token_id", None)
        if isinstance(pad_token_id, (list, tuple)):
            pad_token_id = pad_token_id[0] if pad_token_id else None
        self.pad_token_id = pad_token_id
        self.last_step: dict[str, torch.Tensor] | None = None
        self.reset()

    def reset(self) -> None:
        """Forget the cached prefix; the next call starts a new sequence."""
        self._cache: DynamicCache | None = None
        self._ids: torch.Tensor | None = None
        self._valid: torch.Tensor | None = None
        self._prompt_ids: torch.Tensor | None = None
        self._prompt_length = 0
        self._sum: torch.Tensor | None = None
        self._count: torch.Tensor | None = None

    def _continues(self, input_ids: torch.Tensor) -> bool:
        prev = self._ids
        return (
            prev is not None
            and input_ids.shape[0] == prev.shape[0]
            and input_ids.shape[1] == prev.shape[1] + 1
            and torch.equal(input_ids[:, : prev.shape[1]], prev)
        )

    def _same_prompt(self, input_ids: torch.Tensor) -> bool:
        """Same prompt rows, different continuation: beams were reordered (beam search)."""
        prompt = self._prompt_ids
        return (
            prompt is not None
            and input_ids.shape[0] == prompt.shape[0]
            and input_ids.shape[1] > prompt.shape[1]
            and torch.equal(input_ids[:, : prompt.shape[1]], prompt)
        )

    def _start(self, input_ids: torch.Tensor, prompt_ids: torch.Tensor | None = None) -> None:
        """Start a sequence: ``prompt_ids`` is the prompt when re-encoding a reordered batch, else
        ``input_ids`` itself is the prompt (a new ``generate`` call)."""
        self.reset()
        if self.pad_token_id is None:
            valid = torch.ones_like(input_ids, dtype=torch.bool)
        else:
            valid = (input_ids != self.pad_token_id).long().cumsum(-1) > 0
        self._valid = valid
        self._prompt_ids = input_ids.clone() if prompt_ids is None else prompt_ids
        self._prompt_length = self._prompt_ids.shape[1]
        self._cache = DynamicCache(config=self.model.config)
        hidden = self.model.config.get_text_config(decoder=True).hidden_size
        self._sum = torch.zeros(input_ids.shape[0], hidden, dtype=torch.float32, device=input_ids.device)
        self._count = torch.zeros(input_ids.shape[0], dtype=torch.float32, device=input_ids.device)

    @torch.no_grad()
    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._continues(input_ids):
            ones = torch.ones_like(input_ids[:, -1:], dtype=torch.bool)
            self._valid = torch.cat([self._valid, ones], dim=-1)
        elif self._same_prompt(input_ids):
            self._start(input_ids, prompt_ids=self._prompt_ids)  # beams reordered: re-encode, same prompt
        else:
            self._start(input_ids)  # a new generate call
        n_cached = 0 if self._ids is None else self._ids.shape[1]
        length = input_ids.shape[1]
        new_ids = input_ids[:, n_cached:length]
        m = new_ids.shape[1]
        cand_ids, cand_log_p = top_k_candidates(scores, self.top_k)
        k = cand_ids.shape[1]
        device = input_ids.device

        # One forward: the m new tokens (causal over the cached prefix) + the k candidates (prefix + self).
        key_valid = torch.cat([self._valid, torch.ones_like(cand_ids, dtype=torch.bool)], dim=-1)
        cols_new = torch.arange(n_cached, length, device=device)
        cols_cand = torch.arange(length, length + k, device=device)
        limit = torch.cat([cols_new + 1, torch.full((k,), length, device=device)]).expand(input_ids.shape[0], -1)
        self_col = torch.cat([cols_new, cols_cand]).expand(input_ids.shape[0], -1)
        dtype = self.model.dtype if self.model.dtype.is_floating_point else torch.float32
        mask = tree_attention_mask(key_valid, limit, self_col, dtype)
        positions = positions_from_mask(self._valid)
        cand_pos = self._valid.long().sum(-1, keepdim=True).expand(-1, k)
        tokens = torch.cat([new_ids, cand_ids], dim=-1)
        pos = torch.cat([positions[:, n_cached:length], cand_pos], dim=-1)
        hidden = layer_hidden(self.model, tokens, mask, pos, self.layer, past_key_values=self._cache)
        crop_cache_to(self._cache, length)

        # Answer tokens among the new ones enter the running pooled sum.
        is_answer = (cols_new >= self._prompt_length).to(torch.float32)
        if bool(is_answer.any()):
            self._sum += (hidden[:, :m].float() * is_answer.view(1, -1, 1)).sum(1)
            self._count += is_answer.sum()
        pooled = pool_candidates(self._sum, self._count, hidden[:, m:], self.pooling)
        log_f = self.classifier.log_f(pooled.to(self.classifier.device)).to(device)
        log_q = tilted_log_probs(cand_log_p, log_f, self.temperature, self.tilt_weight)
        self._ids = input_ids.clone()
        self.last_step = {"candidate_ids": cand_ids, "log_p": cand_log_p, "log_f": log_f, "log_q": log_q}
        return scatter_to_vocab(cand_ids, log_q, scores.shape[-1]).to(scores.dtype)
