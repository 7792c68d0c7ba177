"""MASC (Margin Self-Correction): a trainer that pushes down restricted margins on forget answers and stops by
itself. The random continuation cuts come from generators seeded by ``(seed, step, micro-batch)`` (training) and
``(seed, step, stage)`` (probes), so a resumed run is exact.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from accelerate.utils import is_peft_model
from datasets import Dataset
from transformers import PreTrainedModel, PreTrainedTokenizerBase, TrainerCallback

from ...data import overlapping_examples
from ...partitioning import vocab_size
from ...result import TrainingOutcome
from ..base.guards import any_process
from ..base.losses import LossDenominators, answer_mask, kl_retain_loss
from ..base.pairing import MODEL_COLUMNS, RETAIN_PREFIX, PairedForgetRetainDataset, as_dataset, to_trl_format
from ..base.trainer import Optimizers, Rows, UnlearningTrainer
from .config import MASCConfig
from .loss import (
    buffered_hinge_loss,
    continuation_mask,
    margin_hinge_loss,
    per_example_violation_rates,
    restricted_margin,
    sample_cut_ratios,
    violation_rate_tensor,
)
from .stopping import MarginStoppingCallback, split_validation

if TYPE_CHECKING:
    from peft import PeftConfig
    from transformers import BitsAndBytesConfig

ACTIVE_MASK_KEY = "masc_active_mask"

logger = logging.getLogger(__name__)


def _seeded(*keys: int) -> torch.Generator:
    """A CPU generator seeded by a fixed mix of integer keys (seed, step, ...)."""
    value = 0
    for k in keys:
        value = (value * 1_000_003 + int(k) + 1) % (2**61 - 1)
    return torch.Generator().manual_seed(value)


class MASCTrainer(UnlearningTrainer):
    """MASC (Margin Self-Correction) unlearning trainer, which stops by itself (:class:`MarginStoppingCallback`).

    Loss of a step: ``forget_weight * (1/|A|) sum_{t in A} h(m_t)`` over the active forget answer positions ``A``,
    ``h`` the buffered hinge ``relu(m - (tau - eta)) / eta`` (or ``relu(m - tau)``), plus
    ``retain_weight * KL(pi_0 || pi_theta)`` on retain answers. Without a ``peft_config`` it builds the LoRA
    adapter of ``args.get_peft_config()``. ``calibrate_stop_on``: rows the model never trained on (default: the
    holdout rows of a selection criterion among ``callbacks``).

    Private ``Trainer`` methods overridden, each because no public hook does the job: ``_load_callback_state``
    (the rule's state is restored on resume whatever ``restore_callback_states_from_checkpoint`` says) and
    ``_save`` (``masc_stopping.json`` is written in the folder being built, checkpoints included).
    """

    _tag_names = ["trl", "hf-unlearn", "unlearning", "masc"]
    _name = "MASC"
    _method = "masc"
    _title = "MASC (Margin Self-Correction)"
    _paper: ClassVar[dict[str, str]] = {
        "title": "Fast Unlearning at Scale via Margin Self-Correction", "id": "2606.02920"}
    _cli_help = "margin self-correction with its own stopping rule"
    config_class = MASCConfig

    def __init__(
        self, model: str | PreTrainedModel, args: MASCConfig | None = None,
        data_collator: Callable | None = None, train_dataset: Rows | None = None,
        retain_dataset: Rows | None = None, eval_dataset: Rows | dict[str, Rows] | None = None,
        processing_class: PreTrainedTokenizerBase | None = None,
        callbacks: list[TrainerCallback] | None = None, optimizers: Optimizers = (None, None),
        optimizer_cls_and_kwargs: tuple[type[torch.optim.Optimizer], dict[str, Any]] | None = None,
        quantization_config: BitsAndBytesConfig | None = None, peft_config: PeftConfig | None = None,
        calibrate_stop_on: Rows | None = None,
    ):
        if args is not None and not isinstance(args, MASCConfig):
            raise TypeError(f"MASCTrainer needs a MASCConfig, got {type(args).__name__}.")
        args, recipe = self._resolve_args(args, model).resolved_for(model)
        if train_dataset is None:
            raise ValueError("`train_dataset` (the forget set) is required.")
        forget = as_dataset(train_dataset)
        if args.epoch_length != "forget" and retain_dataset is None:
            raise ValueError(
                f"epoch_length={args.epoch_length!r} counts an epoch over the retain set too; pass a "
                "`retain_dataset` (it is iterated even with retain_weight=0), or use epoch_length='forget'."
            )
        calibration_rows = self._check_calibration_rows(
            self._never_seen_rows(calibrate_stop_on, callbacks, args), forget, retain_dataset, args)
        held_out = None
        if args.stop_probe == "heldout":
            forget, held_out = split_validation(forget, args.validation_fraction, args.seed)
        if peft_config is None and not (isinstance(model, torch.nn.Module) and is_peft_model(model)):
            peft_config = args.get_peft_config()

        super().__init__(
            model=model, args=args, data_collator=data_collator, train_dataset=forget, retain_dataset=retain_dataset,
            eval_dataset=eval_dataset, processing_class=processing_class, callbacks=callbacks, optimizers=optimizers,
            optimizer_cls_and_kwargs=optimizer_cls_and_kwargs, quantization_config=quantization_config,
            peft_config=peft_config,
        )
        vocab = vocab_size(self.model)  # from the config when the head is partitioned (ZeRO-3 / FSDP)
        if self.args.top_k > vocab - 1:
            raise ValueError(
                f"top_k={self.args.top_k} is larger than the vocabulary allows: at most vocab_size - 1 = {vocab - 1} "
                "rival tokens exist."
            )
        self._step_active_tokens: torch.Tensor | None = None
        self.validation_dataset = None
        if args.epoch_length != "forget":
            self.train_dataset = PairedForgetRetainDataset(self.forget_dataset, self.retain_dataset,
                                                           seed=self.args.seed, cycle=True)
        rule = self._build_probes(calibration_rows, held_out, len(forget))
        rule["recipe"] = self.recipe = recipe
        self.stopping_callback = MarginStoppingCallback(
            mode=self.args.stop_probe, check_every=self.args.check_every, trigger=self.args.stop_trigger,
            stop_tolerance=self.args.stop_tolerance, delta=self.args.confirm_delta, rule=rule,
            confirm_rule=self.args.confirm_rule, calibrate=calibration_rows is not None and args.calibrate_stop,
            given=tuple(k for k in ("stop_trigger", "stop_tolerance") if k in self.args.recipe_fields_given),
        )
        self.stopping_callback.probe = self.probe
        self.stopping_callback.agree = self._main_process_decides
        self.add_callback(self.stopping_callback)

    def _build_probes(self, calibration_rows: Dataset | None, held_out: Dataset | None, num_train: int
                      ) -> dict[str, Any]:
        """The probe batches of each stage of the stopping rule, and the rule's record of its settings."""
        batches = self._probe_batches = {"calibrate": []}
        if calibration_rows is not None:
            calibration = self._prepared_rows(calibration_rows, "MASC calibration")
            batches["calibrate"] = self._batches(calibration, self.args.per_device_eval_batch_size)
        if held_out is not None:
            rows = self._prepared_rows(held_out, "MASC validation")
            positions = sum(int(answer_mask(torch.tensor([r["labels"]])).sum()) for r in rows)
            if positions < self.args.min_validation_size:
                raise ValueError(
                    f"The held-out validation slice ({len(held_out)} of {num_train + len(held_out)} forget examples) "
                    f"has {positions} answer positions; the stopping rule needs at least {self.args.min_validation_size}"
                    f" (max(min_validation_positions={self.args.min_validation_positions}, ceil(1/stop_tolerance))) to "
                    "measure a violation rate. Raise validation_fraction or use a larger forget set."
                )
            self.validation_dataset = Dataset.from_list(rows)
            batches["heldout"] = self._batches(rows, self.args.per_device_eval_batch_size)
        else:
            rows = [{k: self.forget_dataset[i][k] for k in MODEL_COLUMNS} for i in range(len(self.forget_dataset))]
            trigger_n = min(len(rows), self.args.stop_probe_batches * self.args.per_device_train_batch_size)
            batches["trigger"] = self._batches(rows[:trigger_n], self.args.per_device_train_batch_size)
            batches["confirm"] = self._batches(rows[: self.args.confirm_examples], self.args.per_device_eval_batch_size)
        rule = {
            "tau": self.args.tau, "top_k": self.args.top_k, "margin_beta": self.args.margin_beta,
            "penalty": self.args.penalty, "probe": self.args.stop_probe,
            "trigger_examples": None if held_out is not None else trigger_n,
            "confirm_examples": None if held_out is not None else min(len(rows), self.args.confirm_examples),
        }
        if calibration_rows is not None:
            rule["calibration_examples"] = len(calibration)
        return rule

    def _batches(self, rows: list[dict[str, Any]], batch_size: int) -> list[dict[str, torch.Tensor]]:
        return [self.data_collator(rows[i : i + batch_size]) for i in range(0, len(rows), batch_size)]

    @staticmethod
    def _never_seen_rows(rows: Any, callbacks: Sequence[Any] | None, args: MASCConfig) -> Any:
        """``calibrate_stop_on``, else the holdout rows of a selection criterion among ``callbacks``, else
        ``None`` (logged when ``calibrate_stop`` asks for a calibration)."""
        if rows is not None or not args.calibrate_stop or args.stop_probe != "train":
            return rows
        for callback in callbacks or ():
            holdout = getattr(getattr(callback, "criterion", None), "holdout", None)
            if holdout:
                return list(holdout)
        logger.warning(
            "MASC: no holdout rows (calibrate_stop_on or a selection criterion's), so its stop uses the fixed "
            "threshold stop_tolerance=%.4g, which may lie below the never-seen state and overshoot.",
            args.stop_tolerance)
        return None

    @staticmethod
    def _check_calibration_rows(rows: Any, forget: Dataset, retain: Any, args: MASCConfig) -> Dataset | None:
        """``calibrate_stop_on`` as a dataset; refused when empty, with the held-out rule, or sharing rows with
        the forget or retain set."""
        if rows is None:
            return None
        if args.stop_probe != "train":
            raise ValueError("calibrate_stop_on calibrates the two-stage rule; it needs stop_probe='train'.")
        rows = as_dataset(rows)
        if len(rows) == 0:
            raise ValueError("calibrate_stop_on is empty: give never-seen rows (e.g. holdout authors).")
        others = [("forget", forget)]
        if retain is not None:
            others.append(("retain", as_dataset(retain)))
        for name, other in others:
            keys = next((k for k in (("question", "answer"), ("text",))
                         if set(k) <= set(rows.column_names) and set(k) <= set(other.column_names)), None)
            if keys is not None:
                shared = overlapping_examples(rows, other, keys=keys)
                if shared:
                    raise ValueError(
                        f"{shared} of the {len(rows)} calibrate_stop_on rows are also in the {name} set; the "
                        "calibration needs rows the model never trained on (e.g. holdout authors)."
                    )
        return rows

    def _prepared_rows(self, rows: Dataset, name: str) -> list[dict[str, Any]]:
        """``rows`` tokenized exactly as the training set is."""
        prepared = to_trl_format(rows, self.processing_class, self.args.prompt_template, self.args.max_length)
        if not self._skip_prepare_dataset:
            prepared = self._prepare_dataset(prepared, self.processing_class, self.args, False, None, name)
        return [{k: prepared[i][k] for k in MODEL_COLUMNS} for i in range(len(prepared))]

    def active_mask(self, labels: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """The positions MASC penalises: the continuation after a random cut, or the whole answer (``"full"``)."""
        mask = answer_mask(labels)
        if self.args.penalty == "full":
            return mask
        ratios = sample_cut_ratios(
            labels.shape[0], self.args.continuation_cut_min_ratio, self.args.continuation_cut_max_ratio, generator
        )
        return continuation_mask(
            mask, ratios, self.args.continuation_min_prefix_tokens, self.args.continuation_min_suffix_tokens
        )

    def _main_process_decides(self, stop: bool) -> bool:
        """The main process's stop decision on every process (one all-reduce)."""
        return any_process(bool(stop) and self.accelerator.is_main_process, self.accelerator)

    @torch.no_grad()
    def probe(self, model: Any, stage: str, step: int) -> Any:
        """What :class:`MarginStoppingCallback` measures under ``model`` (eval mode, no gradient): for
        ``"trigger"``, ``"confirm"`` and ``"calibrate"`` the per-example violation rates (a list), cuts seeded by
        ``(seed, step, stage)``; for ``"heldout"`` ``(violations, positions)`` pooled over whole answers."""
        args = self.args
        batches = self._probe_batches[stage]
        generator = _seeded(args.seed, step, {"trigger": 1, "confirm": 2, "heldout": 3, "calibrate": 4}[stage])
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        rate_parts: list[torch.Tensor] = []  # per batch, on the device: copied to the host once, at the end
        counts = torch.zeros(2, dtype=torch.long, device=device)  # held-out (violations, positions)
        try:
            for batch in batches:
                batch = {k: v.to(device) for k, v in batch.items() if torch.is_tensor(v)}
                logits = model(
                    input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"),
                    position_ids=batch.get("position_ids"), use_cache=False,
                ).logits
                margins, mask = restricted_margin(logits, batch["labels"], args.top_k, args.margin_beta)
                if stage == "heldout":
                    counts += torch.stack([((margins > args.tau) & mask.bool()).sum(), mask.bool().sum()])
                else:
                    active = self.active_mask(batch["labels"], generator).to(margins.device)
                    rate_parts.append(per_example_violation_rates(margins, active, args.tau))
        finally:
            if was_training:
                model.train()
        if stage == "heldout":
            violations, positions = counts.tolist()
            return int(violations), int(positions)
        return torch.cat(rate_parts).tolist() if rate_parts else []

    def _load_callback_state(self) -> None:
        """Restore the stopping rule's state on resume and re-attach its probe."""
        super()._load_callback_state()
        current = self._restore_callback(self.stopping_callback)
        current.probe = self.probe
        current.agree = self._main_process_decides
        self.stopping_callback = current

    @classmethod
    def needs_retain(cls, args: MASCConfig) -> bool:
        """For the KL term, and with ``epoch_length="max(forget,retain)"`` to count the epoch."""
        return args.retain_weight > 0 or args.epoch_length != "forget"

    @classmethod
    def needs_reference_model(cls, args: MASCConfig) -> bool:
        return args.retain_weight > 0

    @property
    def stopped_at_step(self) -> int | None:
        """Global step at which the stopping rule fired (``None`` if it has not)."""
        return self.stopping_callback.stopped_at_step

    @property
    def stop_reason(self) -> str | None:
        """``"rule"``, ``"budget"`` (the rule never confirmed) or ``None`` (not trained to the end yet)."""
        return self.stopping_callback.stop_reason

    @property
    def violation_history(self) -> list[dict[str, Any]]:
        """One dict per measurement; the entry at step 0 is the starting model."""
        return self.stopping_callback.violation_history

    def training_outcome(self) -> TrainingOutcome:
        return TrainingOutcome(global_step=self.state.global_step, stopped_at_step=self.stopped_at_step,
                               stop_reason=self.stop_reason, history=tuple(self.violation_history))

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        batch_samples, num_items_in_batch = super().get_batch_samples(epoch_iterator, num_batches, device)
        if self.args.penalty == "continuation":
            total = torch.zeros(1, dtype=torch.float64)
            for index, batch in enumerate(batch_samples):
                generator = _seeded(self.args.seed, self.state.global_step, index, self.accelerator.process_index)
                batch[ACTIVE_MASK_KEY] = self.active_mask(batch["labels"].cpu(), generator)
                total += batch[ACTIVE_MASK_KEY].sum().double()
            self._step_active_tokens = self._step_totals(total).reshape(())
        return batch_samples, num_items_in_batch

    def compute_unlearning_loss(
        self, model: Any, inputs: dict[str, Any], denominators: LossDenominators
    ) -> torch.Tensor:
        args = self.args
        forget = self.score(model, inputs)
        margins, mask = restricted_margin(forget.logits, forget.labels, args.top_k, args.margin_beta)
        if args.penalty == "full":
            active, n_active = mask, denominators.forget_tokens
        elif ACTIVE_MASK_KEY in inputs and self.in_training_step and self._step_active_tokens is not None:
            active, n_active = inputs[ACTIVE_MASK_KEY].to(mask.device), self._step_active_tokens.to(mask.device)
        else:  # outside a training step (evaluation, direct calls): this batch's own cut and count
            active = self.active_mask(forget.labels.cpu(), _seeded(args.seed)).to(mask.device)
            n_active = None
        if args.hinge == "buffered":
            hinge = buffered_hinge_loss(margins, active, args.tau, args.buffer_eta, n_active)
        else:
            hinge = margin_hinge_loss(margins, active, args.tau, n_active)
        loss = args.forget_weight * hinge
        self.log_metric("masc_hinge", hinge)
        self.log_metric("forget_nll", forget.mean_nll)
        self.log_metric("forget_violation_rate", violation_rate_tensor(margins.detach(), active, args.tau))
        if args.retain_weight > 0 and RETAIN_PREFIX + "input_ids" in inputs:
            retain = self.score(model, inputs, RETAIN_PREFIX)
            reference = self.reference_scores(inputs, RETAIN_PREFIX)
            kl = kl_retain_loss(retain.logits, reference.logits, retain.labels, denominators.retain_tokens)
            self.log_metric("retain_kl", kl)
            self.log_metric("retain_nll", retain.mean_nll)
            loss = loss + args.retain_weight * kl
        return loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        callback = getattr(self, "stopping_callback", None)
        if callback is not None and callback.pending_logs and self.model.training:
            logs.update(callback.pending_logs)
            callback.pending_logs = {}
        super().log(logs, start_time)

    def card_section(self) -> str:
        """Markdown of the card's *Stopping* section: whether the rule or the step budget ended the run."""
        cb = self.stopping_callback
        rule = f"confirm_rule={cb.confirm_rule!r}, trigger={cb.trigger:.4g}, stop_tolerance={cb.stop_tolerance:.4g}"
        if cb.calibration:
            rule += f" (calibrated on {cb.calibration['examples']} never-seen rows)"
        if cb.stop_reason == "rule":
            return f"## Stopping\n\nMASC stopped by its rule at step {cb.stopped_at_step} ({rule})."
        if cb.stop_reason == "budget":
            return (
                "## Stopping\n\n> [!WARNING]\n> **MASC did not stop by its rule: the step budget ended the run** "
                f"(stop_reason: budget, {self.state.global_step} of max_steps={cb.max_steps} steps; {rule}). The "
                "model may be under- or over-unlearned; see `masc_stopping.json`."
            )
        return f"## Stopping\n\nTraining has not finished ({self.state.global_step} steps so far; {rule})."

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """Write the weights and ``masc_stopping.json`` beside them."""
        super()._save(output_dir, state_dict)
        if self.args.should_save and getattr(self, "stopping_callback", None) is not None:
            self.stopping_callback.save(output_dir if output_dir is not None else self.args.output_dir)

    #: The margin stopping rule is MASC's strength selection.
    stops_itself: ClassVar[bool] = True
