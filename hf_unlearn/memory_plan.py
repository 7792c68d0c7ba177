"""The memory a run needs on one device, estimated before any work from the model's config (no weights loaded):
:func:`plan_memory` adds up the peak from the model's shape, what the method needs, dtype, LoRA, batch and
sequence length; :func:`check_plan_fits` refuses in one line a plan that does not fit, naming options that would.
The estimate is for one process holding the whole model; the activation constants approximate transformers'
Llama-family decoder layers."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .model_shape import ModelShape, lora_parameter_count, parameter_count

__all__ = [
    "ADAM_STATES", "MethodNeeds", "MemoryPlan", "ModelShape", "Settings", "activation_bytes", "check_plan_fits",
    "check_run_memory", "device_capacity", "dtype_bytes", "sharded_launch", "fitting_options", "format_gib", "lora_parameter_count", "method_needs",
    "parameter_count", "plan_memory", "run_settings",
]

GIB = 2**30
#: AdamW keeps two moments per trainable parameter, in the parameter's dtype.
ADAM_STATES = 2
#: Bytes a decoder layer keeps per token for the backward pass, in units of the activation dtype: about
#: ``LAYER_H`` hidden-width tensors (norm inputs and outputs, q/k/v, attention output, residuals) and
#: ``LAYER_M`` MLP-width tensors (gate, up, activation, product).
LAYER_H, LAYER_M = 12, 4
#: Vocabulary-width tensors per token in the loss: the logits (activation dtype) and the float32 log-softmax and
#: its gradient.
LOGIT_F32_COPIES = 2
def activation_bytes(shape: ModelShape, tokens: int, act_bytes: int, checkpointing: bool, backward: bool) -> int:
    """Peak activation bytes for ``tokens`` tokens in one pass. With a backward pass:
    ``L * tokens * (LAYER_H h + LAYER_M m) * b`` (with gradient checkpointing ``L * tokens * h * b`` plus one layer)
    plus the loss's ``tokens * V * (b + 4 * LOGIT_F32_COPIES)``; without one: one layer's tensors and
    ``tokens * V * (b + 4)``."""
    h, m, v = shape.hidden_size, shape.intermediate_size, shape.vocab_size
    one_layer = tokens * (LAYER_H * h + LAYER_M * m) * act_bytes
    if not backward:
        return one_layer + tokens * v * (act_bytes + 4)
    layers = shape.num_layers * tokens * h * act_bytes + one_layer if checkpointing else shape.num_layers * one_layer
    return layers + tokens * v * (act_bytes + 4 * LOGIT_F32_COPIES)


@dataclass(frozen=True)
class MethodNeeds:
    """What a method needs beyond the model: training, a frozen reference, a retain example paired with each
    forget example (twice the tokens), and the extra buffers its config declares (``{name: bytes}``)."""

    trains: bool = True
    reference: bool = False
    retain_pairing: bool = True
    extra: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Settings:
    """The run's settings the estimate reads (``lora_r=None``: full fine-tuning)."""

    weight_bytes: int = 4
    lora_r: int | None = None
    lora_targets: Any = None
    batch: int = 8
    seq_len: int = 512
    checkpointing: bool = False


@dataclass(frozen=True)
class MemoryPlan:
    """The estimated peak bytes, by part."""

    parts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def describe(self) -> str:
        """``"weights 15.0 GiB, gradients 15.0 GiB, ..."`` (non-zero parts)."""
        return ", ".join(f"{k} {format_gib(v)}" for k, v in self.parts.items() if v)


def plan_memory(shape: ModelShape, needs: MethodNeeds, settings: Settings) -> MemoryPlan:
    """The peak of one training step (one forward pass for a method that does not train):

    * weights ``P b_w``, plus a LoRA adapter ``P_lora * 4`` (float32);
    * gradients and AdamW's moments: ``T b_t (1 + ADAM_STATES)``, ``T, b_t = P, b_w`` (full) or ``P_lora, 4`` (LoRA);
    * a frozen reference ``P b_w`` when read and no adapter is trained (with LoRA it is the base, adapter disabled);
    * activations for ``batch * seq_len`` tokens (twice with the retain pairing), and the method's extras."""
    params = parameter_count(shape)
    lora = lora_parameter_count(shape, settings.lora_r, settings.lora_targets) if settings.lora_r else 0
    trainable, trainable_bytes = (lora, 4) if settings.lora_r else (params, settings.weight_bytes)
    trains = needs.trains
    tokens = settings.batch * settings.seq_len * (2 if needs.retain_pairing and trains else 1)
    parts = {
        "weights": params * settings.weight_bytes + lora * 4,
        "gradients": trainable * trainable_bytes if trains else 0,
        "optimizer": ADAM_STATES * trainable * trainable_bytes if trains else 0,
        "reference": params * settings.weight_bytes if needs.reference and not settings.lora_r else 0,
        "activations": activation_bytes(shape, tokens, settings.weight_bytes, settings.checkpointing, trains),
    }
    parts.update({name: int(value) for name, value in needs.extra.items()})
    return MemoryPlan(parts)


#: What :func:`fitting_options` may propose, as ``(option text, settings change)``.
_REMEDIES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("--gradient_checkpointing True", {"checkpointing": True}), ("--use_peft", {"lora_r": 16}),
    ("--dtype bfloat16", {"weight_bytes": 2}), ("--per_device_train_batch_size 1", {"batch": 1}),
)


def fitting_options(shape: ModelShape, needs: MethodNeeds, settings: Settings, capacity: int) -> list[str] | None:
    """The fewest of :data:`_REMEDIES` under which the plan fits ``capacity``, as option texts; ``[]`` when
    it fits, ``None`` when nothing fits. Options that change nothing are not proposed."""
    remedies = [(text, change) for text, change in _REMEDIES
                if any(getattr(settings, k) != v for k, v in change.items())
                and (needs.trains or "lora_r" not in change)
                and not ("lora_r" in change and settings.lora_r)
                and not ("weight_bytes" in change and settings.weight_bytes <= 2)]
    for size in range(len(remedies) + 1):
        for combo in itertools.combinations(remedies, size):
            changed = dataclasses.replace(settings, **{k: v for _, c in combo for k, v in c.items()})
            if plan_memory(shape, needs, changed).total <= capacity:
                return [text for text, _ in combo]
    return None


def format_gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def check_plan_fits(shape: ModelShape, needs: MethodNeeds, settings: Settings, capacity: int, method: str,
                    device: str) -> MemoryPlan:
    """The plan, or a one-line :class:`~hf_unlearn.options.UserError` with the estimate by part and the
    options that would make it fit."""
    from .options import UserError

    plan = plan_memory(shape, needs, settings)
    if plan.total <= capacity:
        return plan
    fix = fitting_options(shape, needs, settings, capacity)
    hint = ("; it fits with " + " ".join(fix)) if fix else "; no single-device setting fits: shard it (FSDP)"
    raise UserError(f"{method} needs about {format_gib(plan.total)} on {device}, which holds "
                    f"{format_gib(capacity)} ({plan.describe()}){hint}.")


def method_needs(method: str, config: Any, shape: ModelShape, weight_bytes: int) -> MethodNeeds:
    """What ``method`` needs with ``config``: a trainer trains, its class says whether it reads a reference and
    the retain set; the config may declare ``extra_memory_bytes(shape, weight_bytes)``."""
    from .registry import get_method

    info = get_method(method)
    declared = getattr(config, "extra_memory_bytes", None)
    extra = dict(declared(shape, weight_bytes)) if callable(declared) else {}
    if not info.is_trainer:
        return MethodNeeds(trains=False, reference=False, retain_pairing=False, extra=extra)
    return MethodNeeds(trains=True, reference=bool(info.trainer_cls.needs_reference_model(config)),
                       retain_pairing=bool(info.trainer_cls.needs_retain(config)), extra=extra)


def run_settings(config: Any, model_options: Any, weight_bytes: int, seq_len: int) -> Settings:
    """The :class:`Settings` of a run: LoRA from the method's config or the model options, the batch and
    gradient checkpointing from the config."""
    source = config if hasattr(config, "use_peft") else model_options
    use_peft = bool(getattr(source, "use_peft", False))
    return Settings(weight_bytes=weight_bytes, lora_r=getattr(source, "lora_r", 16) if use_peft else None,
                    lora_targets=getattr(source, "lora_target_modules", None) if use_peft else None,
                    batch=int(getattr(config, "per_device_train_batch_size", 1) or 1), seq_len=seq_len,
                    checkpointing=bool(getattr(config, "gradient_checkpointing", False)))


def device_capacity(device: str | None) -> int | None:
    """The memory of a CUDA ``device`` in bytes; ``None`` for any other device."""
    if not device or not str(device).startswith("cuda"):
        return None
    import torch

    return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)


def check_run_memory(method: str, config: Any, model_config: Any, model_options: Any, device: str | None,
                     seq_len: int, weight_bytes: int = 4, capacity: int | None = None) -> MemoryPlan | None:
    """Refuse before any work a run whose plan exceeds the device's memory; ``None`` when there is nothing
    to check against."""
    capacity = device_capacity(device) if capacity is None else capacity
    if capacity is None:
        return None
    shape = ModelShape.from_config(model_config)
    return check_plan_fits(shape, method_needs(method, config, shape, weight_bytes),
                           run_settings(config, model_options, weight_bytes, seq_len), capacity, method, str(device))


def dtype_bytes(dtype: str | None, model_config: Any = None) -> int:
    """Bytes per weight of ``--dtype`` (``"auto"``/``None``: the config's ``dtype``, float32 when none)."""
    if dtype in (None, "auto"):
        dtype = str(getattr(model_config, "dtype", None) or getattr(model_config, "torch_dtype", None) or "float32")
    return 2 if str(dtype).replace("torch.", "") in ("bfloat16", "float16") else 4


def sharded_launch() -> bool:
    """Whether accelerate launched this process with FSDP or DeepSpeed."""
    import os

    return any(os.environ.get(k, "").lower() in ("1", "true") for k in ("ACCELERATE_USE_FSDP", "ACCELERATE_USE_DEEPSPEED"))
