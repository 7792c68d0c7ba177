"""RMU (Representation Misdirection for Unlearning). The control vector is drawn once from ``seed``, saved in
every checkpoint and reloaded on resume."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, ClassVar

import torch
from safetensors.torch import load_file, save_file

from ..base.losses import LossDenominators
from ..base.pairing import RETAIN_PREFIX
from ..base.trainer import UnlearningTrainer
from .config import RMUConfig
from .loss import activation_mse, rmu_control_vector, rmu_loss

CONTROL_VECTOR_NAME = "rmu_control_vector.safetensors"
_PEFT_PREFIX = "base_model.model."


def _matches(pattern: str, name: str) -> bool:
    return bool(re.fullmatch(pattern, name) or (name.startswith(_PEFT_PREFIX)
                                                and re.fullmatch(pattern, name[len(_PEFT_PREFIX):])))


class RMUTrainer(UnlearningTrainer):
    """RMU (Li et al. 2024, WMDP): ``forget_weight * MSE(h_l(forget), c * u) + retain_weight * MSE(h_l(retain),
    h0_l(retain))`` at decoder layer ``l = layer`` (:func:`~hf_unlearn.methods.rmu.loss.rmu_loss`), training only
    the parameters matching ``trainable_params``. :attr:`control_vector` is the ``[H]`` target.

    Private ``Trainer`` methods overridden, because no public hook does the job: ``_save_optimizer_and_scheduler``
    and ``_load_optimizer_and_scheduler`` (the control vector goes into each checkpoint and is read back)."""

    _name = "RMU"
    _method = "rmu"
    _title = "RMU (Representation Misdirection for Unlearning)"
    _paper: ClassVar[dict[str, str]] = {
        "title": "The WMDP Benchmark: Measuring and Reducing Malicious Use With Unlearning", "id": "2403.03218"}
    _cli_help = "steer forget hidden states at one layer to a random vector, keep retain ones"
    _tag_names = [*UnlearningTrainer._tag_names, "rmu"]
    config_class = RMUConfig

    def _finish_init(self) -> None:
        unwrapped = self.accelerator.unwrap_model(self.model)
        self._check_trainable(unwrapped, self.args)
        for name, param in unwrapped.named_parameters():
            if param.requires_grad and not _matches(self.args.trainable_params, name):
                param.requires_grad_(False)
        hidden = getattr(unwrapped.config.get_text_config(), "hidden_size", None)
        if not isinstance(hidden, int):
            hidden = unwrapped.get_input_embeddings().weight.shape[-1]
        generator = torch.Generator().manual_seed(int(self.args.seed))
        self.control_vector = rmu_control_vector(hidden, self.args.steering_coeff, generator)

    @classmethod
    def _resolve_args(cls, args: Any, model: Any) -> RMUConfig:
        """The base checks, then ``layer`` and (for a loaded model) ``trainable_params`` against the model."""
        args = super()._resolve_args(args, model)
        if isinstance(model, (str, Path)):
            from transformers import AutoConfig

            args.check_layer(AutoConfig.from_pretrained(str(model), trust_remote_code=False))
        else:
            args.check_layer(getattr(model, "config", None))
            if isinstance(model, torch.nn.Module):
                cls._check_trainable(model, args)
        return args

    @staticmethod
    def _check_trainable(model: torch.nn.Module, args: RMUConfig) -> None:
        trainable = [n for n, p in model.named_parameters() if p.requires_grad]
        if not any(_matches(args.trainable_params, n) for n in trainable):
            shown = ", ".join(trainable[:4]) + (", ..." if len(trainable) > 4 else "")
            raise ValueError(
                f"RMU's trainable_params={args.trainable_params!r} matches none of the model's "
                f"{len(trainable)} trainable parameters ({shown or 'none'}); give a pattern of their names."
            )

    @classmethod
    def needs_retain(cls, args: RMUConfig) -> bool:
        return args.retain_weight > 0

    @classmethod
    def needs_reference_model(cls, args: RMUConfig) -> bool:
        return cls.needs_retain(args)

    def _hidden(self, scored: Any, what: str) -> torch.Tensor:
        states = scored.outputs.hidden_states
        layer = self.args.layer
        if states is None or layer + 1 >= len(states):
            raise ValueError(f"RMU's layer={layer} is not among the {len(states or ()) - 1} layers of the model's "
                             f"hidden states ({what}).")
        return states[layer + 1]

    def compute_unlearning_loss(
        self, model: Any, inputs: dict[str, Any], denominators: LossDenominators
    ) -> torch.Tensor:
        forget = self.score(model, inputs, output_hidden_states=True)
        h_forget = self._hidden(forget, "forget")
        if model.training and torch.is_grad_enabled() and not h_forget.requires_grad:
            raise RuntimeError(
                f"RMU's hidden state at layer {self.args.layer} carries no gradient: no trained parameter lies "
                f"below it (trainable_params={self.args.trainable_params!r}), or reentrant activation checkpointing "
                "dropped it (set activation_checkpointing=False or gradient_checkpointing_kwargs={'use_reentrant': "
                "False})."
            )
        self.log_metric("forget_nll", forget.mean_nll)
        retain_args: dict[str, Any] = {}
        if self.needs_retain(self.args) and RETAIN_PREFIX + "input_ids" in inputs:
            retain = self.score(model, inputs, RETAIN_PREFIX, output_hidden_states=True)
            ref = self.reference_scores(inputs, RETAIN_PREFIX, output_hidden_states=True)
            self.log_metric("retain_nll", retain.mean_nll)
            retain_args = dict(retain_activations=self._hidden(retain, "retain"),
                               ref_retain_activations=self._hidden(ref, "frozen model").detach(),
                               retain_mask=retain.mask)
        control = self.control_vector.to(h_forget.device)
        loss = rmu_loss(
            h_forget, control, forget.mask, **retain_args, forget_weight=self.args.forget_weight,
            retain_weight=self.args.retain_weight, num_forget_sequences=denominators.forget_sequences,
            num_retain_sequences=denominators.retain_sequences,
        )
        with torch.no_grad():
            self.log_metric("forget_activation_loss", activation_mse(h_forget, control, forget.mask))
            if retain_args:
                self.log_metric("retain_activation_loss", activation_mse(
                    retain_args["retain_activations"], retain_args["ref_retain_activations"], retain_args["retain_mask"]))
        return loss

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        super()._save_optimizer_and_scheduler(output_dir)
        if self.args.should_save:
            save_file({"control_vector": self.control_vector.contiguous()}, str(Path(output_dir) / CONTROL_VECTOR_NAME))

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        path = Path(checkpoint) / CONTROL_VECTOR_NAME
        if not path.is_file():
            raise FileNotFoundError(
                f"Checkpoint {checkpoint} has no RMU control vector ({CONTROL_VECTOR_NAME}); it was not written by "
                "RMUTrainer, so the run cannot be resumed exactly."
            )
        saved = load_file(str(path))["control_vector"]
        if saved.shape != self.control_vector.shape:
            raise ValueError(f"The control vector of {checkpoint} has shape {tuple(saved.shape)}, the model's hidden "
                             f"size needs {tuple(self.control_vector.shape)}.")
        self.control_vector = saved.float()
