"""GROM configuration: every knob of the closed-form one-shot unlearning edit, validated up front."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

OBJECTIVES = ("token_suppression", "representation_corruption")


@dataclass
class GROMConfig:
    """Configuration of :func:`hf_unlearn.grom.fit_grom`.

    The edit of a linear module ``y = W x`` is ``W + P`` with

        P* = (w_f/s) D X_f^T A^{-1},   A = (w_r/r) X_r X_r^T + (w_f/s) X_f X_f^T + mu I,

    the minimiser of ``(w_f/s)||P X_f - D||^2 + (w_r/r)||P X_r||^2 + mu ||P||^2`` where ``X_f`` (``d_in x s``)
    holds the module inputs (keys) at the ``s`` forget answer positions, ``X_r`` (``d_in x r``) those at the
    ``r`` retain answer positions and ``D`` (``d_out x s``) the desired output changes (targets).

    Defaults (``forget_weight=10``, ``suppression_margin=30``, ``ridge=1e-2``) were tuned on TOFU-tiny
    (synthetic ``forget10`` vs ``retain90``): with ``target_modules="lm_head"`` they raise the forget answer NLL
    by about +2.5 nats/token while the retain NLL moves by about +0.14. On that 2-layer model a ``down_proj``
    edit is less specific (it trades about +0.5 / +0.03 at ``retain_weight=100, ridge=1e-3`` up to +2.1 / +1.6
    at the defaults); raise ``retain_weight`` to protect retain answers.

    Parameters
    ----------
    target_modules:
        Name (or list of names) of the linear modules to edit, matched as the last component(s) of the module
        path, e.g. ``"down_proj"`` (the MLP down-projection of Llama/Qwen/Mistral blocks), ``"lm_head"``, or a
        full path such as ``"model.layers.1.mlp.down_proj"``. Edited modules must write to the residual
        stream (``d_out == hidden_size``) or be the LM head, so that their targets can be read through the
        final norm and unembedding.
    layers:
        ``"auto"`` (logit-lens attribution, see :mod:`hf_unlearn.grom.attribution`) or an explicit list of layer
        indices; applies to layered modules (the LM head is not layered and is always edited when targeted).
    num_layers:
        Width of the contiguous band of layers chosen by ``layers="auto"``.
    objective:
        ``"token_suppression"`` (lower the logit margin of each forget answer token, weighted by its
        specificity) or ``"representation_corruption"`` (push the module output along a fixed random
        direction, for multiple-choice style knowledge); see :mod:`hf_unlearn.grom.targets`.
    forget_weight:
        ``w_f > 0``: weight of the forget fit term, divided by the number ``s`` of forget keys.
    retain_weight:
        ``w_r >= 0``: weight of the retain preservation term, divided by the number ``r`` of retain keys.
    ridge:
        ``mu >= 0``: Tikhonov term. ``0`` is allowed only when ``A`` is non-singular (many more retain keys than
        input dimensions); a singular ``A`` raises a ``ValueError`` suggesting a value.
    max_rank:
        ``None`` (exact export) or the largest LoRA rank of the PEFT adapter; an edit of higher rank is
        truncated by SVD and the relative Frobenius error is reported (and written in the adapter metadata).
    suppression_margin:
        ``kappa``: token suppression asks each forget token's logit margin ``z_y - logsumexp_{v != y} z_v``
        (read through the logit lens) to fall to ``-kappa``: the requested drop is
        ``alpha_y * max(0, margin + kappa)`` nats, shared evenly between the edited modules.
    specificity_power:
        ``gamma``: the specificity of token ``j`` is ``alpha_j = clip(1 - p_r(j) / p_f(j), 0, 1)^gamma`` with
        ``p_f, p_r`` its smoothed frequency among forget and retain answer tokens (1 for forget-only tokens,
        0 for tokens at least as common in retain answers). ``0`` gives every token seen in forget answers
        weight 1; larger values concentrate the edit on the most forget-specific tokens.
    specificity_smoothing:
        ``beta``: additive pseudo-count in ``p_f(j) = (c_f(j) + beta) / (N_f + beta V)`` (same for ``p_r``).
    corruption_norm:
        Representation corruption: norm of the target ``D_t = alpha_y * c * u`` (``u`` a fixed random unit
        direction of the module's output space) as a multiple ``c`` of the mean norm of the module's outputs
        on the forget keys.
    seed:
        Seed of the random corruption direction.
    batch_size:
        Examples per forward pass when collecting keys.
    max_length:
        Optional truncation of tokenized examples (prompt kept, answer cut).
    max_stat_memory_gb:
        With ``layers="auto"``, statistics of every candidate layer are accumulated in the same forward pass
        that scores the layers when they fit in this budget (one pass over the data); otherwise an attribution
        pass is followed by a key pass over the selected layers only.
    progress:
        Show tqdm progress bars.
    """

    target_modules: str | list[str] = "down_proj"
    layers: str | list[int] = "auto"
    num_layers: int = 1
    objective: str = "token_suppression"
    forget_weight: float = 10.0
    retain_weight: float = 1.0
    ridge: float = 1e-2
    max_rank: int | None = None
    suppression_margin: float = 30.0
    specificity_power: float = 1.0
    specificity_smoothing: float = 0.5
    corruption_norm: float = 1.0
    seed: int = 0
    batch_size: int = 16
    max_length: int | None = None
    max_stat_memory_gb: float = 4.0
    progress: bool = True

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
        if self.num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {self.num_layers}")
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
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.max_length is not None and self.max_length < 2:
            raise ValueError(f"max_length must be None or >= 2, got {self.max_length}")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable copy (written in the adapter metadata)."""
        return asdict(self)
