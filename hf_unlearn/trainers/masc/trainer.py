"""MASC (Margin Self-Correction): a trainer that unlearns by pushing down restricted margins and stops by itself.

The loss is ``forget_weight`` times the buffered hinge (:func:`hf_unlearn.losses.buffered_hinge_loss`) on the
continuation of each forget answer (:func:`hf_unlearn.losses.continuation_mask`), optionally plus
``retain_weight * KL(pi_0 || pi_theta)`` on retain answers. :class:`MarginStoppingCallback` checks the
authors' two-stage rule every ``check_every`` steps (stage 1: mean per-example violation rate of a few forget
training batches ``<= stop_trigger``; stage 2: its anytime Hoeffding upper bound on ``confirm_examples`` forget
training examples ``<= stop_tolerance``) and sets ``control.should_training_stop`` when it is confirmed. The
callback is an ``ExportableState``: its history and decision are saved in every checkpoint's
``trainer_state.json`` and restored on resume, and ``masc_stopping.json`` is written beside the weights.

Deviations from the authors' script, named: the random continuation cuts are drawn from generators seeded by
``(seed, step, micro-batch)`` (training) and ``(seed, step, stage)`` (probes) rather than Python's global RNG, so
that a resumed run is exact; under gradient accumulation the hinge is averaged over the active tokens of the
whole optimizer step (the authors do not accumulate); the epoch is one pass over the forget set (the authors'
epoch cycles the forget loader over the retain loader's length, which only matters when the rule never fires).
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from accelerate.utils import is_peft_model
from datasets import Dataset
from transformers import PreTrainedModel, TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import ExportableState

from ...losses import (
    answer_mask,
    buffered_hinge_loss,
    continuation_mask,
    hoeffding_upper_bound,
    kl_retain_loss,
    margin_hinge_loss,
    masc_probability_from_threshold,
    masc_violation_counts,
    per_example_violation_rates,
    restricted_margin,
    sample_cut_ratios,
)
from ...safe_output import atomic_write_json
from ..unlearning_trainer import (
    MODEL_COLUMNS,
    RETAIN_PREFIX,
    LossDenominators,
    UnlearningTrainer,
    to_trl_format,
)
from .config import MASCConfig

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
       ``probe(model, "confirm", step)`` returns the rates of ``n`` examples, and training stops when
       ``mean + sqrt(log(1/delta_j) / (2n)) <= alpha`` with ``delta_j = 6 delta / (pi^2 (j+1)^2)``
       (:func:`~hf_unlearn.losses.hoeffding_upper_bound`).

    ``mode="heldout"`` (the earlier rule): ``probe(model, "heldout", step)`` returns ``(violations, positions)``
    of a held-out slice and training stops when their ratio is ``<= alpha``.

    ``probe`` is attached by the trainer and is not part of the saved state. Attributes (saved and restored):
    ``violation_history`` (one dict per measurement; the one at step 0 is the starting model, not a check),
    ``stopped_at_step`` (or ``None``), ``num_confirmations`` (``j``), ``budget_exhausted``, ``max_steps``.
    """

    def __init__(
        self,
        mode: str = "train",
        check_every: int = 2,
        trigger: float = 0.475,
        alpha: float = 0.475,
        delta: float = 0.05,
        rule: dict[str, Any] | None = None,
    ) -> None:
        if mode not in ("train", "heldout"):
            raise ValueError(f"mode must be 'train' or 'heldout', got {mode!r}.")
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"stop_tolerance (alpha) must lie in (0, 1), got {alpha}.")
        if int(check_every) < 1:
            raise ValueError(f"check_every must be >= 1, got {check_every}.")
        self.mode = mode
        self.check_every = int(check_every)
        self.trigger = float(trigger)
        self.alpha = float(alpha)
        self.delta = float(delta)
        self.rule = dict(rule or {})
        self.violation_history: list[dict[str, Any]] = []
        self.stopped_at_step: int | None = None
        self.num_confirmations = 0
        self.budget_exhausted = False
        self.max_steps: int | None = None
        self.pending_logs: dict[str, float] = {}
        self.probe: Callable[[Any, str, int], Any] | None = None

    # ----- ExportableState ------------------------------------------------------------------------------------------

    def state(self) -> dict:
        return {
            "args": {
                "mode": self.mode, "check_every": self.check_every, "trigger": self.trigger, "alpha": self.alpha,
                "delta": self.delta, "rule": self.rule,
            },
            "attributes": {
                "violation_history": [dict(h) for h in self.violation_history],
                "stopped_at_step": self.stopped_at_step,
                "num_confirmations": self.num_confirmations,
                "budget_exhausted": self.budget_exhausted,
                "max_steps": self.max_steps,
            },
        }

    def load_state(self, state: dict) -> None:
        """Restore the attributes of a :meth:`state` dict (the rule's arguments must match)."""
        for key, value in state.get("attributes", {}).items():
            setattr(self, key, value)

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

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        self.max_steps = int(state.max_steps)
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
            mean = sum(rates) / len(rates)
            bound, delta_j = hoeffding_upper_bound(mean, len(rates), self.delta, self.num_confirmations)
            stop = bound <= self.alpha
            entry.update({
                "confirmation": self.num_confirmations, "confirm_violation_rate": mean,
                "confirm_examples": len(rates), "delta_j": delta_j, "hoeffding_bound": bound, "confirmed": stop,
            })
            logs.update({"masc/confirm_violation_rate": mean, "masc/hoeffding_bound": bound})
        else:
            stop = False
        self.violation_history.append(entry)
        control.should_log = True
        if stop:
            self.stopped_at_step = step
            logs["masc/stopped_at_step"] = float(step)
            control.should_training_stop = True
            logger.info("MASC stopping rule fired at step %d: %s", step, entry)
        self.pending_logs = logs
        return control

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs):
        if self.stopped_at_step is None:
            self.budget_exhausted = True
            last = self.violation_history[-1] if self.violation_history else {}
            warnings.warn(
                f"MASC hit its step budget ({state.global_step} steps) before the stopping rule fired (last check: "
                f"{last}). Raise the budget (num_train_epochs / max_steps) or the learning rate, or loosen the "
                "threshold (rho / tau) or the tolerance (alpha).",
                stacklevel=2,
            )
        return control

    # ----- reporting ------------------------------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """The rule, its history and the outcome, as saved in ``masc_stopping.json``."""
        if self.mode == "heldout":
            description = "stop at the first check where the held-out violation rate |{t: m_t > tau}| / |T| <= alpha"
        else:
            description = (
                "two-stage: mean per-example violation rate of the first training batches <= trigger, then "
                "Hoeffding bound mean + sqrt(log(1/delta_j)/(2n)), delta_j = 6 delta/(pi^2 (j+1)^2), on the "
                "confirmation examples <= alpha"
            )
        tau = self.rule.get("tau")
        return {
            "rule": {
                "description": description,
                "margin": "m_t = beta * z(y_t|c_t) - logsumexp_{v in top-k \\ {y_t}} beta * z(v|c_t)",
                "mode": self.mode, "check_every": self.check_every, "trigger": self.trigger, "alpha": self.alpha,
                "delta": self.delta, **self.rule,
                "rho": masc_probability_from_threshold(tau) if tau is not None else None,
            },
            "stopped_at_step": self.stopped_at_step,
            "stopped_by_rule": self.stopped_at_step is not None,
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
    adapter disabled. :class:`MarginStoppingCallback` decides when to stop; ``stopped_at_step`` and
    ``violation_history`` report the outcome and :meth:`save_model` writes ``masc_stopping.json`` beside the
    weights (and in every checkpoint).

    Example::

        trainer = MASCTrainer(model, MASCConfig("out"), train_dataset=forget, processing_class=tokenizer)
        trainer.train()            # stops by itself
        trainer.stopped_at_step, trainer.violation_history
    """

    _tag_names = ["trl", "hf-unlearn", "unlearning", "masc"]
    _name = "MASC"
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
    ):
        if args is not None and not isinstance(args, MASCConfig):
            raise TypeError(f"MASCTrainer needs a MASCConfig, got {type(args).__name__}.")
        args = self._resolve_args(args, model)
        if train_dataset is None:
            raise ValueError("`train_dataset` (the forget set) is required.")
        forget = train_dataset if isinstance(train_dataset, Dataset) else Dataset.from_list(list(train_dataset))
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
        vocab = self.model.get_output_embeddings().weight.shape[0]
        if self.args.top_k > vocab - 1:
            raise ValueError(
                f"top_k={self.args.top_k} is larger than the vocabulary allows: at most vocab_size - 1 = {vocab - 1} "
                "rival tokens exist."
            )
        self._step_active_tokens: torch.Tensor | None = None
        self.validation_dataset = None
        if held_out is not None:
            self._heldout_batches = self._heldout_probe_batches(held_out, len(train_dataset))
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
        self.stopping_callback = MarginStoppingCallback(
            mode=self.args.stop_probe, check_every=self.args.check_every, trigger=self.args.stop_trigger,
            alpha=self.args.stop_tolerance, delta=self.args.confirm_delta, rule=rule,
        )
        self.stopping_callback.probe = self.probe
        self.add_callback(self.stopping_callback)

    # ----- probes -----------------------------------------------------------------------------------------------

    def _batches(self, rows: list[dict[str, Any]], batch_size: int) -> list[dict[str, torch.Tensor]]:
        return [self.data_collator(rows[i : i + batch_size]) for i in range(0, len(rows), batch_size)]

    def _heldout_probe_batches(self, held_out: Dataset, n_forget: int) -> list[dict[str, torch.Tensor]]:
        validation = to_trl_format(held_out, self.processing_class)
        if not self._skip_prepare_dataset:
            validation = self._prepare_dataset(
                validation, self.processing_class, self.args, False, None, "MASC validation"
            )
        rows = [{k: validation[i][k] for k in MODEL_COLUMNS} for i in range(len(validation))]
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

    @torch.no_grad()
    def probe(self, model: Any, stage: str, step: int) -> Any:
        """What :class:`MarginStoppingCallback` measures under ``model`` (eval mode, no gradient).

        ``stage="trigger"`` / ``"confirm"``: the per-example violation rates (a list) of the first forget training
        examples (stage-1 and stage-2 sizes), each over its continuation after a cut drawn from a generator
        seeded by ``(seed, step, stage)``. ``stage="heldout"``: ``(violations, positions)`` pooled over the whole
        answers of the held-out slice.
        """
        args = self.args
        batches = {"trigger": "_trigger_batches", "confirm": "_confirm_batches", "heldout": "_heldout_batches"}[stage]
        batches = getattr(self, batches)
        generator = _seeded(args.seed, step, {"trigger": 1, "confirm": 2, "heldout": 3}[stage])
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
        self.stopping_callback = current

    # ----- configuration -----------------------------------------------------------------------------------------

    @classmethod
    def needs_retain(cls, args: MASCConfig) -> bool:
        """The retain set is used for the KL term, so only when ``retain_weight > 0``."""
        return args.retain_weight > 0

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

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """Write the weights (as the Trainer does) and ``masc_stopping.json`` beside them, into the folder being
        built (the base trainer swaps it in only once complete; checkpoints included)."""
        super()._save(output_dir, state_dict)
        if self.args.should_save and getattr(self, "stopping_callback", None) is not None:
            self.stopping_callback.save(output_dir if output_dir is not None else self.args.output_dir)


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
