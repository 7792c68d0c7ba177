"""GROM configuration: every knob of the closed-form one-shot unlearning edit, validated up front."""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, field, fields
from typing import Any

OBJECTIVES = ("token_suppression", "representation_corruption")
SMOOTHING_MODES = ("fraction", "pseudo_count")

#: Fields that change how the fit runs, never the edit: not written into a saved adapter.
RUNTIME_FIELDS = ("batch_size", "max_stat_memory_gb", "progress")

#: Values of fields an older saved adapter lacks, where its edit was computed with other than today's default.
LEGACY_VALUES = {"specificity_smoothing_mode": "pseudo_count"}


@dataclass
class GROMConfig:
    r"""Configuration of :func:`hf_unlearn.methods.grom.fit_grom`. The edit of a linear module ``y = W x`` is
    ``W + P`` with

        P* = (w_f/s) D X_f^T A^{-1},
        A  = (w_r/r) X_r X_r^T + (w_g/g) X_g X_g^T + (w_f/s) X_f X_f^T + mu I,

    ``X_f`` the keys (module inputs) at the ``s`` forget answer positions, ``X_r`` the ``r`` retain keys, ``X_g``
    the keys of optional general rows and ``D`` the targets. :data:`RUNTIME_FIELDS` are not saved. Where the
    defaults come from: ``docs/methods/grom.md``.

    Parameters (each field's ``metadata["help"]`` has the full text):
        target_modules (`str | list[str]`, defaults to `"down_proj"`): linear modules to edit.
        layers (`str | list[int]`, defaults to `"auto"`): layer indices, or logit-lens attribution.
        candidate_layers (`list[int] | None`, defaults to `None`): layers `layers="auto"` may choose from.
        num_layers (`int | None`, defaults to `None`): width of the auto band.
        objective (`str`, defaults to `"token_suppression"`): or `"representation_corruption"`.
        forget_weight (`float`, defaults to `10.0`): `w_f`.
        retain_weight (`float`, defaults to `1.0`): `w_r`.
        generic_retain_weight (`float`, defaults to `1.0`): `w_g`.
        ridge (`float`, defaults to `1e-2`): `mu`.
        max_rank (`int | None`, defaults to `None`): LoRA rank cap of the export.
        suppression_margin (`float`, defaults to `30.0`): `kappa`.
        specificity_power (`float`, defaults to `1.0`): `gamma`.
        specificity_smoothing (`float`, defaults to `0.5`): `beta`.
        specificity_smoothing_mode (`str`, defaults to `"fraction"`): or `"pseudo_count"`.
        corruption_norm (`float`, defaults to `1.0`): `c`.
        untie_lm_head (`bool`, defaults to `False`): edit a separate copy of a tied LM head.
        retain_sample (`int | None`, defaults to `256`): retain rows read (`None`: all).
        seed (`int`, defaults to `0`): seed of the retain sample and of the corruption direction.
        max_length (`int | None`, defaults to `None`): extra truncation.
        prompt_template (`str | None`, defaults to `None`): prompt preset name.
        batch_size (`int`, defaults to `16`): runtime; examples per forward pass.
        max_stat_memory_gb (`float`, defaults to `4.0`): runtime; one pass or two with `layers="auto"`.
        progress (`bool`, defaults to `True`): runtime; progress bars.
    """

    target_modules: str | list[str] = field(
        default="down_proj", metadata={"help": "Linear modules to edit: residual writers ('down_proj') or 'lm_head'."}
    )
    layers: str | list[int] = field(default="auto", metadata={"help": "'auto' (logit-lens attribution) or indices."})
    candidate_layers: list[int] | None = field(
        default=None, metadata={"help": "Layers layers='auto' chooses from; None: the last ceil(L / 3)."}
    )
    num_layers: int | None = field(default=None, metadata={"help": "Width of the auto band; None: ceil(L / 10)."})
    objective: str = field(
        default="token_suppression", metadata={"help": "'token_suppression' or 'representation_corruption'."}
    )
    forget_weight: float = field(default=10.0, metadata={"help": "w_f > 0: forget fit weight, divided by s."})
    retain_weight: float = field(default=1.0, metadata={"help": "w_r >= 0: retain preservation weight, divided by r."})
    generic_retain_weight: float = field(default=1.0, metadata={"help": "w_g >= 0: general rows' weight, / g."})
    ridge: float = field(default=1e-2, metadata={"help": "mu >= 0: Tikhonov term (0 only for a non-singular A)."})
    max_rank: int | None = field(default=None, metadata={"help": "Largest LoRA rank of the export (truncated SVD)."})
    suppression_margin: float = field(default=30.0, metadata={"help": "kappa: nats the margins go below 0."})
    specificity_power: float = field(default=1.0, metadata={"help": "gamma: the power of alpha_j."})
    specificity_smoothing: float = field(default=0.5, metadata={"help": "beta >= 0: smoothing of p_f, p_r."})
    specificity_smoothing_mode: str = field(default="fraction", metadata={"help": "'fraction' or 'pseudo_count'."})
    corruption_norm: float = field(default=1.0, metadata={"help": "c: norm of D_t over the mean output norm."})
    untie_lm_head: bool = field(default=False, metadata={"help": "Allow a tied 'lm_head' (edit an untied copy)."})
    retain_sample: int | None = field(default=256, metadata={"help": "Retain rows read (seeded); None: every row."})
    seed: int = field(default=0, metadata={"help": "Seed of the retain sample and of the corruption direction."})
    max_length: int | None = field(default=None, metadata={"help": "Truncation of tokenized examples (answer cut)."})
    prompt_template: str | None = field(
        default=None, metadata={"help": "Prompt preset of hf_unlearn.data.prompts (None: chat template, else plain)."}
    )
    batch_size: int = field(default=16, metadata={"help": "Runtime: examples per forward pass (not saved)."})
    max_stat_memory_gb: float = field(
        default=4.0, metadata={"help": "Runtime: GiB of statistics layers='auto' may collect in one pass (else two)."}
    )
    progress: bool = field(default=True, metadata={"help": "Runtime: show tqdm progress bars."})

    def __post_init__(self) -> None:
        if isinstance(self.target_modules, str):
            self.target_modules = [self.target_modules]
        self.target_modules = list(self.target_modules)
        if not self.target_modules or not all(isinstance(t, str) and t for t in self.target_modules):
            raise ValueError(f"target_modules must be a non-empty name or list of names, got {self.target_modules!r}")
        if isinstance(self.layers, str):
            if self.layers != "auto":
                raise ValueError(f"layers must be 'auto' or a list of layer indices, got {self.layers!r}")
        else:
            self.layers = _index_list("layers", self.layers)
        if self.candidate_layers is not None:
            if self.layers != "auto":
                raise ValueError(f"candidate_layers only applies to layers='auto', not layers={self.layers}.")
            self.candidate_layers = _index_list("candidate_layers", self.candidate_layers)
        for name, low, optional in (("num_layers", 1, True), ("max_rank", 1, True), ("retain_sample", 1, True),
                                    ("max_length", 2, True), ("batch_size", 1, False), ("seed", None, False)):
            value = getattr(self, name)
            if not (value is None and optional) and not (_is_int(value) and (low is None or value >= low)):
                bound = "an integer" if low is None else f"an integer >= {low}"
                raise ValueError(f"{name} must be {'None or ' if optional else ''}{bound}, got {value!r}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        _check_real("forget_weight", self.forget_weight, "w_f, a finite number > 0", strict=True)
        _check_real("retain_weight", self.retain_weight, "w_r, a finite number >= 0")
        _check_real("generic_retain_weight", self.generic_retain_weight, "w_g, a finite number >= 0")
        _check_real("ridge", self.ridge, "mu, a finite number >= 0 (a negative ridge can make A indefinite)")
        _check_real("suppression_margin", self.suppression_margin, "kappa, a finite number of nats >= 0")
        _check_real("specificity_power", self.specificity_power, "gamma, a finite number >= 0")
        _check_real("specificity_smoothing", self.specificity_smoothing, "beta, a finite number >= 0")
        _check_real("corruption_norm", self.corruption_norm, "c, a finite number > 0", strict=True)
        _check_real("max_stat_memory_gb", self.max_stat_memory_gb, "a finite number of GiB >= 0")
        if self.specificity_smoothing_mode not in SMOOTHING_MODES:
            raise ValueError(f"specificity_smoothing_mode must be one of {SMOOTHING_MODES}, got "
                             f"{self.specificity_smoothing_mode!r}")
        if not isinstance(self.untie_lm_head, bool):
            raise ValueError(f"untie_lm_head must be True or False, got {self.untie_lm_head!r}")
        if self.prompt_template is not None:
            if not isinstance(self.prompt_template, str):
                raise ValueError(f"prompt_template must be None or a name, got {type(self.prompt_template).__name__}")
            from ...data.prompts import get_template

            get_template(self.prompt_template)  # an unknown preset name is refused here, before any work

    def check_for(self, model: Any) -> None:
        """Refuse (ValueError), without running ``model``, target modules that are not residual writers or an LM
        head (tied only with ``untie_lm_head``), and ``layers`` / ``candidate_layers`` that hold none."""
        from .attribution import select_targets

        select_targets(model, self)

    def candidates(self, available: list[int]) -> list[int]:
        """``candidate_layers`` (each in ``available``), else the last ``ceil(len(available) / 3)``."""
        available = sorted(available)
        if self.candidate_layers is None:
            return available[len(available) - math.ceil(len(available) / 3):]
        missing = [i for i in self.candidate_layers if i not in available]
        if missing:
            raise ValueError(
                f"candidate_layers {missing} have no {self.target_modules} module; available layers: {available}"
            )
        return list(self.candidate_layers)

    def band_width(self, num_hidden_layers: int) -> int:
        """``num_layers``, or ``ceil(num_hidden_layers / 10)`` when it is None."""
        if self.num_layers is not None:
            return self.num_layers
        return max(1, math.ceil(num_hidden_layers / 10))

    def extra_memory_bytes(self, shape: Any, weight_bytes: int, num_forget_keys: int | None = None
                           ) -> dict[str, int]:
        """The buffers :func:`~hf_unlearn.methods.grom.fit_grom` holds besides the model
        (:mod:`hf_unlearn.memory_plan`): ``8 d^2`` per second moment and Cholesky factor, ``16 d^2`` for the widest
        module's ``A`` and its factor while it is solved; ``12 o d`` per module for ``P`` (float64, and its float32
        copy); ``4 s d + 8 s o`` of keys and targets per module."""
        widths = {**shape.linear_shapes(), "lm_head": (shape.hidden_size, shape.vocab_size)}
        names = {t.rsplit(".", 1)[-1] for t in self.target_modules} & set(widths)
        layered = [widths[n] for n in sorted(names - {"lm_head"})]
        heads = [widths["lm_head"]] if "lm_head" in names else []
        auto = self.layers == "auto"
        edited_layers = self.band_width(shape.num_layers) if auto else len(self.layers)
        candidates = (len(self.candidate_layers) if self.candidate_layers is not None
                      else math.ceil(shape.num_layers / 3))
        one_layer = sum(8 * i * i for i, _ in layered)
        stat_layers = candidates if auto and one_layer * candidates <= self.max_stat_memory_gb * 2**30 else edited_layers
        edited = layered * edited_layers + heads
        out = {
            "grom_second_moments": one_layer * stat_layers + sum(8 * i * i for i, _ in heads),
            "grom_cholesky_factors": sum(8 * i * i for i, _ in edited),
            "grom_normal_matrix": max((16 * i * i for i, _ in edited), default=0),
            "grom_deltas": sum(12 * i * o for i, o in edited),
        }
        if num_forget_keys is not None:
            out["grom_forget_keys"] = sum(num_forget_keys * (4 * i + 8 * o) for i, o in edited)
        return out

    def to_dict(self) -> dict[str, Any]:
        """Every field, runtime ones included."""
        return asdict(self)

    def saved_dict(self) -> dict[str, Any]:
        """The fields that determine the edit (what a saved adapter records)."""
        return {k: v for k, v in asdict(self).items() if k not in RUNTIME_FIELDS}

    @classmethod
    def from_saved(cls, values: dict[str, Any], **runtime: Any) -> GROMConfig:
        """A config from :meth:`saved_dict` output (unknown keys refused) and ``runtime`` overrides; a field an
        older save lacks takes its :data:`LEGACY_VALUES` entry, else its default."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"Saved GROM config has unknown fields {unknown}; written by a newer hf-unlearn?")
        kwargs = {k: v for k, v in values.items() if k not in RUNTIME_FIELDS}
        for name, value in LEGACY_VALUES.items():  # an older save computed its edit with these values
            kwargs.setdefault(name, value)
        kwargs.update(runtime)
        return cls(**kwargs)


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _index_list(name: str, values: Any) -> list[int]:
    """Sorted, de-duplicated non-negative layer indices, or a ValueError naming ``name``."""
    try:
        items = list(values)
    except TypeError:
        items = None
    if not items or not all(_is_int(i) and i >= 0 for i in items):
        raise ValueError(f"{name} must be 'auto' or a non-empty list of layer indices >= 0, got {values!r}"
                         if name == "layers" else
                         f"{name} must be None or a non-empty list of layer indices >= 0, got {values!r}")
    return sorted({int(i) for i in items})


def _check_real(name: str, value: Any, valid: str, strict: bool = False) -> None:
    """Refuse ``value`` unless it is a finite real ``>= 0`` (``> 0`` when ``strict``)."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > 0 if strict else value >= 0)
    if not ok:
        raise ValueError(f"GROMConfig.{name} must be {valid}; got {value!r}.")
