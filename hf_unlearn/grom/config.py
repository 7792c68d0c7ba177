"""GROM configuration: every knob of the closed-form one-shot unlearning edit, validated up front."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

OBJECTIVES = ("token_suppression", "representation_corruption")

#: Fields that only change how the fit runs (speed, memory, display), never the edit it computes: they are not
#: written into a saved adapter (PEFT keeps ``inference_mode`` and similar settings apart in the same way).
RUNTIME_FIELDS = ("batch_size", "max_stat_memory_gb", "progress")


@dataclass
class GROMConfig:
    r"""Configuration of :func:`hf_unlearn.grom.fit_grom`.

    The edit of a linear module ``y = W x`` is ``W + P`` with

        P* = (w_f/s) D X_f^T A^{-1},   A = (w_r/r) X_r X_r^T + (w_f/s) X_f X_f^T + mu I,

    the minimiser of ``(w_f/s)||P X_f - D||^2 + (w_r/r)||P X_r||^2 + mu ||P||^2`` where ``X_f`` (``d_in x s``)
    holds the module inputs (keys) at the ``s`` forget answer positions, ``X_r`` (``d_in x r``) those at the
    ``r`` retain answer positions and ``D`` (``d_out x s``) the desired output changes (targets).

    Defaults, and why (for TOFU-tiny, a 2-layer model, and for a 30-layer pretrained model such as
    SmolLM2-135M: hidden 576, MLP width 1536, vocabulary 49,152, tied embeddings):

    * ``target_modules="down_proj"``: the MLP down-projections write into the residual stream and exist in
      every Llama/Qwen/Mistral block. The LM head is the stronger and more specific target on TOFU-tiny, but
      models with tied embeddings (SmolLM2, most small pretrained LMs) cannot edit it without also editing the
      input embeddings, so the default is the module every model has.
    * ``layers="auto"``, ``num_layers=None``: logit-lens attribution picks a contiguous band of
      ``ceil(L / 10)`` layers (1 of TOFU-tiny's 2, 3 of SmolLM2's 30). The targets are first-order through the
      final norm and unembedding (later blocks are ignored), so the larger the change asked of one module, the
      larger the first-order error; a band of about a tenth of the depth shares the drop (each of ``k`` edited
      modules takes ``1/k`` of it) while staying where the attribution says the forget answers are written.
    * ``suppression_margin=30``, ``forget_weight=10``, ``retain_weight=1``, ``ridge=1e-2`` (target strength):
      tuned on TOFU-tiny, where with ``target_modules="lm_head"`` they raise the forget answer NLL by about
      +2.5 nats/token while the retain NLL moves by about +0.14; a ``down_proj`` edit there is less specific
      (+0.5 / +0.03 at ``retain_weight=100, ridge=1e-3`` up to +2.1 / +1.6 at the defaults). They are kept for
      deep models because each is scale-free: ``kappa`` is in nats of the logit margin whatever the vocabulary,
      and ``w_f``, ``w_r`` weigh *mean* squared errors per key, independent of how many keys are read. Checked
      on SmolLM2-135M-Instruct (the untuned base, the first 20 rows of TOFU ``forget01``, 64 retain rows, CPU):
      the defaults chose layers 23-25 by attribution and raised the forget answer NLL from 1.76 to 8.69
      nats/token while 16 held-out retain rows moved from 2.51 to 2.74; ``A``'s diagonal averaged 3.7 there, so
      ``mu = 1e-2`` is a light regulariser (about 0.3% of it). Raise ``retain_weight`` (or lower
      ``suppression_margin``) for a gentler, more specific edit.
    * ``retain_sample=256`` rows for ``X_r X_r^T``: the default sample of TOFU ``retain90`` has 9,555 answer
      tokens (retain keys) with SmolLM2's tokenizer, over 6 times the 1536 input dimensions of its
      down-projection, so ``X_r X_r^T`` is well determined; reading all 3,600 rows would make GROM read 4,000
      rows instead of 656 for ``forget10``. TOFU-tiny's 180 synthetic retain rows are all read.

    Fields in :data:`RUNTIME_FIELDS` (``batch_size``, ``max_stat_memory_gb``, ``progress``) only change how the
    fit runs; :meth:`saved_dict` leaves them out of a saved adapter.

    Parameters (each field's ``metadata["help"]`` has the full text):
        target_modules (`str | list[str]`, defaults to `"down_proj"`): linear modules to edit (residual writers or
            an untied LM head).
        layers (`str | list[int]`, defaults to `"auto"`): layer indices, or logit-lens attribution.
        num_layers (`int | None`, defaults to `None`): width of the auto band; `None` = `ceil(L / 10)`.
        objective (`str`, defaults to `"token_suppression"`): or `"representation_corruption"`.
        forget_weight (`float`, defaults to `10.0`): `w_f`.
        retain_weight (`float`, defaults to `1.0`): `w_r`.
        ridge (`float`, defaults to `1e-2`): `mu`.
        max_rank (`int | None`, defaults to `None`): LoRA rank cap of the export (truncated SVD, error reported).
        suppression_margin (`float`, defaults to `30.0`): `kappa`, nats below the best competitors.
        specificity_power (`float`, defaults to `1.0`): `gamma`.
        specificity_smoothing (`float`, defaults to `0.5`): `beta`.
        corruption_norm (`float`, defaults to `1.0`): `c`, target norm over the mean output norm.
        retain_sample (`int | None`, defaults to `256`): retain rows read for `X_r X_r^T` (`None`: all).
        seed (`int`, defaults to `0`): seed of the retain sample and of the corruption direction.
        max_length (`int | None`, defaults to `None`): extra truncation (the model's positions always apply).
        prompt_template (`str | None`, defaults to `None`): prompt preset name of `hf_unlearn.data.prompts`.
        batch_size (`int`, defaults to `16`): runtime; examples per forward pass.
        max_stat_memory_gb (`float`, defaults to `4.0`): runtime; one pass or attribution + key passes.
        progress (`bool`, defaults to `True`): runtime; progress bars.
    """

    target_modules: str | list[str] = field(
        default="down_proj",
        metadata={"help": "Name (or list of names) of the linear modules to edit, matched as the last component(s) "
                  "of the module path: 'down_proj' (the MLP down-projection of Llama/Qwen/Mistral blocks), "
                  "'lm_head', or a full path such as 'model.layers.1.mlp.down_proj'. Edited modules must write to "
                  "the residual stream (d_out == hidden_size) or be an untied LM head, so that their targets can be "
                  "read through the final norm and unembedding."},
    )
    layers: str | list[int] = field(
        default="auto",
        metadata={"help": "'auto' (logit-lens attribution S_l = F_l - R_l, see hf_unlearn.grom.attribution) or an "
                  "explicit list of layer indices; applies to layered modules (the LM head is not layered and is "
                  "always edited when targeted)."},
    )
    num_layers: int | None = field(
        default=None,
        metadata={"help": "Width of the contiguous band of layers chosen by layers='auto'; None means "
                  "ceil(num_hidden_layers / 10) (1 layer of a 2-layer model, 3 of a 30-layer one)."},
    )
    objective: str = field(
        default="token_suppression",
        metadata={"help": "'token_suppression' (lower the logit margin of each forget answer token, weighted by "
                  "its specificity) or 'representation_corruption' (push the module output along a fixed random "
                  "direction, for multiple-choice style knowledge); see hf_unlearn.grom.targets."},
    )
    forget_weight: float = field(
        default=10.0,
        metadata={"help": "w_f > 0: weight of the forget fit term, divided by the number s of forget keys."},
    )
    retain_weight: float = field(
        default=1.0,
        metadata={"help": "w_r >= 0: weight of the retain preservation term, divided by the number r of retain keys."},
    )
    ridge: float = field(
        default=1e-2,
        metadata={"help": "mu >= 0: Tikhonov term. 0 is allowed only when A is non-singular (many more retain keys "
                  "than input dimensions); a singular A raises a ValueError suggesting a value."},
    )
    max_rank: int | None = field(
        default=None,
        metadata={"help": "None (exact export) or the largest LoRA rank of the PEFT adapter; an edit of higher rank "
                  "is truncated by SVD and the relative Frobenius error is reported (and written in the adapter "
                  "metadata)."},
    )
    suppression_margin: float = field(
        default=30.0,
        metadata={"help": "kappa: token suppression asks each forget token's logit margin "
                  "z_y - logsumexp_{v != y} z_v (read through the logit lens) to fall to -kappa: the requested drop "
                  "is alpha_y * max(0, margin + kappa) nats, shared evenly between the edited modules."},
    )
    specificity_power: float = field(
        default=1.0,
        metadata={"help": "gamma: the specificity of token j is alpha_j = clip(1 - p_r(j) / p_f(j), 0, 1)^gamma "
                  "with p_f, p_r its smoothed frequency among forget and retain answer tokens. 0 gives every token "
                  "seen in forget answers weight 1; larger values concentrate the edit on forget-specific tokens."},
    )
    specificity_smoothing: float = field(
        default=0.5,
        metadata={"help": "beta: additive pseudo-count in p_f(j) = (c_f(j) + beta) / (N_f + beta V) (same for p_r)."},
    )
    corruption_norm: float = field(
        default=1.0,
        metadata={"help": "Representation corruption: norm of the target D_t = alpha_y * c * u (u a fixed random "
                  "unit direction of the module's output space) as a multiple c of the mean norm of the module's "
                  "outputs on the forget keys."},
    )
    retain_sample: int | None = field(
        default=256,
        metadata={"help": "Number of retain rows (examples) read for the retain second moment X_r X_r^T (and the "
                  "retain side of the layer attribution): a uniform sample without replacement drawn with `seed`, "
                  "so the same seed reads the same rows. None, or a retain set no larger than this, reads every "
                  "retain row."},
    )
    seed: int = field(
        default=0,
        metadata={"help": "Seed of the retain row sample and of the random corruption direction."},
    )
    max_length: int | None = field(
        default=None,
        metadata={"help": "Optional truncation of tokenized examples (prompt kept, answer cut). Examples are always "
                  "cut to the model's maximum positions (max_position_embeddings / n_positions); a prompt that "
                  "alone reaches that limit is refused."},
    )
    prompt_template: str | None = field(
        default=None,
        metadata={"help": "Name of a prompt preset of hf_unlearn.data.prompts (PROMPT_TEMPLATES), passed as "
                  "template= when tokenizing questions and answers; None uses the tokenizer's chat template, or "
                  "the plain 'Question: ...\\nAnswer:' format without one. Use the template the evaluator uses."},
    )
    batch_size: int = field(
        default=16,
        metadata={"help": "Runtime: examples per forward pass when collecting keys (not saved with the adapter)."},
    )
    max_stat_memory_gb: float = field(
        default=4.0,
        metadata={"help": "Runtime: with layers='auto', statistics of every candidate layer are accumulated in the "
                  "same forward pass that scores the layers when they fit in this budget (one pass over the data); "
                  "otherwise an attribution pass is followed by a key pass over the selected layers only."},
    )
    progress: bool = field(
        default=True,
        metadata={"help": "Runtime: show tqdm progress bars."},
    )

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
            layers = list(self.layers)
            if not layers or not all(isinstance(i, int) and not isinstance(i, bool) for i in layers):
                raise ValueError(f"layers must be 'auto' or a non-empty list of integer indices, got {self.layers!r}")
            self.layers = sorted(set(layers))
        if self.num_layers is not None and self.num_layers < 1:
            raise ValueError(f"num_layers must be None (a tenth of the depth) or >= 1, got {self.num_layers}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        if not self.forget_weight > 0:
            raise ValueError(f"forget_weight (w_f) must be > 0, got {self.forget_weight}")
        if not self.retain_weight >= 0:
            raise ValueError(f"retain_weight (w_r) must be >= 0, got {self.retain_weight}")
        if not self.ridge >= 0:
            raise ValueError(f"ridge (mu) must be >= 0 (a negative ridge can make A indefinite), got {self.ridge}")
        if self.max_rank is not None and self.max_rank < 1:
            raise ValueError(f"max_rank must be None or >= 1, got {self.max_rank}")
        if self.specificity_power < 0 or self.specificity_smoothing < 0:
            raise ValueError("specificity_power and specificity_smoothing must be >= 0")
        if self.corruption_norm <= 0:
            raise ValueError(f"corruption_norm must be > 0, got {self.corruption_norm}")
        if self.retain_sample is not None and self.retain_sample < 1:
            raise ValueError(f"retain_sample must be None (every retain row) or >= 1, got {self.retain_sample}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.max_length is not None and self.max_length < 2:
            raise ValueError(f"max_length must be None or >= 2, got {self.max_length}")
        if self.prompt_template is not None:
            if not isinstance(self.prompt_template, str):
                raise ValueError(
                    f"prompt_template must be None or a preset name, got {type(self.prompt_template).__name__}"
                )
            from ..data.prompts import get_template

            get_template(self.prompt_template)  # an unknown preset name is refused here, before any work

    def band_width(self, num_hidden_layers: int) -> int:
        """Layers in the auto-selected band: ``num_layers``, or ``ceil(num_hidden_layers / 10)`` when it is None."""
        if self.num_layers is not None:
            return self.num_layers
        return max(1, math.ceil(num_hidden_layers / 10))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable copy of every field (runtime ones included)."""
        return asdict(self)

    def saved_dict(self) -> dict[str, Any]:
        """The fields that determine the edit (what a saved adapter records): :meth:`to_dict` minus
        :data:`RUNTIME_FIELDS`."""
        return {k: v for k, v in asdict(self).items() if k not in RUNTIME_FIELDS}

    @classmethod
    def from_saved(cls, values: dict[str, Any], **runtime: Any) -> GROMConfig:
        """Rebuild a config from :meth:`saved_dict` output (unknown keys are refused), with runtime overrides."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"Saved GROM config has unknown fields {unknown}; written by a newer hf-unlearn?")
        kwargs = {k: v for k, v in values.items() if k not in RUNTIME_FIELDS}
        kwargs.update(runtime)
        return cls(**kwargs)
