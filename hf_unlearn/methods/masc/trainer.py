"""MASC (Margin Self-Correction): a trainer that unlearns by pushing down restricted margins and stops by itself.

The loss is ``forget_weight`` times the buffered hinge (:func:`hf_unlearn.methods.masc.loss.buffered_hinge_loss`) on the
continuation of each forget answer (:func:`hf_unlearn.methods.masc.loss.continuation_mask`), plus
``retain_weight * KL(pi_0 || pi_theta)`` on retain answers (the paper's objective; the weights and thresholds come
from the config's ``recipe``, ``"auto"`` resolved here from the model's parameter count: the authors' small-model
recipe below 2B parameters, their Llama-2-7B one above, recorded as ``MASCTrainer.recipe`` and in
``masc_stopping.json``). :class:`MarginStoppingCallback` checks the authors' two-stage rule every ``check_every``
steps (stage 1: mean per-example violation rate of a few forget training batches ``<= stop_trigger``; stage 2: the
plain mean of ``confirm_examples`` forget training examples, or its anytime Hoeffding upper bound, ``<=
stop_tolerance``) and sets ``control.should_training_stop`` when it is confirmed; a run that reaches ``max_steps``
first records ``stop_reason="budget"`` and warns. The callback is an ``ExportableState``: its history and decision
are saved in every checkpoint's ``trainer_state.json`` and restored on resume, and ``masc_stopping.json`` is
written beside the weights.

Every probe tokenizes its rows as the training set is tokenized (the same ``prompt_template`` and
``max_length``), so the stopping rule measures the tokens the loss acts on.

Documents (a list of strings, a path, a ``text`` dataset) are cut into chunks of ``max_length`` tokens as for
every trainer; a chunk has no question, so the whole chunk is its "answer": the continuation is what follows a
cut at a random 20-60% (``continuation_cut_min_ratio`` .. ``_max_ratio``) of the chunk's tokens, and the probes
measure chunks alike. With ``stop_probe="heldout"`` the held-out slice is whole documents.

Deviations from the authors' script, named: the random continuation cuts are drawn from generators seeded by
``(seed, step, micro-batch)`` (training) and ``(seed, step, stage)`` (probes) rather than Python's global RNG, so
that a resumed run is exact; under gradient accumulation the hinge is averaged over the active tokens of the
whole optimizer step (the authors do not accumulate); by default the epoch is one pass over the forget set
(``epoch_length="max(forget,retain)"`` is the authors' epoch, which cycles the forget set over the retain set's
length; it only matters for an epoch budget).
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
from accelerate.utils import is_peft_model
from datasets import Dataset
from transformers import PreTrainedModel, TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import ExportableState

from ...data import overlapping_examples, retain_partner_indices
from ...partitioning import vocab_size
from ...safe_output import atomic_write_json
from ..base.guards import any_process
from ..base.losses import LossDenominators, answer_mask, kl_retain_loss
from ..base.pairing import MODEL_COLUMNS, RETAIN_PREFIX, PairedForgetRetainDataset, as_dataset, to_trl_format
from ..base.trainer import UnlearningTrainer
from .config import MASCConfig
from .loss import (
    MASC_CONFIRM_RULES,
    buffered_hinge_loss,
    confirmation_statistic,
    continuation_mask,
    margin_hinge_loss,
    masc_probability_from_threshold,
    masc_violation_counts,
    per_example_violation_rates,
    restricted_margin,
    sample_cut_ratios,
)

logger = logging.getLogger(__name__)

STOPPING_FILE = "masc_stopping.json"
ACTIVE_MASK_KEY = "masc_active_mask"


def _seeded(*keys: int) -> torch.Generator:
    """A CPU generator seeded by a fixed mix of integer keys (seed, step, ...)."""
    value = 0
    for k in keys:
        value = (value * 1_000_003 + int(k) + 1) % (2**61 - 1)
    return torch.Generator().manual_seed(value)


class MarginStoppingCallback(TrainerCallback, ExportableState):
    """MASC's online stopping rule, with its state saved in checkpoints (``ExportableState``).

    ``mode="train"`` (the authors' rule). At every ``check_every``-th optimizer step:

    1. *trigger*: ``probe(model, "trigger", step)`` returns the per-example violation rates of the first
       forget training batches; the check is armed when their mean is ``<= trigger``;
    2. *confirmation* ``j`` (``j = 1, 2, ...`` counts armed checks, as the authors' ``eval_index``):
       ``probe(model, "confirm", step)`` returns the rates of ``n`` examples, and training stops when the
       statistic of ``confirm_rule`` is ``<= alpha``
       (:func:`~hf_unlearn.methods.masc.loss.confirmation_statistic`): ``"mean"`` (the authors' TOFU run) their plain
       mean; ``"hoeffding"`` the anytime bound ``mean + sqrt(log(1/delta_j) / (2n))``,
       ``delta_j = 6 delta / (pi^2 (j+1)^2)`` (:func:`~hf_unlearn.methods.masc.loss.hoeffding_upper_bound`).

    With ``calibrate=True`` the trigger and ``alpha`` are set at the start of training (step 0, before any
    update) to the mean per-example violation rate of never-seen rows under the starting model
    (``probe(model, "calibrate", 0)``): the rate a model shows on what it never learnt is what "forgotten"
    looks like.

    ``mode="heldout"`` (the earlier rule): ``probe(model, "heldout", step)`` returns ``(violations, positions)``
    of a held-out slice and training stops when their ratio is ``<= alpha``.

    ``probe`` is attached by the trainer and is not part of the saved state. Attributes (saved and restored):
    ``violation_history`` (one dict per measurement; the one at step 0 is the starting model, not a check),
    ``stopped_at_step`` (or ``None``), ``num_confirmations`` (``j``), ``budget_exhausted``, ``max_steps``,
    ``stop_reason`` (``"rule"``, ``"budget"``, or ``None`` while running), ``calibration`` (or ``None``).
    """

    def __init__(
        self,
        mode: str = "train",
        check_every: int = 2,
        trigger: float = 0.475,
        alpha: float = 0.475,
        delta: float = 0.05,
        rule: dict[str, Any] | None = None,
        confirm_rule: str = "mean",
        calibrate: bool = False,
    ) -> None:
        if mode not in ("train", "heldout"):
            raise ValueError(f"mode must be 'train' or 'heldout', got {mode!r}.")
        if confirm_rule not in MASC_CONFIRM_RULES:
            raise ValueError(f"confirm_rule must be one of {list(MASC_CONFIRM_RULES)}, got {confirm_rule!r}.")
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"stop_tolerance (alpha) must lie in (0, 1), got {alpha}.")
        if int(check_every) < 1:
            raise ValueError(f"check_every must be >= 1, got {check_every}.")
        self.mode = mode
        self.check_every = int(check_every)
        self.trigger = float(trigger)
        self.alpha = float(alpha)
        self.delta = float(delta)
        self.confirm_rule = confirm_rule
        self.calibrate = bool(calibrate)
        self.rule = dict(rule or {})
        self.violation_history: list[dict[str, Any]] = []
        self.stopped_at_step: int | None = None
        self.num_confirmations = 0
        self.budget_exhausted = False
        self.max_steps: int | None = None
        self.stop_reason: str | None = None
        self.calibration: dict[str, Any] | None = None
        self.pending_logs: dict[str, float] = {}
        self.probe: Callable[[Any, str, int], Any] | None = None
        # the decision every process follows (the trainer sets it: the main process's, shared by one all-reduce)
        self.agree: Callable[[bool], bool] = bool

    # ----- ExportableState ------------------------------------------------------------------------------------------

    def state(self) -> dict:
        return {
            "args": {
                "mode": self.mode, "check_every": self.check_every, "trigger": self.trigger, "alpha": self.alpha,
                "delta": self.delta, "rule": self.rule, "confirm_rule": self.confirm_rule,
                "calibrate": self.calibrate,
            },
            "attributes": {
                "violation_history": [dict(h) for h in self.violation_history],
                "stopped_at_step": self.stopped_at_step,
                "num_confirmations": self.num_confirmations,
                "budget_exhausted": self.budget_exhausted,
                "max_steps": self.max_steps,
                "stop_reason": self.stop_reason,
                "calibration": self.calibration,
            },
        }

    def load_state(self, state: dict) -> None:
        """Restore the attributes of a :meth:`state` dict (the rule's arguments must match); a calibrated
        trigger and ``alpha`` come back with the calibration."""
        for key, value in state.get("attributes", {}).items():
            setattr(self, key, value)
        if self.calibration:
            self.trigger = self.alpha = float(self.calibration["threshold"])

    # ----- measuring ------------------------------------------------------------------------------------------------

    def _probe(self, model: Any, stage: str, step: int) -> Any:
        if self.probe is None:
            raise RuntimeError("MarginStoppingCallback has no probe: it is attached by MASCTrainer.")
        return self.probe(model, stage, step)

    def _trigger_entry(self, model: Any, step: int) -> dict[str, Any]:
        if self.mode == "heldout":
            violations, positions = self._probe(model, "heldout", step)
            rate = violations / positions
            return {"step": int(step), "violation_rate": rate, "violations": int(violations), "positions": int(positions)}
        rates = [float(r) for r in self._probe(model, "trigger", step)]
        rate = sum(rates) / len(rates)
        return {"step": int(step), "violation_rate": rate, "examples": len(rates), "triggered": rate <= self.trigger}

    def calibrate_thresholds(self, model: Any) -> dict[str, Any]:
        """Set ``trigger`` and ``alpha`` to the mean per-example violation rate of the never-seen rows under
        ``model`` (clipped into ``(0, 1)``); returns the calibration record."""
        rates = [float(r) for r in self._probe(model, "calibrate", 0)]
        rate = sum(rates) / len(rates)
        threshold = min(max(rate, 1e-6), 1.0 - 1e-6)
        self.calibration = {
            "examples": len(rates), "violation_rate": rate, "threshold": threshold,
            "configured_trigger": self.trigger, "configured_alpha": self.alpha,
        }
        self.trigger = self.alpha = threshold
        logger.info("MASC calibrated its trigger and tolerance to %.4f on %d never-seen rows.", threshold, len(rates))
        return self.calibration

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        self.max_steps = int(state.max_steps)
        if self.calibrate and self.calibration is None and not self.violation_history:
            self.calibrate_thresholds(kwargs["model"])
        if not self.violation_history:
            entry = self._trigger_entry(kwargs["model"], state.global_step)
            entry["check"] = False
            entry.pop("triggered", None)
            self.violation_history.append(entry)
        return control

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        step = int(state.global_step)
        if step % self.check_every != 0 or self.stopped_at_step is not None:
            return control
        model = kwargs["model"]
        entry = self._trigger_entry(model, step)
        entry["check"] = True
        logs = {"masc/violation_rate": entry["violation_rate"]}
        if self.mode == "heldout":
            stop = entry["violation_rate"] <= self.alpha
        elif entry["triggered"]:
            self.num_confirmations += 1
            rates = [float(r) for r in self._probe(model, "confirm", step)]
            statistic, mean, delta_j = confirmation_statistic(rates, self.confirm_rule, self.delta, self.num_confirmations)
            stop = statistic <= self.alpha
            entry.update({
                "confirmation": self.num_confirmations, "confirm_violation_rate": mean,
                "confirm_examples": len(rates), "confirm_statistic": statistic, "confirmed": stop,
            })
            logs.update({"masc/confirm_violation_rate": mean})
            if self.confirm_rule == "hoeffding":
                entry.update({"delta_j": delta_j, "hoeffding_bound": statistic})
                logs["masc/hoeffding_bound"] = statistic
        else:
            stop = False
        agreed = bool(self.agree(stop))
        if agreed != stop:  # this process measured otherwise; the main process's decision holds for all
            entry["main_process_decision"] = agreed
        stop = agreed
        self.violation_history.append(entry)
        control.should_log = True
        if stop:
            self.stopped_at_step = step
            self.stop_reason = "rule"
            logs["masc/stopped_at_step"] = float(step)
            control.should_training_stop = True
            logger.info("MASC stopping rule fired at step %d: %s", step, entry)
        self.pending_logs = logs
        return control

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        if self.stopped_at_step is None:
            self.budget_exhausted = True
            self.stop_reason = "budget"
            last = self.violation_history[-1] if self.violation_history else {}
            message = (
                f"MASC hit its step budget ({state.global_step} steps) before the stopping rule fired, so the "
                f"budget, not the rule, ended this run (stop_reason='budget'; last check: {last}). Raise the "
                "budget (max_steps) or the learning rate, or loosen the threshold (rho / tau) or the tolerance "
                "(alpha)."
            )
            logger.warning(message)
            warnings.warn(message, stacklevel=2)
            state.log_history.append({"masc/stop_reason": "budget", "step": int(state.global_step)})
        return control

    # ----- reporting ------------------------------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """The rule, its history and the outcome, as saved in ``masc_stopping.json``."""
        if self.mode == "heldout":
            description = "stop at the first check where the held-out violation rate |{t: m_t > tau}| / |T| <= alpha"
        elif self.confirm_rule == "hoeffding":
            description = (
                "two-stage: mean per-example violation rate of the first training batches <= trigger, then "
                "Hoeffding bound mean + sqrt(log(1/delta_j)/(2n)), delta_j = 6 delta/(pi^2 (j+1)^2), on the "
                "confirmation examples <= alpha"
            )
        else:
            description = (
                "two-stage: mean per-example violation rate of the first training batches <= trigger, then "
                "the mean per-example violation rate of the confirmation examples <= alpha"
            )
        tau = self.rule.get("tau")
        return {
            "rule": {
                "description": description,
                "margin": "m_t = beta * z(y_t|c_t) - logsumexp_{v in top-k \\ {y_t}} beta * z(v|c_t)",
                "mode": self.mode, "check_every": self.check_every, "trigger": self.trigger, "alpha": self.alpha,
                "delta": self.delta, "confirm_rule": self.confirm_rule, "calibration": self.calibration, **self.rule,
                "rho": masc_probability_from_threshold(tau) if tau is not None else None,
            },
            "stopped_at_step": self.stopped_at_step,
            "stopped_by_rule": self.stopped_at_step is not None,
            "stop_reason": self.stop_reason,
            "budget_exhausted": self.budget_exhausted,
            "max_steps": self.max_steps,
            "num_confirmations": self.num_confirmations,
            "violation_history": [dict(h) for h in self.violation_history],
        }

    def save(self, output_dir: str | os.PathLike) -> str:
        """Write :meth:`summary` to ``output_dir/masc_stopping.json`` atomically; returns the path."""
        return str(atomic_write_json(os.path.join(output_dir, STOPPING_FILE), self.summary()))


class MASCTrainer(UnlearningTrainer):
    """MASC (Margin Self-Correction) unlearning trainer, a TRL ``SFTTrainer`` subclass that stops by itself.

    Loss of a step: ``forget_weight * (1/|A|) sum_{t in A} h(m_t)`` over the active forget answer positions ``A``
    (the continuation after a random cut, or the whole answer with ``penalty="full"``), ``h`` the buffered hinge
    ``relu(m - (tau - eta)) / eta`` (or the plain ``relu(m - tau)``), plus ``retain_weight * KL(pi_0 || pi_theta)``
    on retain answers when ``retain_weight > 0``. Without a ``peft_config`` the trainer builds the LoRA adapter
    of ``args.get_peft_config()`` (``use_peft=True``, the authors' setting), and ``pi_0`` is the model with the
    adapter disabled. :class:`MarginStoppingCallback` decides when to stop; ``stopped_at_step``, ``stop_reason``
    (``"rule"`` or ``"budget"``) and ``violation_history`` report the outcome, :meth:`save_model` writes
    ``masc_stopping.json`` beside the weights (and in every checkpoint), and the model card has a *Stopping*
    section.

    ``calibrate_stop_on``: rows the model never trained on (e.g. TOFU's holdout authors; refused when they share
    a row with the forget or retain set). At step 0 the starting model's mean per-example violation rate on them
    replaces ``stop_trigger`` and ``stop_tolerance``: the rule then stops once the forget set looks as the
    never-seen rows do.

    Example::

        trainer = MASCTrainer(model, MASCConfig("out"), train_dataset=forget, processing_class=tokenizer)
        trainer.train()            # stops by itself
        trainer.stopped_at_step, trainer.violation_history
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
        self,
        model: str | PreTrainedModel,
        args: MASCConfig | None = None,
        data_collator: Callable | None = None,
        train_dataset: Dataset | Sequence[dict[str, Any]] | None = None,
        retain_dataset: Dataset | Sequence[dict[str, Any]] | None = None,
        eval_dataset: Dataset | dict[str, Dataset] | None = None,
        processing_class: Any = None,
        callbacks: list | None = None,
        optimizers: tuple = (None, None),
        optimizer_cls_and_kwargs: tuple | None = None,
        quantization_config: Any = None,
        peft_config: Any = None,
        calibrate_stop_on: Dataset | Sequence[dict[str, Any]] | None = None,
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
        calibration_rows = self._check_calibration_rows(calibrate_stop_on, forget, retain_dataset, args)
        held_out = None
        if args.stop_probe == "heldout":
            forget, held_out = split_validation(forget, args.validation_fraction, args.seed)
        if peft_config is None and not (isinstance(model, torch.nn.Module) and is_peft_model(model)):
            peft_config = args.get_peft_config()

        super().__init__(
            model=model,
            args=args,
            data_collator=data_collator,
            train_dataset=forget,
            retain_dataset=retain_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            callbacks=callbacks,
            optimizers=optimizers,
            optimizer_cls_and_kwargs=optimizer_cls_and_kwargs,
            quantization_config=quantization_config,
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
            self.train_dataset = CycledPairedDataset(self.forget_dataset, self.retain_dataset, seed=self.args.seed)
        self._calibration_batches: list[dict[str, torch.Tensor]] = []
        if calibration_rows is not None:
            calibration = self._prepared_rows(calibration_rows, "MASC calibration")
            self._calibration_batches = self._batches(calibration, self.args.per_device_eval_batch_size)
        if held_out is not None:
            self._heldout_batches = self._heldout_probe_batches(held_out, len(forget) + len(held_out))
        else:
            rows = [{k: self.forget_dataset[i][k] for k in MODEL_COLUMNS} for i in range(len(self.forget_dataset))]
            trigger_n = min(len(rows), self.args.stop_probe_batches * self.args.per_device_train_batch_size)
            self._trigger_batches = self._batches(rows[:trigger_n], self.args.per_device_train_batch_size)
            self._confirm_batches = self._batches(rows[: self.args.confirm_examples], self.args.per_device_eval_batch_size)
        rule = {
            "tau": self.args.tau, "top_k": self.args.top_k, "margin_beta": self.args.margin_beta,
            "penalty": self.args.penalty, "probe": self.args.stop_probe,
            "trigger_examples": None if held_out is not None else trigger_n,
            "confirm_examples": None if held_out is not None else min(len(rows), self.args.confirm_examples),
        }
        if calibration_rows is not None:
            rule["calibration_examples"] = len(calibration)
        rule["recipe"] = self.recipe = recipe
        self.stopping_callback = MarginStoppingCallback(
            mode=self.args.stop_probe, check_every=self.args.check_every, trigger=self.args.stop_trigger,
            alpha=self.args.stop_tolerance, delta=self.args.confirm_delta, rule=rule,
            confirm_rule=self.args.confirm_rule, calibrate=calibration_rows is not None,
        )
        self.stopping_callback.probe = self.probe
        self.stopping_callback.agree = self._main_process_decides
        self.add_callback(self.stopping_callback)

    # ----- probes -----------------------------------------------------------------------------------------------

    def _batches(self, rows: list[dict[str, Any]], batch_size: int) -> list[dict[str, torch.Tensor]]:
        return [self.data_collator(rows[i : i + batch_size]) for i in range(0, len(rows), batch_size)]

    @staticmethod
    def _check_calibration_rows(
        rows: Any, forget: Dataset, retain: Any, args: MASCConfig
    ) -> Dataset | None:
        """``calibrate_stop_on`` as a dataset, refused before any work when it is empty, used with the held-out
        rule, or shares rows with the forget or retain set (it must be rows the model never trained on)."""
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
        """``rows`` tokenized exactly as the training set is (:func:`to_trl_format` with ``prompt_template``, then
        TRL's preparation and truncation to ``max_length``)."""
        prepared = to_trl_format(rows, self.processing_class, self.args.prompt_template, self.args.max_length)
        if not self._skip_prepare_dataset:
            prepared = self._prepare_dataset(prepared, self.processing_class, self.args, False, None, name)
        return [{k: prepared[i][k] for k in MODEL_COLUMNS} for i in range(len(prepared))]

    def _heldout_probe_batches(self, held_out: Dataset, n_forget: int) -> list[dict[str, torch.Tensor]]:
        rows = self._prepared_rows(held_out, "MASC validation")
        validation = Dataset.from_list(rows)
        positions = sum(int(answer_mask(torch.tensor([r["labels"]])).sum()) for r in rows)
        needed = self.args.min_validation_size
        if positions < needed:
            raise ValueError(
                f"The held-out validation slice ({len(held_out)} of {n_forget} forget examples) has {positions} "
                f"answer positions; the stopping rule needs at least {needed} (max(min_validation_positions="
                f"{self.args.min_validation_positions}, ceil(1/stop_tolerance))) to measure a violation rate. Raise "
                "validation_fraction or use a larger forget set."
            )
        self.validation_dataset = validation
        return self._batches(rows, self.args.per_device_eval_batch_size)

    def active_mask(self, labels: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """The positions MASC penalises and measures: the continuation after a random cut
        (``penalty="continuation"``) or every answer position (``"full"``)."""
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
        """The main process's stop decision on every process: ``sum_r [stop_r and r == 0] > 0``, one all-reduce
        (:func:`~hf_unlearn.methods.base.guards.any_process`), so that all processes stop at the same step."""
        return any_process(bool(stop) and self.accelerator.is_main_process, self.accelerator)

    @torch.no_grad()
    def probe(self, model: Any, stage: str, step: int) -> Any:
        """What :class:`MarginStoppingCallback` measures under ``model`` (eval mode, no gradient).

        ``stage="trigger"`` / ``"confirm"``: the per-example violation rates (a list) of the first forget training
        examples (stage-1 and stage-2 sizes), each over its continuation after a cut drawn from a generator
        seeded by ``(seed, step, stage)``; ``"calibrate"``: the same for the ``calibrate_stop_on`` rows.
        ``stage="heldout"``: ``(violations, positions)`` pooled over the whole
        answers of the held-out slice.
        """
        args = self.args
        batches = {"trigger": "_trigger_batches", "confirm": "_confirm_batches", "heldout": "_heldout_batches",
                   "calibrate": "_calibration_batches"}[stage]
        batches = getattr(self, batches)
        generator = _seeded(args.seed, step, {"trigger": 1, "confirm": 2, "heldout": 3, "calibrate": 4}[stage])
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        rates: list[float] = []
        violations = positions = 0
        try:
            for batch in batches:
                batch = {k: v.to(device) for k, v in batch.items() if torch.is_tensor(v)}
                logits = model(
                    input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"),
                    position_ids=batch.get("position_ids"), use_cache=False,
                ).logits
                margins, mask = restricted_margin(logits, batch["labels"], args.top_k, args.margin_beta)
                if stage == "heldout":
                    v, n = masc_violation_counts(margins, mask, args.tau)
                    violations, positions = violations + v, positions + n
                else:
                    active = self.active_mask(batch["labels"], generator).to(margins.device)
                    rates.extend(per_example_violation_rates(margins, active, args.tau).tolist())
        finally:
            if was_training:
                model.train()
        return (violations, positions) if stage == "heldout" else rates

    def _load_callback_state(self) -> None:
        """Restore the stopping rule's state on resume, whatever ``restore_callback_states_from_checkpoint`` says
        (the rule's history and decision are part of the training state), and re-attach its probe."""
        super()._load_callback_state()
        current = next(
            (cb for cb in self.callback_handler.callbacks if isinstance(cb, MarginStoppingCallback)), None
        )
        if current is None:
            self.add_callback(self.stopping_callback)
            current = self.stopping_callback
        stored = self.state.stateful_callbacks.get(MarginStoppingCallback.__name__)
        if isinstance(stored, list):
            stored = stored[-1] if stored else None
        if stored:
            current.load_state(stored)
        current.probe = self.probe
        current.agree = self._main_process_decides
        self.stopping_callback = current

    # ----- configuration -----------------------------------------------------------------------------------------

    @classmethod
    def needs_retain(cls, args: MASCConfig) -> bool:
        """The retain set is used for the KL term (``retain_weight > 0``) and, with
        ``epoch_length="max(forget,retain)"``, to count the epoch."""
        return args.retain_weight > 0 or args.epoch_length != "forget"

    @classmethod
    def needs_reference_model(cls, args: MASCConfig) -> bool:
        """``KL(pi_0 || pi_theta)`` needs the frozen starting model ``pi_0``."""
        return args.retain_weight > 0

    # ----- outcome -----------------------------------------------------------------------------------------------

    @property
    def stopped_at_step(self) -> int | None:
        """Global step at which the stopping rule fired (``None`` if it has not, e.g. the budget was hit)."""
        return self.stopping_callback.stopped_at_step

    @property
    def stop_reason(self) -> str | None:
        """``"rule"`` (the stopping rule ended the run), ``"budget"`` (the step budget did: the rule never
        confirmed) or ``None`` (not trained to the end yet)."""
        return self.stopping_callback.stop_reason

    @property
    def violation_history(self) -> list[dict[str, Any]]:
        """One dict per measurement (``step``, ``violation_rate``, and for confirmed checks ``hoeffding_bound``
        ...); the entry at step 0 is the starting model."""
        return self.stopping_callback.violation_history

    # ----- the loss ----------------------------------------------------------------------------------------------

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        batch_samples, num_items_in_batch = super().get_batch_samples(epoch_iterator, num_batches, device)
        if self.args.penalty == "continuation":
            total = torch.zeros((), dtype=torch.float64)
            for index, batch in enumerate(batch_samples):
                generator = _seeded(self.args.seed, self.state.global_step, index, self.accelerator.process_index)
                batch[ACTIVE_MASK_KEY] = self.active_mask(batch["labels"].cpu(), generator)
                total += batch[ACTIVE_MASK_KEY].sum().double()
            scale = 1.0
            if self.args.average_tokens_across_devices and self.accelerator.num_processes > 1:
                total = self.accelerator.gather(total.reshape(1).float().to(self.accelerator.device)).sum().double().cpu()
                scale = float(self.accelerator.num_processes)
            self._step_active_tokens = (total / scale).clamp(min=1.0 / scale).float()
        return batch_samples, num_items_in_batch

    def compute_unlearning_loss(
        self, model: Any, inputs: dict[str, Any], denominators: LossDenominators
    ) -> torch.Tensor:
        args = self.args
        forget = self.score(model, inputs)
        margins, mask = restricted_margin(forget.logits, forget.labels, args.top_k, args.margin_beta)
        if args.penalty == "full":
            active, n_active = mask, denominators.forget_tokens
        elif ACTIVE_MASK_KEY in inputs and self._in_training_step and self._step_active_tokens is not None:
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
        violations, positions = masc_violation_counts(margins.detach(), active, args.tau)
        self.log_metric("forget_violation_rate", violations / max(positions, 1))
        if args.retain_weight > 0 and RETAIN_PREFIX + "input_ids" in inputs:
            retain = self.score(model, inputs, RETAIN_PREFIX)
            reference = self.reference_scores(inputs, RETAIN_PREFIX)
            kl = kl_retain_loss(retain.logits, reference.logits, retain.labels, denominators.retain_tokens)
            self.log_metric("retain_kl", kl)
            self.log_metric("retain_nll", retain.mean_nll)
            loss = loss + args.retain_weight * kl
        return loss

    # ----- logging and saving ------------------------------------------------------------------------------------

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        callback = getattr(self, "stopping_callback", None)
        if callback is not None and callback.pending_logs and self.model.training:
            logs.update(callback.pending_logs)
            callback.pending_logs = {}
        super().log(logs, start_time)

    def create_model_card(self, model_name: str | None = None, dataset_name: str | None = None,
                          tags: str | list[str] | None = None, report: Any = None, forget_split: str | None = None):
        """The base trainer's card (:func:`hf_unlearn.hub.trainer_model_card`) with a *Stopping* section saying
        whether the rule or the step budget ended the run (a warning block when it was the budget)."""
        if not self.is_world_process_zero():
            return
        from ...hub import trainer_model_card
        from ...safe_output import atomic_write_text

        card = trainer_model_card(self, model_name, dataset_name, tags, report=report, forget_split=forget_split)
        card.text = card.text.rstrip("\n") + "\n\n" + self.stopping_card_section() + "\n"
        atomic_write_text(os.path.join(self.args.output_dir, "README.md"), str(card))

    def stopping_card_section(self) -> str:
        """Markdown of the model card's *Stopping* section."""
        cb = self.stopping_callback
        rule = f"confirm_rule={cb.confirm_rule!r}, trigger={cb.trigger:.4g}, alpha={cb.alpha:.4g}"
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
        """Write the weights (as the Trainer does) and ``masc_stopping.json`` beside them, into the folder being
        built (the base trainer swaps it in only once complete; checkpoints included)."""
        super()._save(output_dir, state_dict)
        if self.args.should_save and getattr(self, "stopping_callback", None) is not None:
            self.stopping_callback.save(output_dir if output_dir is not None else self.args.output_dir)


class CycledPairedDataset(PairedForgetRetainDataset):
    """The authors' epoch: ``max(len(forget), len(retain))`` items, item ``i`` the forget example ``i mod
    len(forget)`` with its retain partner, so that one epoch cycles the smaller set over the larger one (as their
    loop cycles the forget loader over the retain loader). Partners are redrawn each epoch (:meth:`set_epoch`);
    with a shuffled sampler every forget example occurs ``floor`` or ``ceil`` of ``length / len(forget)`` times
    per epoch."""

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        self.length = max(len(self.forget), len(self.retain))
        self.partners = retain_partner_indices(self.length, len(self.retain), self.seed, self.epoch)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Any]:
        forget = self.forget[int(index) % len(self.forget)]
        retain = self.retain[self.partners[int(index)]]
        item = {key: forget[key] for key in self.columns}
        item.update({RETAIN_PREFIX + key: retain[key] for key in self.columns})
        return item


def split_validation(forget: Dataset, fraction: float, seed: int) -> tuple[Dataset, Dataset]:
    """Split the forget set into (training part, held-out slice) for ``stop_probe="heldout"``:
    ``max(1, round(fraction * n))`` examples drawn with ``seed`` are held out, and at least one is left to train on."""
    n = len(forget)
    if n < 2:
        raise ValueError(
            f"The forget set has {n} example(s): MASC's held-out rule holds out part of it to decide when to stop "
            "and trains on the rest, so it needs at least 2 (or use stop_probe='train')."
        )
    held = min(n - 1, max(1, round(fraction * n)))
    order = torch.randperm(n, generator=torch.Generator().manual_seed(int(seed))).tolist()
    return forget.select(sorted(order[held:])), forget.select(sorted(order[:held]))
