"""The scalars an unlearning trainer logs beside the loss (``forget_nll``, ``retain_nll``, a method's own terms):
recorded per step on the accelerator's device, averaged over the steps since the last log and over processes.
"""

from __future__ import annotations

from collections import defaultdict

import torch

__all__ = ["MetricsMixin", "scalar_on_device"]


def scalar_on_device(value: torch.Tensor | float, device: torch.device | str) -> torch.Tensor:
    """A logged value as a 0-d float32 tensor on ``device`` (the accelerator's), detached.

    Python floats (a violation rate, a count) and tensors from the model both land on the same device, so
    ``torch.stack`` over one step's values never mixes a CPU tensor with CUDA ones, and no value forces a host
    sync when it is recorded."""
    if torch.is_tensor(value):
        return value.detach().float().reshape(()).to(device)
    return torch.tensor(float(value), dtype=torch.float32, device=device)


class MetricsMixin:
    """The metric logging of :class:`~hf_unlearn.methods.base.trainer.UnlearningTrainer` (a ``Trainer``).

    A logged value is ``mean_processes(mean_steps(value))``: each process averages the values recorded since the
    last log, and the per-process means are gathered and averaged."""

    def _init_metrics(self) -> None:
        self._unlearning_metrics: dict[str, dict[str, list[torch.Tensor]]] = {
            "train": defaultdict(list), "eval": defaultdict(list)
        }

    def log_metric(self, name: str, value: torch.Tensor | float) -> None:
        """Record a scalar for this step; it is averaged over steps and processes and logged with the loss.

        A ``"retain_nll"`` recorded during a training step also feeds the divergence guard."""
        mode = "train" if self.model.training else "eval"
        value = scalar_on_device(value, self.accelerator.device)
        self._unlearning_metrics[mode][name].append(value)
        if name == "retain_nll" and self._in_training_step:
            self._retain_nll_seen = True
            self.divergence_guard.observe(value)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "train" if self.model.training else "eval"
        metrics = self._unlearning_metrics[mode]
        if metrics:
            names = sorted(metrics)
            local = torch.stack([torch.stack(metrics[n]).mean() for n in names]).to(self.accelerator.device)
            means = self.accelerator.gather(local).reshape(-1, len(names)).mean(0).tolist()
            prefix = "eval_" if mode == "eval" else ""
            logs.update({prefix + n: round(v, 6) for n, v in zip(names, means)})
            metrics.clear()
        super().log(logs, start_time)
