"""``GROMEdit``: the fitted GROM edit as an artifact: audit (``influence``), PEFT LoRA export, save/load, push.

A saved edit is a PEFT LoRA adapter plus ``grom_metadata.json`` (config, base fingerprint, the SHA-256 of the other
files) and ``grom_audit.safetensors`` (what :meth:`GROMEdit.influence` needs).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from ...integrity import check_model_fingerprint, check_pinned_digest, confined_file
from ...jsonutil import json_safe
from .attribution import lm_head_is_tied
from .config import GROMConfig
from .loading import (
    _load_safetensors,
    _lora_scaling,
    _read_audit,
    _read_metadata,
    _resolve_folder,
    _restore_modules,
)
from .peft_export import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    GROM_AUDIT,
    GROM_METADATA,
    LoraFactors,
    _check_finite,
    adapter_state_dict,
    lora_config,
    lora_factors,
    pack_lower,
    record_integrity,
    save_adapter,
    to_peft_model,
)
from .peft_export import verify_integrity as _verify_files
from .solve import GROMSolution, low_rank_form, woodbury_drop


@dataclass
class GROMEdit:
    """A fitted GROM edit: ``deltas`` ``{module: P}`` (float32, CPU), the float64 ``solutions``, keys and targets of
    the audit (:meth:`influence`), the attribution, ``stats``, the base's fingerprint and the retain rows read."""

    _method: ClassVar[str] = "grom"
    _title: ClassVar[str] = "GROM (closed-form one-shot edit)"
    _paper: ClassVar[dict[str, str] | None] = None  # no paper to cite yet
    _cli_help: ClassVar[str] = "closed-form one-shot edit saved as a PEFT LoRA adapter"

    config: GROMConfig
    deltas: dict[str, torch.Tensor]
    solutions: dict[str, GROMSolution]
    forget_keys: dict[str, torch.Tensor]
    targets: dict[str, torch.Tensor]
    example_ids: torch.Tensor
    num_forget_examples: int
    layer_scores: dict[int, dict[str, float]] = field(default_factory=dict)
    selected_layers: list[int] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    base_model_name_or_path: str | None = None
    base_fingerprint: dict[str, Any] | None = None
    retain_indices: list[int] = field(default_factory=list)
    untied_lm_head: str | None = None
    _factors: dict[str, LoraFactors] | None = field(default=None, init=False, repr=False, compare=False)

    def influence(self, example_index: int) -> dict[str, torch.Tensor]:
        """Exact change of each ``P`` (float64) if forget example ``example_index`` left the objective (``w_f/s``
        kept), by :func:`~hf_unlearn.methods.grom.solve.woodbury_drop` on the cached Cholesky factor."""
        if not self.solutions:
            raise ValueError("This GROM edit carries no audit state (saved with save_audit=False): no influence().")
        if not 0 <= example_index < self.num_forget_examples:
            raise ValueError(f"example_index must be in [0, {self.num_forget_examples}), got {example_index}")
        rows = (self.example_ids == example_index).nonzero().squeeze(-1)
        out = {}
        for name, sol in self.solutions.items():
            r = rows.to(self.forget_keys[name].device)
            out[name] = woodbury_drop(sol, self.forget_keys[name][r], self.targets[name][r]).cpu()
        return out

    def lora_factors(self) -> dict[str, LoraFactors]:
        """``{module: LoraFactors}`` of each ``P``, from its low-rank form when known; computed once."""
        if self._factors is None:
            factors = {}
            for name, p in self.deltas.items():
                sol = self.solutions.get(name)
                form = low_rank_form(sol, self.forget_keys[name], self.targets[name]) if sol is not None else None
                factors[name] = lora_factors(p, self.config.max_rank, low_rank=form)
            self._factors = factors
        return self._factors

    def _export(self) -> tuple[Any, dict[str, torch.Tensor], dict[str, Any]]:
        _check_finite(self.deltas, "edit")
        factors = self.lora_factors()
        rank = max(f.rank for f in factors.values())
        config = lora_config({n: f.rank for n, f in factors.items()}, self.base_model_name_or_path)
        state = adapter_state_dict(factors)
        meta = {
            "method": "GROM",
            "formula": "P = (w_f/s) D X_f^T A^{-1}, "
                       "A = (w_r/r) X_r X_r^T + (w_g/g) X_g X_g^T + (w_f/s) X_f X_f^T + mu I",
            "config": self.config.saved_dict(), "lora_rank": rank,
            "modules": {n: {"rank": f.rank, "relative_frobenius_error": f.relative_error, "truncated": f.truncated}
                        for n, f in factors.items()},
            "layer_scores": {str(k): v for k, v in self.layer_scores.items()}, "selected_layers": self.selected_layers,
            "stats": self.stats, "num_forget_examples": self.num_forget_examples,
            "retain_indices": list(self.retain_indices), "base_model_name_or_path": self.base_model_name_or_path,
            "base_fingerprint": self.base_fingerprint, "untied_lm_head": self.untied_lm_head,
        }
        return config, state, json_safe(meta)

    def truncation_errors(self) -> dict[str, float]:
        """Relative Frobenius error of each module's LoRA export (0 when exact)."""
        return {n: f.relative_error for n, f in self.lora_factors().items()}

    def verify_base(self, model: Any, what: str = "This GROM adapter") -> None:
        """Refuse (``BaseModelMismatchError``) a ``model`` whose weights are not the ones solved against."""
        check_model_fingerprint(self.base_fingerprint, model, what,
                                "A GROM edit P is only valid for the weights it was solved with; load it onto that base "
                                "(adapter base_model_name_or_path), or refit fit_grom on this one.")

    def to_peft(self, model: Any, check_base_model: bool = True) -> Any:
        """``peft.PeftModel`` applying ``W + P`` around ``model``; another base is refused."""
        if check_base_model:
            self.verify_base(model)
        config, state, _ = self._export()
        if self.untied_lm_head:
            untie_lm_head(model)
        return to_peft_model(model, config, state)

    def _audit_state(self) -> dict[str, torch.Tensor]:
        """What :meth:`influence` needs: per module the packed Cholesky factor of ``A``, ``c_f``, keys and targets."""
        out: dict[str, torch.Tensor] = {"example_ids": self.example_ids.to(torch.long).cpu()}
        for name, sol in self.solutions.items():
            out[f"chol_lower/{name}"] = pack_lower(sol.chol.to(torch.float64)).cpu()
            out[f"forget_scale/{name}"] = torch.tensor([sol.forget_scale], dtype=torch.float64)
            out[f"forget_keys/{name}"] = self.forget_keys[name].cpu()
            out[f"targets/{name}"] = self.targets[name].cpu()
        return out

    def save_pretrained(
        self, save_directory: str | os.PathLike, *, overwrite: bool = False, save_audit: bool = True
    ) -> None:
        """Write the PEFT LoRA adapter, ``grom_metadata.json`` and (``save_audit``) ``grom_audit.safetensors``; a
        folder holding an adapter is refused unless ``overwrite``."""
        config, state, meta = self._export()
        audit = self._audit_state() if save_audit and self.solutions else None
        meta["audit_file"] = GROM_AUDIT if audit is not None else None
        save_adapter(save_directory, config, state, meta, audit, overwrite=overwrite)

    @classmethod
    def from_pretrained(
        cls, path_or_repo_id: str | os.PathLike, model: Any = None, *, revision: str | None = None,
        token: str | bool | None = None, cache_dir: str | os.PathLike | None = None, local_files_only: bool = False,
        verify_integrity: bool = True, allow_missing_audit: bool = False, expected_sha256: str | None = None,
    ) -> GROMEdit:
        """Load an edit saved by :meth:`save_pretrained` from a folder or a Hub repo. Refused: damaged metadata;
        files whose SHA-256 is not the recorded one (unless ``verify_integrity=False``) or metadata other than
        ``expected_sha256``; a missing audit (unless ``allow_missing_audit``); an audit ``P`` other than
        ``(lora_alpha / r) B A``; another base."""
        folder = _resolve_folder(path_or_repo_id, revision, token, cache_dir, local_files_only)
        what = f"The GROM adapter {path_or_repo_id}"
        check_pinned_digest(folder, expected_sha256, what, GROM_METADATA)
        meta = _read_metadata(folder, path_or_repo_id)
        audit_name = meta.get("audit_file")
        audit_path = confined_file(folder, audit_name, what, GROM_METADATA) if audit_name is not None else None
        if verify_integrity or expected_sha256 is not None:
            required = (ADAPTER_CONFIG, ADAPTER_WEIGHTS, *([audit_name] if audit_name else []))
            _verify_files(folder, meta, what, required=required)
        config = GROMConfig.from_saved(meta["config"], progress=False)
        state = _load_safetensors(folder / ADAPTER_WEIGHTS, what)
        scaling = _lora_scaling(folder, what)
        audit = _read_audit(audit_path, audit_name, allow_missing_audit, what)
        deltas, solutions, keys, targets = _restore_modules(meta["modules"], state, scaling, audit, what, audit_name)
        edit = cls(
            config=config, deltas=deltas, solutions=solutions, forget_keys=keys, targets=targets,
            example_ids=audit.get("example_ids", torch.zeros(0, dtype=torch.long)),
            num_forget_examples=int(meta.get("num_forget_examples", 0)),
            layer_scores={int(k): v for k, v in meta.get("layer_scores", {}).items()},
            selected_layers=list(meta.get("selected_layers", [])), stats=dict(meta.get("stats", {})),
            base_model_name_or_path=meta.get("base_model_name_or_path"), base_fingerprint=meta.get("base_fingerprint"),
            retain_indices=list(meta.get("retain_indices", [])), untied_lm_head=meta.get("untied_lm_head"),
        )
        if model is not None:
            edit.verify_base(model, what)
        return edit

    def push_to_hub(
        self, repo_id: str, *, token: str | None = None, private: bool | None = None,
        commit_message: str | None = None, revision: str | None = None, report: dict[str, Any] | None = None,
        save_audit: bool = True, create_card: bool = True, endpoint: str | None = None,
    ) -> Any:
        """Upload the saved folder, a model card and ``report`` in one commit; returns the ``CommitInfo``."""
        from huggingface_hub.utils import validate_repo_id

        from ...hub.push import push_folder

        validate_repo_id(repo_id)
        with tempfile.TemporaryDirectory(prefix="hf-unlearn-grom-push-") as tmp:
            folder = Path(tmp) / "adapter"
            self.save_pretrained(folder, save_audit=save_audit)
            if report is not None:
                from ...safe_output import atomic_write_json

                atomic_write_json(folder / "unlearning_report.json", json_safe(report))
            card = None
            if create_card and self.base_model_name_or_path:
                from ...hub.cards import build_model_card
                from ...selection import selection_record_of

                card = build_model_card(
                    "grom_adapter", self.base_model_name_or_path, "grom", self.config.saved_dict(), report,
                    repo_id=repo_id, library_name="peft", selection=selection_record_of(self),
                )
                record_integrity(card, folder)
            return push_folder(
                folder, repo_id, card=card, token=token, endpoint=endpoint, private=private, revision=revision,
                commit_message=commit_message or f"Upload GROM adapter ({', '.join(self.deltas)})",
            )

    def apply_(self, model: Any, sign: float = 1.0) -> Any:
        """Add ``sign * P`` to the edited weights of ``model`` in place (untying a tied head first)."""
        if self.untied_lm_head:
            untie_lm_head(model)
        _add_deltas(dict(model.named_modules()), {name: sign * p for name, p in self.deltas.items()})
        return model


def _add_deltas(modules: dict[str, Any], deltas: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, p in deltas.items():
            w = modules[name].weight
            w.add_(p.to(device=w.device, dtype=w.dtype))


def load_grom_adapter(model: Any, path_or_repo_id: str | os.PathLike, **kwargs: Any) -> Any:
    """``PeftModel.from_pretrained(model, path)`` after the checks of :meth:`GROMEdit.from_pretrained` (whose keyword
    arguments ``kwargs`` takes), ``model`` included: plain PEFT would load onto any base whose shapes fit."""
    from peft import PeftModel

    folder = _resolve_folder(path_or_repo_id, kwargs.get("revision"), kwargs.get("token"),
                             kwargs.get("cache_dir"), kwargs.get("local_files_only", False))
    edit = GROMEdit.from_pretrained(
        folder, model=model, verify_integrity=kwargs.get("verify_integrity", True),
        allow_missing_audit=kwargs.get("allow_missing_audit", False), expected_sha256=kwargs.get("expected_sha256"),
    )
    if edit.untied_lm_head:
        untie_lm_head(model)
    peft_model = PeftModel.from_pretrained(model, str(folder))
    peft_model.eval()
    return peft_model


def untie_lm_head(model: Any) -> Any:
    """Give ``model`` (or a ``PeftModel``'s base) an LM head of its own when it is tied to the input embeddings,
    in place: a copy of the shared matrix, and ``tie_word_embeddings=False`` so transformers does not tie it again."""
    from torch import nn

    base = model.get_base_model() if hasattr(model, "peft_config") and hasattr(model, "get_base_model") else model
    if not lm_head_is_tied(base):
        return model
    head = base.get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(base).__name__} has no output embeddings (LM head) to untie.")
    embed = base.get_input_embeddings()
    if head.weight is embed.weight or head.weight.data_ptr() == embed.weight.data_ptr():
        head.weight = nn.Parameter(head.weight.detach().clone(), requires_grad=head.weight.requires_grad)
    text = base.config.get_text_config() if hasattr(base.config, "get_text_config") else base.config
    for cfg in {id(c): c for c in (base.config, text)}.values():
        cfg.tie_word_embeddings = False
    return model
