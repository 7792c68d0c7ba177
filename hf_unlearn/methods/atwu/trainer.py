"""ATWU (Alternating Token-Weighted Unlearning): a learned per-token forget score weights the forget loss, model and
scorer updated alternately (the objective: :class:`~hf_unlearn.methods.atwu.config.ATWUConfig`). The weighter and
its Adam state are saved beside the model and in every checkpoint, and reloaded on resume."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from datasets import Dataset
from transformers import PreTrainedModel, PreTrainedTokenizerBase, TrainerCallback, TrainingArguments

from ..base.losses import LossDenominators
from ..base.pairing import RETAIN_PREFIX, to_trl_format
from ..base.trainer import Optimizers, Rows, UnlearningTrainer
from .config import ATWUConfig
from .loss import (
    budget_penalty,
    normalized_conflict,
    retain_conflict,
    satga_plus_loss,
    score_entropy,
    weighted_npo_loss,
    weighted_simnpo_loss,
)
from .weighter import (
    WEIGHTER_DIR,
    WEIGHTER_OPTIMIZER_NAME,
    ATWUTokenWeighter,
    load_optimizer_state,
    model_hidden_size,
    save_optimizer_state,
    score_token_features,
    score_tokens,
)

if TYPE_CHECKING:
    from peft import PeftConfig
    from transformers import BitsAndBytesConfig


class ATWUTrainer(UnlearningTrainer):
    """Alternating Token-Weighted Unlearning on the shared :class:`UnlearningTrainer`.

    Takes the base trainer's arguments plus ``scorer`` (an :class:`ATWUTokenWeighter` to start from; default: a
    fresh one, every token scored ``budget``); ``args`` is an :class:`ATWUConfig` (other training arguments are
    converted). Logs ``model_loss``, ``forget_loss``, ``forget_nll``, ``retain_nll``, ``mean_score``,
    ``selected_fraction`` and, on scorer steps, ``scorer_loss``, ``scorer_forget_loss``, ``score_entropy``,
    ``budget_penalty``.

    Overrides ``_save``, ``_save_optimizer_and_scheduler`` and ``_load_optimizer_and_scheduler`` (no public hook):
    the weighter and its Adam state go into every saved folder and are read back on resume.
    """

    _name = "ATWU"
    _method = "atwu"
    _title = "ATWU (Alternating Token-Weighted Unlearning)"
    _paper: ClassVar[dict[str, str]] = {
        "title": "Learning What to Forget: Improving LLM Unlearning via Learned Token-Level Importance",
        "id": "2606.06320"}
    _cli_help = "alternating token-weighted unlearning with a learned token scorer"
    config_class = ATWUConfig
    _tag_names = [*UnlearningTrainer._tag_names, "atwu"]

    def __init__(
        self, model: str | PreTrainedModel, args: ATWUConfig | TrainingArguments | None = None,
        data_collator: Callable | None = None, train_dataset: Rows | None = None,
        retain_dataset: Rows | None = None, eval_dataset: Rows | dict[str, Rows] | None = None,
        processing_class: PreTrainedTokenizerBase | None = None,
        callbacks: list[TrainerCallback] | None = None, optimizers: Optimizers = (None, None),
        optimizer_cls_and_kwargs: tuple[type[torch.optim.Optimizer], dict[str, Any]] | None = None,
        quantization_config: BitsAndBytesConfig | None = None, peft_config: PeftConfig | None = None,
        ref_model: PreTrainedModel | None = None, scorer: ATWUTokenWeighter | None = None,
    ):
        super().__init__(
            model, args, data_collator=data_collator, train_dataset=train_dataset, retain_dataset=retain_dataset,
            eval_dataset=eval_dataset, processing_class=processing_class, callbacks=callbacks, optimizers=optimizers,
            optimizer_cls_and_kwargs=optimizer_cls_and_kwargs, quantization_config=quantization_config,
            peft_config=peft_config, ref_model=ref_model,
        )
        unwrapped = self.accelerator.unwrap_model(self.model)
        hidden = model_hidden_size(unwrapped)
        if scorer is None:  # every token starts at the budget: b = logit(budget), w = 0
            scorer = ATWUTokenWeighter(
                hidden, init_bias=math.log(self.args.budget / (1.0 - self.args.budget)),
                standardize=self.args.scorer_standardize, position=self.args.scorer_position,
            )
        elif scorer.hidden_size != hidden:
            raise ValueError(
                f"Hidden size mismatch: the given ATWU scorer has hidden size {scorer.hidden_size}, the model {hidden}."
            )
        self.scorer = scorer.to(self.args.device)
        self.scorer_optimizer = torch.optim.Adam(self.scorer.parameters(), lr=self.args.scorer_lr)
        self._last_scorer_step: int | None = None
        self._warmup_pending = self.args.scorer_warmup_steps > 0

    @classmethod
    def needs_reference_model(cls, args: ATWUConfig) -> bool:
        """The weighted NPO forget term and the KL retain term read the frozen reference."""
        return getattr(args, "forget_loss", None) == "npo" or super().needs_reference_model(args)

    def weighted_forget_loss(
        self, token_log_probs: torch.Tensor, scores: torch.Tensor, mask: torch.Tensor,
        ref_token_log_probs: torch.Tensor | None = None, denominators: LossDenominators | None = None,
    ) -> torch.Tensor:
        """The configured forget loss (``args.forget_loss``) with token weights ``scores``, before ``forget_weight``
        (the batch's own counts without ``denominators``; SATGA+ with :meth:`saturation_c` of the current step)."""
        args = self.args
        if args.forget_loss == "satga":
            n = denominators.forget_tokens if denominators is not None else None
            return satga_plus_loss(
                token_log_probs, scores, mask, args.saturation_beta, self.saturation_c(), n, form=args.satga_form,
                selection=args.satga_selection,
            )
        n = denominators.forget_sequences if denominators is not None else None
        if args.forget_loss == "npo":
            if ref_token_log_probs is None:
                raise ValueError("The weighted NPO forget loss needs the reference model's token log-probabilities.")
            return weighted_npo_loss(token_log_probs, ref_token_log_probs, scores, mask, args.npo_beta, n)
        return weighted_simnpo_loss(token_log_probs, scores, mask, args.simnpo_beta, args.simnpo_delta, n)

    def saturation_c(self, step: int | None = None) -> float:
        """SATGA+'s contrast at model step ``step`` (default: the current one): ``saturation_c * min(1, (step + 1)
        / W)`` with ``W = saturation_c_warmup_steps``, or ``saturation_c`` when ``W = 0``."""
        warmup = self.args.saturation_c_warmup_steps
        if warmup <= 0:
            return float(self.args.saturation_c)
        step = self.state.global_step if step is None else int(step)
        return float(self.args.saturation_c) * min(1.0, (step + 1) / warmup)

    def scorer_step(
        self, token_log_probs: torch.Tensor, hidden_states: torch.Tensor, mask: torch.Tensor,
        ref_token_log_probs: torch.Tensor | None = None, conflict: torch.Tensor | None = None,
    ) -> dict[str, float]:
        """One weighter update on this batch, the model's outputs detached, standardised by the batch's statistics:
        minimises the weighter-step loss of :class:`ATWUConfig` (``c``: the label-aligned ``conflict``, normalised
        by :func:`~hf_unlearn.methods.atwu.loss.normalized_conflict`). Returns and logs its terms."""
        args = self.args
        lp = token_log_probs.detach()
        ref = ref_token_log_probs.detach() if ref_token_log_probs is not None else None
        self.scorer.train()
        # the tracked statistics follow the batch's as moving averages; each averaged over processes
        states = self.scorer.scored_states(hidden_states, mask).float()
        center = states.mean(0) if states.shape[0] else self.scorer.center.clone()
        if self.accelerator.num_processes > 1:
            center = self.accelerator.reduce(center, reduction="mean")
        variance = (states - center).pow(2).mean(0) if states.shape[0] else self.scorer.variance.clone()
        if self.accelerator.num_processes > 1:
            variance = self.accelerator.reduce(variance, reduction="mean")
        self.scorer.update_statistics(center, variance)
        with torch.enable_grad():
            z = self.scorer.label_logits(hidden_states.detach(), center, variance)
            g = torch.sigmoid(z)
            bias = self.scorer.linear.bias[0]
            forget = self.weighted_forget_loss(lp, g, mask, ref)
            entropy = score_entropy(g, mask)
            budget = budget_penalty(torch.sigmoid(z.detach() + (bias - bias.detach())), mask, args.budget)
            loss = args.scorer_forget_weight * forget + args.entropy_weight * entropy + args.budget_weight * budget
            if conflict is not None and args.retain_conflict_weight > 0:
                weights = normalized_conflict(conflict.detach().to(g.device), mask)
                conflict_term = (g * weights)[mask].sum() / mask.sum().clamp(min=1)
                loss = loss + args.retain_conflict_weight * conflict_term
                self.log_metric("scorer_retain_conflict", conflict_term.detach())
            if args.scorer_l2 > 0:
                loss = loss + args.scorer_l2 * self.scorer.weight.pow(2).sum()
            self.scorer_optimizer.zero_grad(set_to_none=True)
            loss.backward()
        if self.accelerator.num_processes > 1:  # one scorer for all processes: average its gradient like DDP does
            for p in self.scorer.parameters():
                p.grad = self.accelerator.reduce(p.grad, reduction="mean")
        self.scorer_optimizer.step()
        terms = {
            "scorer_loss": loss.detach(), "scorer_forget_loss": forget.detach(),
            "score_entropy": entropy.detach(), "budget_penalty": budget.detach(),
        }
        for name, value in terms.items():
            self.log_metric(name, value)
        return {k: float(v) for k, v in terms.items()}

    def batch_retain_conflict(self, model: Any, inputs: dict[str, Any], forget: Any) -> torch.Tensor | None:
        """:func:`~hf_unlearn.methods.atwu.loss.retain_conflict` of the forget answer tokens against the batch's
        retain answers (one forward of the retain part, without gradient); ``None`` without retain examples or
        with ``retain_conflict_weight=0``."""
        if self.args.retain_conflict_weight <= 0 or RETAIN_PREFIX + "input_ids" not in inputs:
            return None
        with torch.no_grad():
            retain = self.score(model, inputs, RETAIN_PREFIX, output_hidden_states=True)
            return retain_conflict(
                forget.logits, forget.labels, forget.outputs.hidden_states[-1],
                retain.logits, retain.labels, retain.outputs.hidden_states[-1],
            )

    def _scorer_due(self, model: Any) -> bool:
        if not (self.in_training_step and model.training):
            return False
        step = self.state.global_step
        if step % self.args.scorer_every != 0 or self._last_scorer_step == step:
            return False
        self._last_scorer_step = step
        return True

    def scorer_warmup(self, model: Any) -> list[dict[str, float]]:
        """``scorer_warmup_steps`` scorer-only steps on the first forget batches in order (cycled), before the
        first model step of a run that starts at step 0; returns each step's terms."""
        args = self.args
        bs = args.per_device_train_batch_size
        n = len(self.forget_dataset)
        terms = []
        for k in range(args.scorer_warmup_steps):
            rows = [self.forget_dataset[(k * bs + i) % n] for i in range(bs)]
            batch = self._prepare_inputs(self.data_collator([{c: r[c] for c in ("input_ids", "labels")} for r in rows]))
            with torch.no_grad():
                forget = self.score(model, batch, output_hidden_states=True)
                ref = self.reference_scores(batch).token_log_probs if args.forget_loss == "npo" else None
            terms.append(self.scorer_step(forget.token_log_probs, forget.outputs.hidden_states[-1], forget.mask, ref))
        return terms

    def compute_unlearning_loss(self, model: Any, inputs: dict[str, Any], denominators: LossDenominators) -> torch.Tensor:
        if self._warmup_pending and self.in_training_step and model.training:
            self._warmup_pending = False
            if self.state.global_step == 0:
                self.scorer_warmup(model)
        forget = self.score(model, inputs, output_hidden_states=True)
        hidden = forget.outputs.hidden_states[-1].detach()
        ref = self.reference_scores(inputs).token_log_probs if self.args.forget_loss == "npo" else None
        if self._scorer_due(model):
            conflict = self.batch_retain_conflict(model, inputs, forget)
            self.scorer_step(forget.token_log_probs, hidden, forget.mask, ref, conflict)
        with torch.no_grad():
            scores = self.scorer.label_scores(hidden)
        forget_loss = self.weighted_forget_loss(forget.token_log_probs, scores, forget.mask, ref, denominators)
        loss = self.args.forget_weight * forget_loss
        if self.args.retain_weight > 0:
            loss = loss + self.args.retain_weight * self.retain_term(model, inputs, denominators)
        selected = scores[forget.mask]
        self.log_metric("forget_nll", forget.mean_nll)
        self.log_metric("forget_loss", forget_loss)
        self.log_metric("model_loss", loss)
        self.log_metric("mean_score", selected.mean() if selected.numel() else 0.0)
        self.log_metric("selected_fraction", (selected > 0.5).float().mean() if selected.numel() else 0.0)
        return loss

    def token_scores(
        self, dataset: Dataset | Sequence[dict[str, Any]], batch_size: int | None = None, progress: bool = False
    ) -> list[dict[str, Any]]:
        """One ``{"token_ids", "tokens", "scores", "token_nll"}`` dict per example of ``dataset`` (TOFU, TRL or
        tokenized rows), tokenized as the training set: its answer tokens and their current scores."""
        rows = dataset if isinstance(dataset, Dataset) else Dataset.from_list(list(dataset))
        columns, tok = set(rows.column_names), self.processing_class
        model = self.accelerator.unwrap_model(self.model)
        bs = batch_size or self.args.per_device_eval_batch_size
        if {"question", "answer"} <= columns and not {"input_ids", "labels"} <= columns:
            return score_tokens(model, tok, self.scorer, rows, bs, progress, self.args.prompt_template,
                                self.args.max_length)
        if not {"input_ids", "labels"} <= columns:
            rows = self._prepare_dataset(to_trl_format(rows, tok, self.args.prompt_template), tok, self.args, False,
                                         None, "token_scores")
        features = [{"input_ids": list(r["input_ids"]), "labels": list(r["labels"])} for r in rows]
        return score_token_features(model, self.scorer, features, tok.pad_token_id, tok, bs, progress)

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """Write the weights (as the Trainer does) and the token weighter beside them (``atwu_weighter/``), into the
        folder being built (the base trainer swaps it in only once complete; checkpoints included)."""
        super()._save(output_dir, state_dict)
        if self.args.should_save:
            self.scorer.save_pretrained(Path(output_dir if output_dir is not None else self.args.output_dir) / WEIGHTER_DIR)

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        """The Trainer's optimizer and scheduler, plus the weighter's Adam state, in each checkpoint."""
        super()._save_optimizer_and_scheduler(output_dir)
        if self.args.should_save:
            save_optimizer_state(self.scorer_optimizer, Path(output_dir) / WEIGHTER_OPTIMIZER_NAME)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """On resume, reload the weighter (its weights, running mean and variance) and its Adam state from ``checkpoint``
        with the Trainer's optimizer and scheduler."""
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        folder = Path(checkpoint)
        if not (folder / WEIGHTER_DIR).is_dir() or not (folder / WEIGHTER_OPTIMIZER_NAME).is_file():
            raise FileNotFoundError(
                f"Checkpoint {checkpoint} has no ATWU token weighter ({WEIGHTER_DIR}/, {WEIGHTER_OPTIMIZER_NAME}); "
                "it was not written by ATWUTrainer, so the run cannot be resumed exactly."
            )
        saved = ATWUTokenWeighter.from_pretrained(folder / WEIGHTER_DIR, hidden_size=self.scorer.hidden_size)
        self.scorer.load_state_dict(saved.state_dict())
        load_optimizer_state(self.scorer_optimizer, folder / WEIGHTER_OPTIMIZER_NAME)

    def method_metrics(self, tokenizer: Any, forget: Any, retain: Any) -> dict[str, float]:
        """``token_auroc`` of the trained weighter (:func:`~hf_unlearn.methods.atwu.weighter.token_auroc_metrics`)."""
        from .weighter import token_auroc_metrics

        return token_auroc_metrics(self, tokenizer, forget, retain)
