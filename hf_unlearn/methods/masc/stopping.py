"""MASC's stopping rule (:class:`MarginStoppingCallback`) and :func:`split_validation`, the held-out slice."""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from typing import Any

import torch
from datasets import Dataset
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import ExportableState

from ...safe_output import atomic_write_json
from .loss import confirmation_statistic, masc_probability_from_threshold

logger = logging.getLogger(__name__)

STOPPING_FILE = "masc_stopping.json"
_SAVED_ATTRIBUTES = ("violation_history", "stopped_at_step", "num_confirmations", "budget_exhausted", "max_steps",
                     "stop_reason", "calibration")


class MarginStoppingCallback(TrainerCallback, ExportableState):
    """MASC's online stopping rule, its state saved in checkpoints. ``mode="train"``, every ``check_every`` steps:
    when the mean of ``probe(model, "trigger", step)`` is ``<= trigger``, confirmation ``j`` stops training when
    :func:`~hf_unlearn.methods.masc.loss.confirmation_statistic` of ``probe(model, "confirm", step)`` is
    ``<= alpha``; ``mode="heldout"``: when ``violations / positions`` of ``probe(model, "heldout", step)`` is. Its
    arguments are the ones :class:`~hf_unlearn.methods.masc.MASCConfig` checked.
    """

    def __init__(
        self, mode: str = "train", check_every: int = 2, trigger: float = 0.475,
        stop_tolerance: float = 0.475, delta: float = 0.05, rule: dict[str, Any] | None = None,
        confirm_rule: str = "mean", calibrate: bool = False, given: tuple[str, ...] = (),
    ) -> None:
        self.mode = mode
        self.check_every = int(check_every)
        self.trigger = float(trigger)
        self.stop_tolerance = float(stop_tolerance)
        self.delta = float(delta)
        self.confirm_rule = confirm_rule
        self.calibrate = bool(calibrate)
        self.given = tuple(given)
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

    def state(self) -> dict:
        return {
            "args": {
                "mode": self.mode, "check_every": self.check_every, "trigger": self.trigger, "stop_tolerance": self.stop_tolerance,
                "delta": self.delta, "rule": self.rule, "confirm_rule": self.confirm_rule,
                "calibrate": self.calibrate, "given": list(self.given),
            },
            "attributes": {k: getattr(self, k) for k in _SAVED_ATTRIBUTES}
            | {"violation_history": [dict(h) for h in self.violation_history]},
        }

    def load_state(self, state: dict) -> None:
        """Restore the attributes of a :meth:`state` dict, a calibrated trigger and ``alpha`` included."""
        for key, value in state.get("attributes", {}).items():
            setattr(self, key, value)
        if self.calibration:
            self.trigger = float(self.calibration.get("trigger", self.calibration["threshold"]))
            self.stop_tolerance = float(self.calibration.get("stop_tolerance", self.calibration["threshold"]))

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
        """Set ``trigger`` and ``alpha`` to the mean violation rate ``r_0`` of the never-seen rows under
        ``model``; a threshold named in ``given`` is kept when ``>= r_0`` and refused below it (an overshoot by
        construction). Returns the record."""
        rates = [float(r) for r in self._probe(model, "calibrate", 0)]
        rate = sum(rates) / len(rates)
        threshold = min(max(rate, 1e-6), 1.0 - 1e-6)
        configured = {"stop_trigger": self.trigger, "stop_tolerance": self.stop_tolerance}
        for name, value in configured.items():
            if name in self.given and value < threshold:
                raise ValueError(
                    f"MASC's {name}={value:.4g} lies below the never-seen state: the starting model's violation rate "
                    f"on the {len(rates)} holdout rows is {rate:.4g}, and a stop below it overshoots; give "
                    f"{name} >= {rate:.4g} or leave it unset to calibrate it."
                )
        self.calibration = {
            "examples": len(rates), "violation_rate": rate, "threshold": threshold,
            "configured_trigger": self.trigger, "configured_stop_tolerance": self.stop_tolerance,
        }
        if "stop_trigger" not in self.given:
            self.trigger = threshold
        if "stop_tolerance" not in self.given:
            self.stop_tolerance = threshold
        self.calibration.update(trigger=self.trigger, stop_tolerance=self.stop_tolerance)
        logger.info("MASC calibrated its stop on %d never-seen rows: violation rate %.4f (trigger %.4f, alpha %.4f).",
                    len(rates), rate, self.trigger, self.stop_tolerance)
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
            stop = entry["violation_rate"] <= self.stop_tolerance
        elif entry["triggered"]:
            self.num_confirmations += 1
            rates = [float(r) for r in self._probe(model, "confirm", step)]
            statistic, mean, delta_j = confirmation_statistic(rates, self.confirm_rule, self.delta, self.num_confirmations)
            stop = statistic <= self.stop_tolerance
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

    def summary(self) -> dict[str, Any]:
        """The rule, its history and the outcome, as saved in ``masc_stopping.json``."""
        stage_two = ("Hoeffding bound mean + sqrt(log(1/delta_j)/(2n)), delta_j = 6 delta/(pi^2 (j+1)^2), on the"
                     if self.confirm_rule == "hoeffding" else "the mean per-example violation rate of the")
        description = (
            "stop at the first check where the held-out violation rate |{t: m_t > tau}| / |T| <= alpha"
            if self.mode == "heldout" else "two-stage: mean per-example violation rate of the first training "
            f"batches <= trigger, then {stage_two} confirmation examples <= alpha"
        )
        tau = self.rule.get("tau")
        return {
            "rule": {
                "description": description,
                "margin": "m_t = beta * z(y_t|c_t) - logsumexp_{v in top-k \\ {y_t}} beta * z(v|c_t)",
                "mode": self.mode, "check_every": self.check_every, "trigger": self.trigger, "stop_tolerance": self.stop_tolerance,
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


def split_validation(forget: Dataset, fraction: float, seed: int) -> tuple[Dataset, Dataset]:
    """``(training part, held-out slice)`` of the forget set: ``max(1, round(fraction * n))`` examples drawn with
    ``seed`` held out, at least one left to train on."""
    n = len(forget)
    if n < 2:
        raise ValueError(
            f"The forget set has {n} example(s): MASC's held-out rule holds out part of it to decide when to stop "
            "and trains on the rest, so it needs at least 2 (or use stop_probe='train')."
        )
    held = min(n - 1, max(1, round(fraction * n)))
    order = torch.randperm(n, generator=torch.Generator().manual_seed(int(seed))).tolist()
    return forget.select(sorted(order[held:])), forget.select(sorted(order[:held]))
