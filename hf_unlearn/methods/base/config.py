"""Configuration of the unlearning trainers: :class:`BaseUnlearningConfig` (a ``trl.SFTConfig``, what every
method uses) and :class:`UnlearningConfig`, the baselines' objective."""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from trl import SFTConfig

FORGET_LOSSES = ("grad_ascent", "npo", "simnpo")
RETAIN_LOSSES = ("none", "nll", "kl")

#: Ranges of the numeric fields inherited from ``TrainingArguments``: ``{field: rule}`` or ``{field: (rule, why)}``,
#: a rule being ``"> 0"``, ``">= 0"`` or an interval such as ``"[0, 1)"``; a method's config adds its own in a
#: class attribute ``numeric_ranges`` (or a field's ``metadata["range"]``).
TRAINING_RANGES: dict[str, str | tuple[str, str]] = {
    "weight_decay": (">= 0", "a negative decay pushes every weight away from zero"),
    "adam_beta1": ("[0, 1)", "AdamW's moment decay rates are fractions below 1"),
    "adam_beta2": ("[0, 1)", "AdamW's moment decay rates are fractions below 1"),
    "adam_epsilon": ("> 0", "it keeps AdamW's update finite where a second moment is zero"),
    "max_grad_norm": (">= 0", "0 turns clipping off; a negative norm would turn it off unannounced"),
    "label_smoothing_factor": "[0, 1)", "warmup_steps": ">= 0", "logging_steps": "> 0",
    "save_steps": ("> 0", "a checkpoint every 0 steps is none at all"), "eval_steps": "> 0",
    "eval_delay": ">= 0", "neftune_noise_alpha": ">= 0",
    "seed": ("[0, 4294967295]", "NumPy and torch take seeds between 0 and 2**32 - 1"),
    "data_seed": ("[0, 4294967295]", "NumPy and torch take seeds between 0 and 2**32 - 1"),
}


def _parse_range(rule: str) -> tuple[float, float, bool, bool]:
    """``(low, high, low_open, high_open)`` of ``"> a"``, ``">= a"``, ``"< b"``, ``"<= b"`` or an interval
    ``"[a, b)"`` (brackets closed, parentheses open; ``inf`` allowed)."""
    rule = rule.strip()
    for op in (">=", "<=", ">", "<"):
        if rule.startswith(op):
            v = float(rule[len(op):])
            return (v, math.inf, op == ">", True) if op[0] == ">" else (-math.inf, v, True, op == "<")
    low, high = rule[1:-1].split(",")
    return float(low), float(high), rule[0] == "(", rule[-1] == ")"


def in_range(value: float, rule: str) -> bool:
    """Whether ``value`` satisfies ``rule`` (see :data:`TRAINING_RANGES`); NaN satisfies none."""
    low, high, low_open, high_open = _parse_range(rule)
    above = value > low if low_open else value >= low
    below = value < high if high_open else value <= high
    return bool(above and below)


def check_numeric_fields(config: Any, ranges: Mapping[str, str | tuple[str, str]] | None = None) -> None:
    """Refuse (``ValueError``) every init field of ``config`` holding a non-finite float or a number outside its
    range (``metadata["range"]``, else ``ranges[name]``), or, unless an ``SFTConfig`` field, a value outside its
    ``metadata["choices"]``; ``None`` passes, a ranged non-number is refused."""
    ranges = ranges or {}
    sft = {f.name for f in dataclasses.fields(SFTConfig)}
    for f in dataclasses.fields(config):
        if not f.init or f.name.startswith("_"):
            continue
        value = getattr(config, f.name, None)
        if f.metadata.get("choices") and f.name not in sft and value not in f.metadata["choices"]:
            raise ValueError(f"`{f.name}` must be one of {f.metadata['choices']}, got {value!r}.")
        spec = f.metadata.get("range") or ranges.get(f.name)
        rule, why = (spec, "") if isinstance(spec, str) or spec is None else spec
        why = f" ({why})" if why else ""
        if value is None or (rule is None and not isinstance(value, float)):
            continue
        shown = f"in {rule}" if rule and rule[0] in "[(" else rule
        if isinstance(value, float) and not math.isfinite(value):
            must = f"a finite number {shown}" if rule else "a finite number"
            raise ValueError(f"{f.name}={value} is not a usable value: {f.name} must be {must}{why}.")
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"{f.name} must be a number {shown}, got {value!r}.")
        if rule is not None and not in_range(value, rule):
            raise ValueError(f"{f.name}={value!r} is out of range: {f.name} must be {shown}{why}.")


def refuse_no_forget_term(forget_weight: float, retain_weight: float) -> None:
    """Refuse (``ValueError``) ``forget_weight == 0``: the objective then has no forget term."""
    if forget_weight == 0:
        what = ("the objective is zero: there is nothing to optimise" if retain_weight == 0 else
                "the objective has no forget term: the run would only fine-tune on the retain rows")
        raise ValueError(f"forget_weight=0 cannot unlearn ({what}); set forget_weight > 0.")


def _bf16_available() -> bool:
    return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())


def _accelerator_present() -> bool:
    """A CUDA, XPU or MPS device is visible (transformers then trains there, not on the CPU)."""
    xpu = getattr(torch, "xpu", None)
    mps = getattr(torch.backends, "mps", None)
    return bool(torch.cuda.is_available() or (xpu is not None and xpu.is_available())
                or (mps is not None and mps.is_available()))


@dataclass
class BaseUnlearningConfig(SFTConfig):
    r"""Configuration shared by every unlearning trainer ([`UnlearningTrainer`] and its subclasses). Everything in
    [`~trl.SFTConfig`] applies; the parameters below are the ones unlearning adds.

    Parameters:
        > Parameters that control the data

        allow_overlap (`bool`, *optional*, defaults to `False`):
            Forget and retain sets sharing examples is a warning instead of an error.
        prompt_template (`str` or `None`, *optional*, defaults to `None`):
            Prompt template preset of [`hf_unlearn.data.PROMPT_TEMPLATES`] for TOFU rows; `None`: the tokenizer's
            chat template when it has one, else `"Question: {question}\nAnswer:"`.

        > Parameters that control the safety of outputs

        overwrite (`bool`, *optional*, defaults to `False`):
            A non-empty `output_dir` is refused before any work unless `True`; one overlapping the model folder
            always is.

        > Parameters that stop a broken run

        max_retain_loss_ratio (`float` or `None`, *optional*, defaults to `100.0`):
            Divergence guard: training stops when the retain NLL of a step exceeds this multiple of its first-step
            value (floored at `min_retain_loss_reference`); `None` disables it.
        min_retain_loss_reference (`float`, *optional*, defaults to `0.1`):
            Floor (nats per token) of the starting retain NLL.

    Refused when built (a `ValueError`): a learning rate not a finite number `> 0`; settings that train zero steps
    or never end; a batch size or accumulation count below `1`; a `max_length` below `2`; a NaN or infinite float;
    a numeric field outside its range ([`TRAINING_RANGES`], a method's `numeric_ranges`); a value outside a field's
    `choices`; `trust_remote_code=True`.

    Defaults that differ from [`~trl.SFTConfig`]: `learning_rate=1e-5`, `num_train_epochs=10` (TOFU's),
    `weight_decay=0.01`, `bf16` only on a bf16-capable GPU; `use_cpu` is set on a machine with no CUDA, XPU or
    MPS device, so that the processes of a launch form one distributed run there.
    """

    # Parameters whose default values are overridden from SFTConfig
    learning_rate: float = field(default=1e-5, metadata={"help": "The initial learning rate for AdamW."})
    num_train_epochs: float = field(default=10.0, metadata={"help": "Total number of training epochs to perform."})
    weight_decay: float = field(default=0.01, metadata={"help": "Weight decay for AdamW."})
    # None by default so that only a user passing the deprecated alias gets transformers' warning
    activation_checkpointing: bool | None = field(
        default=None,
        metadata={"help": "Recompute activations in the backward pass to save memory. Default: True (TRL's)."},
    )
    gradient_checkpointing: bool | None = field(
        default=None, metadata={"help": "Deprecated alias of `activation_checkpointing` (transformers v5)."}
    )
    bf16: bool | None = field(
        default=None,
        metadata={"help": "Whether to use bf16 mixed precision. Defaults to True only on a bf16-capable GPU."},
    )

    # Parameters that control the data
    allow_overlap: bool = field(
        default=False,
        metadata={"help": "Allow forget and retain sets to share examples (warn instead of raising)."},
    )
    prompt_template: str | None = field(
        default=None,
        metadata={
            "help": "Prompt template preset for TOFU rows (see hf_unlearn.data.PROMPT_TEMPLATES); default: the "
            "tokenizer's chat template if any, else 'Question: {question}\\nAnswer:'."
        },
    )

    # Parameters that control the safety of outputs
    overwrite: bool = field(
        default=False,
        metadata={"help": "Replace a non-empty output_dir (the new result is swapped in only when complete)."},
    )

    # Parameters that stop a broken run
    max_retain_loss_ratio: float | None = field(
        default=100.0,
        metadata={"help": "Stop when the retain NLL exceeds this multiple of its first-step value (None: off)."},
    )
    min_retain_loss_reference: float = field(
        default=0.1,
        metadata={"help": "Floor of the first-step retain NLL used by the divergence guard (nats per token)."},
    )

    numeric_ranges = {"max_retain_loss_ratio": ("> 1", "None disables the guard"), "min_retain_loss_reference": "> 0"}

    def __post_init__(self):
        lr = self.learning_rate
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or not lr > 0:
            raise ValueError(
                f"learning_rate={lr} would leave the model unchanged or break it; it must be a finite number > 0."
            )
        steps, epochs = self.max_steps, self.num_train_epochs
        if steps == 0 or steps < -1:
            raise ValueError(
                f"max_steps={steps} would train for zero steps; set max_steps > 0, or -1 to train for num_train_epochs."
            )
        if not math.isfinite(epochs) or epochs < 0 or (steps < 0 and not epochs > 0):
            raise ValueError(
                f"num_train_epochs={epochs} with max_steps={steps} would train for zero steps or never end; set "
                "num_train_epochs to a finite number > 0, or max_steps > 0."
            )
        for name in ("per_device_train_batch_size", "gradient_accumulation_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")
        if self.max_length is not None and (isinstance(self.max_length, bool) or self.max_length < 2):
            raise ValueError(
                f"max_length={self.max_length} leaves no room for a prompt token and an answer token; use None or "
                "an integer >= 2 (the model's maximum positions always apply as well)."
            )
        kwargs = self.model_init_kwargs
        if isinstance(kwargs, str):  # the command line passes the dict as JSON
            import json

            try:
                kwargs = json.loads(kwargs)
            except ValueError:
                kwargs = {}
        kwargs = kwargs if isinstance(kwargs, Mapping) else {}
        if self.trust_remote_code or kwargs.get("trust_remote_code"):
            raise ValueError(
                "trust_remote_code=True is refused: hf-unlearn loads safetensors weights into the architectures "
                "transformers ships and never runs code that comes with a model."
            )
        ranges: dict[str, str | tuple[str, str]] = dict(TRAINING_RANGES)  # each class's numeric_ranges, MRO order
        for klass in reversed(type(self).__mro__):
            ranges.update(vars(klass).get("numeric_ranges", {}))
        check_numeric_fields(self, ranges)
        if self.activation_checkpointing is None and self.gradient_checkpointing is None:
            self.activation_checkpointing = True
        if self.bf16 is None:
            self.bf16 = (not self.fp16) and _bf16_available()
        if not self.use_cpu and not _accelerator_present():
            self.use_cpu = True  # the CPU is the only device: one distributed run under a launch, CPU bf16 autocast
        if self.prompt_template is not None:
            from ...data.prompts import get_template

            get_template(self.prompt_template)  # an unknown preset fails here, before any work
        super().__post_init__()

@dataclass
class UnlearningConfig(BaseUnlearningConfig):
    r"""Configuration of the baseline objective of [`BaselineTrainer`]:
    `loss = forget_weight * forget_term + retain_weight * retain_term` (open-unlearning's `gamma` and `alpha`).

    GradAscent, GradDiff (the defaults below), NPO and SimNPO are presets of it.

    Parameters:
        forget_loss (`str`, *optional*, defaults to `"grad_ascent"`):
            Forget term: `"grad_ascent"` (minus the forget NLL), `"npo"` (against the frozen initial model) or
            `"simnpo"` (reference-free, length-normalised).
        retain_loss (`str`, *optional*, defaults to `"nll"`):
            Retain term: `"none"`, `"nll"` (the retain answers' NLL) or `"kl"` (per-token `KL(pi_ref || pi_theta)`).
        beta (`float`, defaults to `0.1`): Inverse temperature of NPO and SimNPO, `> 0`.
        delta (`float`, *optional*, defaults to `0.0`):
            SimNPO reward margin (the paper's `gamma`), outside `beta`:
            `-(2/beta) * logsigmoid(-beta * log p(y|x) / |y| - delta)`.
        forget_weight (`float`, defaults to `1.0`): Weight of the forget term, `> 0`.
        retain_weight (`float`, *optional*, defaults to `1.0`):
            Weight of the retain term, `>= 0` (`0`: no retain set needed).
    """

    forget_loss: str = field(
        default="grad_ascent",
        metadata={"help": "Forget term: 'grad_ascent', 'npo' or 'simnpo'.", "choices": list(FORGET_LOSSES)},
    )
    retain_loss: str = field(
        default="nll",
        metadata={
            "help": "Retain term: 'none', 'nll' or 'kl' (KL(pi_ref || pi_theta) per token).",
            "choices": list(RETAIN_LOSSES),
        },
    )
    beta: float = field(default=0.1, metadata={"help": "Inverse temperature of NPO/SimNPO (> 0)."})
    delta: float = field(default=0.0, metadata={"help": "SimNPO reward margin (outside beta)."})
    forget_weight: float = field(default=1.0, metadata={"help": "Weight of the forget term (> 0)."})
    retain_weight: float = field(default=1.0, metadata={"help": "Weight of the retain term (>= 0)."})

    numeric_ranges = {"beta": "> 0", "forget_weight": ">= 0", "retain_weight": ">= 0"}

    def __post_init__(self):
        refuse_no_forget_term(self.forget_weight, self.retain_weight)
        super().__post_init__()

    @property
    def objective_name(self) -> str:
        """The registered baseline this objective is: ``forget_loss``, or ``grad_diff`` for gradient ascent with
        a retain term."""
        if self.forget_loss == "grad_ascent" and self.retain_loss != "none":
            return "grad_diff"
        return self.forget_loss
