"""``fit_grom``: forward passes collect keys, one linear solve per module gives the edit (``GROMEdit``).

The edit is computed from the *unedited* model: keys and targets of all edited modules come from the
same forward passes, and each module's ``P`` is solved independently (``k`` edited modules each take
``1/k`` of the requested margin drop). Nothing is backpropagated through the model.

Multi-process: every process passes the same forget/retain rows; forward passes are sharded across
``torch.distributed`` processes (example ``i`` goes to rank ``i % world_size``), the second moments and
attribution sums are all-reduced and the forget records all-gathered, so each process ends with the
edit the single-process run computes.

Cost: GROM reads every forget row but only ``GROMConfig.retain_sample`` retain rows (a seeded uniform
sample, :func:`retain_subsample`) for ``X_r X_r^T``; every example is cut to the model's maximum
positions (:func:`hf_unlearn.data.model_max_positions`), so no position past it is ever indexed.

Persistence: :meth:`GROMEdit.save_pretrained` writes a PEFT LoRA adapter (``PeftModel.from_pretrained``
loads it) plus ``grom_metadata.json`` (config, layer scores, the base-model fingerprint) and
``grom_audit.safetensors`` (what :meth:`GROMEdit.influence` needs), the metadata recording the SHA-256 of
the other files; :meth:`GROMEdit.from_pretrained` restores it from a folder or a Hub repo, refuses files
that differ from the saved ones (:class:`~hf_unlearn.methods.grom.peft_export.AdapterIntegrityError`) and an audit
whose ``P`` is not the adapter's ``B A``, and, given a model, refuses a base other than the one the edit
was solved against (:mod:`hf_unlearn.methods.grom.provenance`); :meth:`GROMEdit.push_to_hub` uploads the saved
folder in one commit.

Tied embeddings: with ``GROMConfig(untie_lm_head=True)`` an LM head tied to the input embeddings can be
edited; :meth:`GROMEdit.to_peft`, :meth:`GROMEdit.apply_` and :func:`load_grom_adapter` first give the model
a separate copy of the head (:func:`untie_lm_head`), so the input embeddings never change.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from ...data.documents import as_documents, chunk_documents, chunk_length, shared_documents
from ...data.pairing import overlapping_examples
from ...data.prepare import PromptTooLongError, prepare_qa
from ...data.prompts import IGNORE_INDEX, collate_qa, ensure_pad_token, model_max_positions
from ...partitioning import vocab_size
from .attribution import TargetModule, attribution_scores, find_target_modules, lm_head_is_tied, select_band
from .config import GROMConfig
from .keys import KeyCollector, _dist
from .peft_export import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    GROM_AUDIT,
    GROM_METADATA,
    AdapterIntegrityError,
    _check_finite,
    adapter_state_dict,
    check_pinned_digest,
    confined_file,
    lora_config,
    lora_factors,
    record_integrity,
    save_adapter,
    to_peft_model,
)
from .peft_export import verify_integrity as _verify_files
from .provenance import base_fingerprint, check_base
from .solve import GROMSolution, solve_grom, woodbury_drop
from .targets import corruption_targets, random_direction, specificity_weights, suppression_targets


@dataclass
class GROMEdit:
    """A fitted GROM edit.

    ``deltas``: ``{module name: P}`` (float32, CPU), the weight change of each edited ``nn.Linear``
    (``W <- W + P``). ``layer_scores``: the logit-lens attribution per candidate layer (``layers="auto"``).
    ``influence(i)`` audits forget example ``i`` exactly; ``to_peft`` / ``save_pretrained`` export the edit
    as a LoRA adapter, ``from_pretrained`` / ``push_to_hub`` reload and publish it. ``base_fingerprint``
    identifies the base weights the edit was solved against (see :mod:`hf_unlearn.methods.grom.provenance`);
    ``retain_indices`` are the retain rows that were read. ``untied_lm_head`` names the edited LM head when it
    was tied to the input embeddings (``GROMConfig.untie_lm_head``): the edit applies to an untied copy.
    """

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

    def influence(self, example_index: int) -> dict[str, torch.Tensor]:
        """Exact change of each ``P`` (float64) if forget example ``example_index`` were dropped.

        Dropping means removing that example's keys and targets from the objective with the per-key forget
        weight ``w_f/s`` kept at its fitted value; computed by the Sherman-Morrison-Woodbury identity from
        the cached Cholesky factor (see :func:`hf_unlearn.methods.grom.solve.woodbury_drop`), not by re-solving.
        """
        if not self.solutions:
            raise ValueError(
                "This GROM edit carries no audit state (it was saved with save_audit=False), so influence() cannot "
                "be computed; refit it or load an adapter saved with its audit state."
            )
        if not 0 <= example_index < self.num_forget_examples:
            raise ValueError(f"example_index must be in [0, {self.num_forget_examples}), got {example_index}")
        rows = (self.example_ids == example_index).nonzero().squeeze(-1)
        out = {}
        for name, sol in self.solutions.items():
            r = rows.to(self.forget_keys[name].device)
            out[name] = woodbury_drop(sol, self.forget_keys[name][r], self.targets[name][r]).cpu()
        return out

    def lora_factors(self) -> dict[str, Any]:
        """``{module: LoraFactors}`` reproducing each ``P`` (exact up to float rounding unless ``max_rank`` binds)."""
        return {n: lora_factors(p, self.config.max_rank) for n, p in self.deltas.items()}

    def _export(self) -> tuple[Any, dict[str, torch.Tensor], dict[str, Any]]:
        _check_finite(self.deltas, "edit")
        factors = self.lora_factors()
        rank = max(f.rank for f in factors.values())
        config = lora_config(list(self.deltas), rank, self.base_model_name_or_path)
        state = adapter_state_dict(factors, rank)
        meta = {
            "method": "GROM",
            "formula": "P = (w_f/s) D X_f^T A^{-1}, "
                       "A = (w_r/r) X_r X_r^T + (w_g/g) X_g X_g^T + (w_f/s) X_f X_f^T + mu I",
            "config": self.config.saved_dict(),
            "lora_rank": rank,
            "modules": {
                n: {"rank": f.rank, "relative_frobenius_error": f.relative_error, "truncated": f.truncated}
                for n, f in factors.items()
            },
            "layer_scores": {str(k): v for k, v in self.layer_scores.items()},
            "selected_layers": self.selected_layers,
            "stats": self.stats,
            "num_forget_examples": self.num_forget_examples,
            "retain_indices": list(self.retain_indices),
            "base_model_name_or_path": self.base_model_name_or_path,
            "base_fingerprint": self.base_fingerprint,
            "untied_lm_head": self.untied_lm_head,
        }
        return config, state, _jsonable(meta)

    def truncation_errors(self) -> dict[str, float]:
        """Relative Frobenius error of the LoRA export of each module (0 when exact)."""
        return {n: f.relative_error for n, f in self.lora_factors().items()}

    def verify_base(self, model: Any) -> None:
        """Raise :class:`hf_unlearn.methods.grom.provenance.BaseModelMismatchError` unless ``model``'s edited modules hold
        the weights this edit was solved against."""
        check_base(self.base_fingerprint, model)

    def to_peft(self, model: Any, check_base_model: bool = True) -> Any:
        """``peft.PeftModel`` (LoRA, ``lora_alpha = r``) applying ``W + P``; wraps ``model`` in place.

        ``model`` must be the base the edit was solved against (checked by fingerprint unless
        ``check_base_model=False``)."""
        if check_base_model:
            self.verify_base(model)
        config, state, _ = self._export()
        if self.untied_lm_head:
            untie_lm_head(model)
        return to_peft_model(model, config, state)

    def _audit_state(self) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {"example_ids": self.example_ids.to(torch.long).cpu()}
        for name, sol in self.solutions.items():
            out[f"delta/{name}"] = sol.delta.to(torch.float64).cpu()
            out[f"chol/{name}"] = sol.chol.to(torch.float64).cpu()
            out[f"forget_scale/{name}"] = torch.tensor([sol.forget_scale], dtype=torch.float64)
            out[f"forget_keys/{name}"] = self.forget_keys[name].cpu()
            out[f"targets/{name}"] = self.targets[name].cpu()
        return out

    def save_pretrained(
        self, save_directory: str | os.PathLike, *, overwrite: bool = False, save_audit: bool = True
    ) -> None:
        """Write the edit as the folder ``save_directory``; load it with ``PeftModel.from_pretrained(base, dir)``
        or :meth:`from_pretrained` / :func:`load_grom_adapter` (which check the base).

        Files: ``adapter_config.json`` and ``adapter_model.safetensors`` (PEFT LoRA, ``B @ A = P``),
        ``grom_metadata.json`` (saved config, layer scores, truncation errors, base fingerprint) and, with
        ``save_audit``, ``grom_audit.safetensors`` (the float64 ``P``, the Cholesky factor of ``A``, the forget
        keys and targets: what :meth:`influence` needs; ``d_in^2 + s (d_in + d_out)`` numbers per module).
        The folder is built beside ``save_directory`` and swapped in when complete; a non-empty folder is
        refused unless ``overwrite``; non-finite values are refused before anything is written.
        """
        config, state, meta = self._export()
        audit = self._audit_state() if save_audit and self.solutions else None
        meta["audit_file"] = GROM_AUDIT if audit is not None else None
        save_adapter(save_directory, config, state, meta, audit, overwrite=overwrite)

    @classmethod
    def from_pretrained(
        cls,
        path_or_repo_id: str | os.PathLike,
        model: Any = None,
        *,
        revision: str | None = None,
        token: str | bool | None = None,
        cache_dir: str | os.PathLike | None = None,
        local_files_only: bool = False,
        verify_integrity: bool = True,
        allow_missing_audit: bool = False,
        expected_sha256: str | None = None,
    ) -> GROMEdit:
        """Load an edit saved by :meth:`save_pretrained` from a local folder or a Hub repo.

        Checked before anything is used: ``grom_metadata.json`` parses and names its modules; every file it
        records a SHA-256 for (``adapter_config.json``, ``adapter_model.safetensors``, the audit) has that digest
        (:class:`~hf_unlearn.methods.grom.peft_export.AdapterIntegrityError` otherwise; ``verify_integrity=False`` skips
        this, e.g. for an adapter saved without digests); the audit the metadata names is present (refused when
        missing unless ``allow_missing_audit=True``, which loads ``P = B A`` from the adapter without the audit);
        every module has its LoRA factors; and the audit's float64 ``P`` equals the adapter's
        ``(lora_alpha / r) B A`` within the export's recorded relative Frobenius error plus ``1e-4`` (float32
        factors). The audit state (for :meth:`influence`) is restored when present. With ``model``, the edit is
        checked against it: a base other than the one it was solved against is refused with
        :class:`hf_unlearn.methods.grom.provenance.BaseModelMismatchError`.

        Every file name the metadata gives must be a plain name inside the folder (no ``..``, absolute path or link
        out). The digests live in the metadata, so they catch accidents and naive edits; ``expected_sha256`` (the
        :func:`~hf_unlearn.methods.grom.peft_export.adapter_digest` printed at save time, or the
        ``hf_unlearn_integrity`` entry of the model card pushed with it) pins the metadata itself, and with it
        every file, so an adapter whose files and metadata were both rewritten is refused too (the file checks
        then run even with ``verify_integrity=False``).
        """
        folder = _resolve_folder(path_or_repo_id, revision, token, cache_dir, local_files_only)
        what = f"The GROM adapter {path_or_repo_id}"
        check_pinned_digest(folder, expected_sha256, what)
        meta = _read_metadata(folder, path_or_repo_id)
        audit_name = meta.get("audit_file")
        audit_path = confined_file(folder, audit_name, what) if audit_name is not None else None
        if verify_integrity or expected_sha256 is not None:
            required = (ADAPTER_CONFIG, ADAPTER_WEIGHTS, *([audit_name] if audit_name else []))
            _verify_files(folder, meta, what, required=required)
        config = GROMConfig.from_saved(meta["config"], progress=False)
        state = _load_safetensors(folder / ADAPTER_WEIGHTS, what)
        scaling = _lora_scaling(folder, what)
        audit: dict[str, torch.Tensor] = {}
        if audit_path is not None:
            if audit_path.is_file():
                audit = _load_safetensors(audit_path, what)
            elif not allow_missing_audit:
                raise AdapterIntegrityError(
                    f"{what}: {audit_name} is missing, but {GROM_METADATA} says the adapter was saved with it. "
                    "Restore the file, or pass allow_missing_audit=True to load the edit from "
                    f"{ADAPTER_WEIGHTS} alone (influence() is then unavailable)."
                )
        deltas, solutions, keys, targets = {}, {}, {}, {}
        for name, info in meta["modules"].items():
            a_key, b_key = f"base_model.model.{name}.lora_A.weight", f"base_model.model.{name}.lora_B.weight"
            if a_key not in state or b_key not in state:
                raise ValueError(
                    f"{what}: {ADAPTER_WEIGHTS} has no LoRA factors for module {name!r} that {GROM_METADATA} lists "
                    f"(keys {a_key} / {b_key}); the adapter is incomplete. Save it again with save_pretrained."
                )
            product = scaling * (state[b_key].double() @ state[a_key].double())
            if not audit:
                deltas[name] = product.float()
                continue
            parts = {part: f"{part}/{name}" for part in ("delta", "chol", "forget_scale", "forget_keys", "targets")}
            absent = [k for k in parts.values() if k not in audit]
            if absent:
                raise ValueError(
                    f"{what}: {audit_name} has no {absent} for module {name!r}; the audit is incomplete. Save the "
                    "edit again with save_pretrained."
                )
            delta = audit[parts["delta"]]
            _check_factors_match(delta, product, info, name, what, audit_name)
            sol = GROMSolution(delta=delta, chol=audit[parts["chol"]],
                               forget_scale=float(audit[parts["forget_scale"]][0]))
            solutions[name], keys[name], targets[name] = sol, audit[parts["forget_keys"]], audit[parts["targets"]]
            deltas[name] = sol.delta.float()
        edit = cls(
            config=config,
            deltas=deltas,
            solutions=solutions,
            forget_keys=keys,
            targets=targets,
            example_ids=audit.get("example_ids", torch.zeros(0, dtype=torch.long)),
            num_forget_examples=int(meta.get("num_forget_examples", 0)),
            layer_scores={int(k): v for k, v in meta.get("layer_scores", {}).items()},
            selected_layers=list(meta.get("selected_layers", [])),
            stats=dict(meta.get("stats", {})),
            base_model_name_or_path=meta.get("base_model_name_or_path"),
            base_fingerprint=meta.get("base_fingerprint"),
            retain_indices=list(meta.get("retain_indices", [])),
            untied_lm_head=meta.get("untied_lm_head"),
        )
        if model is not None:
            check_base(edit.base_fingerprint, model, what)
        return edit

    def push_to_hub(
        self,
        repo_id: str,
        *,
        token: str | None = None,
        private: bool | None = None,
        commit_message: str | None = None,
        revision: str | None = None,
        report: dict[str, Any] | None = None,
        save_audit: bool = True,
        create_card: bool = True,
        endpoint: str | None = None,
    ) -> Any:
        """Upload the saved edit (the :meth:`save_pretrained` folder, a model card rendered by
        :func:`hf_unlearn.hub.build_model_card` when the base is known, and ``report`` as
        ``unlearning_report.json`` when given) to ``repo_id`` in one commit with
        :func:`hf_unlearn.hub.push.push_folder`; returns the ``CommitInfo``.

        The repo id is validated and the folder fully written before anything is sent.
        """
        from huggingface_hub.utils import validate_repo_id

        from ...hub.push import push_folder

        validate_repo_id(repo_id)
        with tempfile.TemporaryDirectory(prefix="hf-unlearn-grom-push-") as tmp:
            folder = Path(tmp) / "adapter"
            self.save_pretrained(folder, save_audit=save_audit)
            if report is not None:
                from ...safe_output import atomic_write_json

                atomic_write_json(folder / "unlearning_report.json", _jsonable(report))
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
        """Add ``sign * P`` to the edited weights of ``model`` in place (``sign=-1`` undoes the edit); an edit of a
        tied LM head first unties it (:func:`untie_lm_head`), so the input embeddings are left unchanged."""
        if self.untied_lm_head:
            untie_lm_head(model)
        modules = dict(model.named_modules())
        with torch.no_grad():
            for name, p in self.deltas.items():
                w = modules[name].weight
                w.add_(sign * p.to(device=w.device, dtype=w.dtype))
        return model


def load_grom_adapter(model: Any, path_or_repo_id: str | os.PathLike, **kwargs: Any) -> Any:
    """``PeftModel.from_pretrained(model, path)`` for a GROM adapter, after the checks of
    :meth:`GROMEdit.from_pretrained`: the files are the saved ones, and ``model`` is the base the edit was solved
    against (a mismatch raises :class:`hf_unlearn.methods.grom.provenance.BaseModelMismatchError`; plain PEFT would load
    it silently whenever module names and shapes fit). An edit of a tied LM head unties ``model`` first
    (:func:`untie_lm_head`), so merging leaves the input embeddings unchanged. ``kwargs``: ``revision``,
    ``token``, ``cache_dir``, ``local_files_only``, ``verify_integrity``, ``allow_missing_audit``,
    ``expected_sha256``."""
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
    """Give ``model`` an LM head of its own when it is tied to the input embeddings (in place; returns ``model``).

    The head's weight becomes a copy of the shared matrix (same values, so the base fingerprint is unchanged) and
    ``tie_word_embeddings`` is set to False in the config, so transformers does not tie them again. A model
    whose head is already separate is returned unchanged. A ``PeftModel`` is untied in its base model.
    """
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
    for cfg in {id(c): c for c in (base.config, _text_config(base.config))}.values():
        cfg.tie_word_embeddings = False
    return model


def _text_config(config: Any) -> Any:
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _read_metadata(folder: Path, source: Any) -> dict[str, Any]:
    """``grom_metadata.json`` of ``folder`` as a dict with ``config`` and ``modules``, or a ValueError naming the
    file and the problem."""
    meta_path = folder / GROM_METADATA
    if not meta_path.is_file():
        raise ValueError(
            f"{source} is not a GROM adapter (no {GROM_METADATA}); a plain PEFT adapter loads with "
            "peft.PeftModel.from_pretrained."
        )
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(
            f"{meta_path} is not valid JSON ({err}); the GROM metadata was damaged. Restore the file from the saved "
            "adapter (or download the repo again), or refit and save the edit."
        ) from None
    if not isinstance(meta, dict):
        raise ValueError(f"{meta_path} must hold a JSON object, got {type(meta).__name__}; the GROM metadata is damaged.")
    missing = [k for k in ("config", "modules") if not isinstance(meta.get(k), dict)]
    if missing:
        raise ValueError(
            f"{meta_path} has no {missing} entry (or not an object); the GROM metadata is damaged or was not written "
            "by hf-unlearn. Restore the file from the saved adapter, or refit and save the edit."
        )
    return meta


def _load_safetensors(path: Path, what: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    if not path.is_file():
        raise ValueError(f"{what}: {path.name} is missing; the adapter folder is incomplete.")
    try:
        return load_file(str(path))
    except Exception as err:  # safetensors raises its own error types for a damaged header
        raise ValueError(f"{what}: {path.name} cannot be read as safetensors ({err}); restore the saved file.") from None


def _lora_scaling(folder: Path, what: str) -> float:
    """``lora_alpha / r`` of ``adapter_config.json`` (``lora_alpha / sqrt(r)`` with ``use_rslora``)."""
    path = folder / ADAPTER_CONFIG
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
        rank, alpha = float(cfg["r"]), float(cfg["lora_alpha"])
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as err:
        raise ValueError(
            f"{what}: {ADAPTER_CONFIG} is missing or has no numeric r / lora_alpha ({type(err).__name__}); restore "
            "the saved file."
        ) from None
    if not (rank > 0 and math.isfinite(alpha)):
        raise ValueError(f"{what}: {ADAPTER_CONFIG} has r={rank}, lora_alpha={alpha}; restore the saved file.")
    return alpha / (math.sqrt(rank) if cfg.get("use_rslora") else rank)


#: Slack, beyond the export's recorded truncation error, of the check that the audit's ``P`` is the adapter's
#: ``B A``: the float32 factors of a float64 ``P`` carry a relative Frobenius error of about ``1e-7 sqrt(k)``.
FACTOR_CHECK_RTOL = 1e-4


def _check_factors_match(
    delta: torch.Tensor, product: torch.Tensor, info: Any, name: str, what: str, audit_name: str
) -> None:
    """Refuse an audit ``P`` that is not the adapter's ``s B A``:
    ``||s B A - P||_F <= (e + FACTOR_CHECK_RTOL) ||P||_F`` with ``e`` the recorded truncation error."""
    recorded = info.get("relative_frobenius_error", 0.0) if isinstance(info, dict) else 0.0
    recorded = float(recorded) if isinstance(recorded, (int, float)) and math.isfinite(recorded) else 0.0
    p = delta.to(torch.float64)
    if tuple(p.shape) != tuple(product.shape):
        raise AdapterIntegrityError(
            f"{what}: module {name!r} has P of shape {list(p.shape)} in {audit_name} but B A of shape "
            f"{list(product.shape)} in {ADAPTER_WEIGHTS}: the files do not belong together."
        )
    scale = float(p.norm())
    err = float((product - p).norm())
    if not err <= (recorded + FACTOR_CHECK_RTOL) * scale + 1e-30:
        rel = err / scale if scale > 0 else float("inf")
        raise AdapterIntegrityError(
            f"{what}: for module {name!r} the audit's P ({audit_name}) and the adapter's (lora_alpha/r) B A "
            f"({ADAPTER_WEIGHTS}) differ by a relative Frobenius error of {rel:.3g} (allowed: {recorded:.3g} "
            f"recorded + {FACTOR_CHECK_RTOL:g}). One of the files was modified after saving; restore both from the "
            "saved adapter or refit with fit_grom."
        )


_HUB_FILES = ["adapter_config.json", ADAPTER_WEIGHTS, GROM_METADATA, GROM_AUDIT, "README.md", "unlearning_report.json"]


def _resolve_folder(
    path_or_repo_id: str | os.PathLike, revision: str | None, token: Any, cache_dir: Any, local_files_only: bool
) -> Path:
    path = Path(path_or_repo_id).expanduser()
    if path.is_dir():
        return path
    if isinstance(path_or_repo_id, os.PathLike) or str(path_or_repo_id).startswith((".", "/", "~")):
        raise ValueError(f"GROM adapter folder {path_or_repo_id} does not exist.")
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(
        str(path_or_repo_id), revision=revision, token=token, cache_dir=cache_dir,
        local_files_only=local_files_only, allow_patterns=_HUB_FILES,
    ))


def _jsonable(obj: Any) -> Any:
    """A copy of ``obj`` that ``json.dumps(allow_nan=False)`` accepts: non-finite floats -> None, tensors -> lists,
    other unknown objects -> str. A mapping (a ``TOFUReport`` included) is written as its ``to_dict()`` / items."""
    to_dict = getattr(obj, "to_dict", None)
    if not isinstance(obj, dict) and callable(to_dict):
        obj = to_dict()
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, torch.Tensor):
        return _jsonable(obj.tolist())
    return str(obj)


def retain_subsample(num_rows: int, sample: int | None, seed: int) -> list[int]:
    """Sorted indices of the retain rows GROM reads for ``X_r X_r^T``.

    Every row when ``sample`` is None or ``>= num_rows``; otherwise ``sample`` rows drawn uniformly without
    replacement by ``torch.randperm`` on a generator seeded with ``seed`` (independent of the global RNG), so
    the same ``(num_rows, sample, seed)`` always reads the same rows, on every process.
    """
    if sample is None or sample >= num_rows:
        return list(range(num_rows))
    gen = torch.Generator().manual_seed(seed)
    return sorted(torch.randperm(num_rows, generator=gen)[:sample].tolist())


def _tokenize_rows(
    tokenizer: Any, rows: list[dict[str, Any]], max_length: int | None, limit: int | None,
    template: str | None, what: str,
) -> list[dict[str, Any]]:
    """:func:`~hf_unlearn.data.prepare_qa` of every row through ``template``, cut to ``min(max_length, limit)``
    tokens (prompt kept, answer cut); a prompt leaving no room for an answer token is refused, naming the
    example."""
    bounds = [v for v in (max_length, limit) if v is not None]
    cut = min(bounds) if bounds else None
    why = "the model's maximum positions" if cut is not None and cut == limit else "GROMConfig.max_length"
    try:
        return prepare_qa(rows, tokenizer, template=template, max_length=cut, truncation="answer")
    except PromptTooLongError as err:
        raise ValueError(
            f"{what} example {err.index}: {err.reason} (GROM cuts every example to {cut} tokens, {why})."
        ) from err.__cause__
    except ValueError as err:  # the template (e.g. 'chat' without a chat template), refused at the first example
        raise ValueError(f"{what} example 0: {err} (GROM cuts every example to {cut} tokens, {why}).") from err


def _rows(data: Any, what: str, allow_empty: bool = False) -> list[dict[str, Any]]:
    """The rows of ``data`` as dicts, each with string ``question`` and non-empty string ``answer`` fields; a
    ValueError naming the set, the row and the fix otherwise."""
    if isinstance(data, (str, bytes, Mapping)):
        raise ValueError(
            f"The {what} set must be a list of rows like {{'question': ..., 'answer': ...}} or a datasets.Dataset, "
            f"got a single {type(data).__name__}."
        )
    rows = []
    for i, r in enumerate(data if data is not None else []):
        if not isinstance(r, Mapping):
            raise ValueError(
                f"{what} row {i} is a {type(r).__name__} ({str(r)[:40]!r}), not a dict: GROM rows are TOFU-shaped "
                "dicts with 'question' and 'answer' fields (a list of dicts or a datasets.Dataset); pass documents "
                "as hf_unlearn.data.documents_dataset(texts), a path or [{'text': ...}, ...]."
            )
        missing = [k for k in ("question", "answer") if k not in r]
        if missing:
            raise ValueError(
                f"{what} row {i} has no {' / '.join(repr(k) for k in missing)} field; rows need 'question' and "
                f"'answer' fields; got {sorted(str(k) for k in r)}"
            )
        for k in ("question", "answer"):
            if not isinstance(r[k], str):
                raise ValueError(
                    f"{what} row {i}: {k!r} must be a string, got {type(r[k]).__name__} ({r[k]!r:.40}); fix the row."
                )
        if not r["answer"].strip():
            raise ValueError(
                f"{what} row {i} has an empty answer: it has no answer tokens to read; fill in or remove the row."
            )
        rows.append(dict(r))
    if not rows and not allow_empty:
        raise ValueError(f"The {what} set is empty.")
    return rows


def _check_disjoint(
    forget_rows: list[dict[str, Any]], retain_rows: list[dict[str, Any]], generic_rows: list[dict[str, Any]],
    docs: dict[str, list[str] | None],
) -> None:
    """Refuse forget examples (rows, or documents) that also occur in the retain set or in ``generic_retain``."""
    for what, rows in (("retain", retain_rows), ("generic_retain", generic_rows)):
        if docs["forget"] is not None and docs[what] is not None:
            overlap = shared_documents(docs["forget"], docs[what])
        else:
            overlap = overlapping_examples(forget_rows, rows) if forget_rows and rows else 0
        if overlap and what == "retain":
            raise ValueError(
                f"{overlap} forget examples also occur in the retain set; forget and retain must be disjoint."
            )
        if overlap:
            raise ValueError(
                f"{overlap} forget examples also occur in generic_retain; the general rows must not contain forget "
                "rows."
            )


def _batches(features: list[dict[str, Any]], ids: list[int], pad_id: int, batch_size: int):
    order = sorted(range(len(ids)), key=lambda j: len(features[ids[j]]["input_ids"]))
    for start in range(0, len(order), batch_size):
        chunk = [ids[j] for j in order[start : start + batch_size]]
        batch = collate_qa([features[i] for i in chunk], pad_id, "right")
        batch["example_ids"] = chunk
        yield batch


def _answer_token_counts(features: list[dict[str, Any]], vocab: int) -> torch.Tensor:
    tokens = [t for f in features for t in f["labels"][1:] if t != IGNORE_INDEX]
    return torch.bincount(torch.tensor(tokens, dtype=torch.long), minlength=vocab)[:vocab]


def _check_vocab(model: Any, tokenizer: Any, features: list[dict[str, Any]]) -> int:
    head = model.get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(model).__name__} has no output embeddings (LM head): GROM needs a causal LM.")
    vocab = vocab_size(model)  # from the config when the head is partitioned (ZeRO-3 / FSDP)
    if len(tokenizer) > vocab:
        raise ValueError(
            f"Tokenizer/model vocabulary mismatch: the tokenizer has {len(tokenizer)} tokens but the model's LM head "
            f"has {vocab} rows. Use the tokenizer the model was trained with."
        )
    top = max(max(f["input_ids"]) for f in features)
    if top >= vocab:
        raise ValueError(f"Token id {top} is outside the model's vocabulary ({vocab}): tokenizer/model mismatch.")
    return vocab


def select_targets(
    model: Any, config: GROMConfig
) -> tuple[list[TargetModule], list[TargetModule], list[TargetModule], list[int], int]:
    """The modules ``config`` edits in ``model``, checked without running it: ``(all targets, layered modules to
    edit or search, LM heads, candidate layers of layers='auto' (else []), band width)``. Raises a ValueError for
    unknown or unsuitable ``target_modules``, ``layers`` / ``candidate_layers`` without a target module, or a
    tied LM head without ``untie_lm_head``."""
    targets = find_target_modules(model, config.target_modules, allow_tied_head=config.untie_lm_head)
    layered = [t for t in targets if not t.is_lm_head]
    heads = [t for t in targets if t.is_lm_head]
    available = sorted({t.layer for t in layered})
    band = config.band_width(len(available))
    candidates: list[int] = []
    if config.layers != "auto":
        missing = [i for i in config.layers if i not in available]
        if layered and missing:
            raise ValueError(f"layers {missing} have no {config.target_modules} module; available layers: {available}")
        layered = [t for t in layered if t.layer in config.layers]
    elif layered:
        candidates = config.candidates(available)
        layered = [t for t in layered if t.layer in candidates]
    elif config.candidate_layers is not None:
        raise ValueError(f"candidate_layers={config.candidate_layers} but {config.target_modules} has no layered module.")
    return targets, layered, heads, candidates, band


@dataclass
class _Prepared:
    """Everything :func:`fit_grom` checks and tokenizes before its first forward pass."""

    targets: list[TargetModule]
    layered: list[TargetModule]
    heads: list[TargetModule]
    candidates: list[int]
    band: int
    retain_indices: list[int]
    forget_feats: list[dict[str, Any]]
    retain_feats: list[dict[str, Any]]
    generic_feats: list[dict[str, Any]]
    f_counts: torch.Tensor
    r_counts: torch.Tensor
    limit: int | None
    untied_lm_head: str | None


def _prepare(
    model: Any, tokenizer: Any, forget: Any, retain: Any, config: GROMConfig, generic_retain: Any
) -> _Prepared:
    if not isinstance(config, GROMConfig):
        raise ValueError(f"config must be a GROMConfig, got {type(config).__name__}")
    docs = {what: as_documents(data, plain_lists=False)
            for what, data in (("forget", forget), ("retain", retain), ("generic_retain", generic_retain))}
    forget_rows = _rows(forget, "forget") if docs["forget"] is None else []
    retain_rows = _rows(retain, "retain") if docs["retain"] is None else []
    generic_rows = (_rows(generic_retain, "generic_retain", allow_empty=True)
                    if generic_retain is not None and docs["generic_retain"] is None else [])
    if generic_retain is not None and not generic_rows and docs["generic_retain"] is None:
        raise ValueError("generic_retain is empty: pass general rows, or None for no general term.")
    _check_disjoint(forget_rows, retain_rows, generic_rows, docs)
    ensure_pad_token(tokenizer)
    targets, layered, heads, candidates, band = select_targets(model, config)
    untied = heads[0].name if heads and lm_head_is_tied(model) else None

    limit = model_max_positions(model)
    tpl = config.prompt_template

    def features(what: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if docs[what] is not None:  # every token of every chunk is predicted: every position is a key
            return chunk_documents(docs[what], tokenizer, chunk_length(config.max_length, limit))
        return _tokenize_rows(tokenizer, rows, config.max_length, limit, tpl, what)

    forget_feats = features("forget", forget_rows)
    if docs["retain"] is None:
        retain_indices = retain_subsample(len(retain_rows), config.retain_sample, config.seed)
        retain_feats = features("retain", [retain_rows[i] for i in retain_indices])
    else:  # documents: the sample is drawn over the chunks
        retain_feats = features("retain", [])
        retain_indices = retain_subsample(len(retain_feats), config.retain_sample, config.seed)
        retain_feats = [retain_feats[i] for i in retain_indices]
    generic_feats = features("generic_retain", generic_rows)
    if not forget_feats:
        raise ValueError("The forget documents make no chunk of two tokens or more: there are no forget keys.")
    vocab = _check_vocab(model, tokenizer, forget_feats + retain_feats + generic_feats)
    f_counts = _answer_token_counts(forget_feats, vocab)
    r_counts = _answer_token_counts(retain_feats, vocab)
    if int(f_counts.sum()) == 0:
        raise ValueError(
            "The forget set has no answer tokens (every label is -100, e.g. empty answers or max_length cutting "
            "them off): there are no forget keys to unlearn."
        )
    return _Prepared(targets, layered, heads, candidates, band, retain_indices, forget_feats, retain_feats,
                     generic_feats, f_counts, r_counts, limit, untied)


def check_grom_inputs(
    model: Any,
    tokenizer: Any,
    forget: Sequence[dict[str, Any]] | Any,
    retain: Sequence[dict[str, Any]] | Any,
    config: GROMConfig | None = None,
    generic_retain: Sequence[dict[str, Any]] | Any = None,
) -> dict[str, Any]:
    """Every precondition :func:`fit_grom` checks before its first forward pass, without running the model.

    Raises the ValueError ``fit_grom`` would raise: rows that are not dicts with string ``question`` and
    non-empty ``answer``, an empty or overlapping set, unknown or unsuitable ``target_modules``, layers or
    ``candidate_layers`` without a target module, a tied LM head without ``untie_lm_head``, a prompt that fills
    the context, a tokenizer/model vocabulary mismatch, no forget answer tokens. Call it before creating output
    folders. Returns a summary: the modules that can be edited (``"modules"``), the layers searched
    (``"candidate_layers"``, for ``layers="auto"``) and the row counts read.
    """
    prep = _prepare(model, tokenizer, forget, retain, config or GROMConfig(), generic_retain)
    return {
        "modules": [t.name for t in prep.layered + prep.heads],
        "candidate_layers": prep.candidates,
        "band_width": prep.band,
        "num_forget_rows": len(prep.forget_feats),
        "num_retain_rows_read": len(prep.retain_feats),
        "num_generic_rows": len(prep.generic_feats),
    }


def fit_grom(
    model: Any,
    tokenizer: Any,
    forget: Sequence[dict[str, Any]] | Any,
    retain: Sequence[dict[str, Any]] | Any,
    config: GROMConfig | None = None,
    generic_retain: Sequence[dict[str, Any]] | Any = None,
) -> GROMEdit:
    """Fit the closed-form GROM edit of ``model`` that unlearns ``forget`` while preserving ``retain``.

    ``forget`` / ``retain``: TOFU-shaped rows (``question``, ``answer``) as a list of dicts or a
    ``datasets.Dataset``, or documents (a list of strings, a path, a dataset with a ``text`` column:
    :func:`hf_unlearn.data.documents.as_documents`), cut into chunks of ``min(config.max_length, max positions)`` tokens
    (2048 when neither is set) where every token is predicted, so every chunk position is a key (the retain
    sample is then drawn over chunks). Every forget row is read; of the retain rows only ``config.retain_sample`` (a
    seeded uniform sample, :func:`retain_subsample`) feed ``X_r X_r^T``, the retain side of the layer
    attribution and the retain token frequencies of the specificity weights (the whole retain set is still
    checked to be disjoint from the forget set). ``generic_retain``: optional rows of general knowledge (any
    question/answer rows, e.g. the model's own answers to general questions), all read, whose keys form
    ``X_g X_g^T`` with weight ``config.generic_retain_weight`` in ``A`` (they do not enter the attribution or
    the specificity weights). Examples are cut to the model's maximum positions. Every precondition is checked
    before the first forward pass (:func:`check_grom_inputs`). Returns a :class:`GROMEdit`; ``model`` itself is
    not modified.
    """
    config = config or GROMConfig()
    start = time.perf_counter()
    prep = _prepare(model, tokenizer, forget, retain, config, generic_retain)
    layered, heads, band = prep.layered, prep.heads, prep.band
    forget_feats, retain_feats, generic_feats = prep.forget_feats, prep.retain_feats, prep.generic_feats
    f_counts = prep.f_counts
    alpha = specificity_weights(f_counts, prep.r_counts, config.specificity_power, config.specificity_smoothing,
                                config.specificity_smoothing_mode)

    distributed, rank, world = _dist()
    forget_ids = list(range(rank, len(forget_feats), world))
    retain_ids = list(range(rank, len(retain_feats), world))
    generic_ids = list(range(rank, len(generic_feats), world))
    pad_id = tokenizer.pad_token_id
    suppression = config.objective == "token_suppression"
    auto = config.layers == "auto" and bool(layered)

    def passes(key_modules: list[TargetModule], attribution: list[TargetModule]) -> dict[str, Any]:
        collector = KeyCollector(model, key_modules, attribution, suppression=suppression)
        roles = [("forget", forget_feats, forget_ids), ("retain", retain_feats, retain_ids)]
        if generic_feats and key_modules:
            roles.append(("generic", generic_feats, generic_ids))
        with collector:
            for role, feats, ids in roles:
                total = math.ceil(len(ids) / config.batch_size)
                collector.run(_batches(feats, ids, pad_id, config.batch_size), role, config.progress, total)
        return collector.finalize()

    was_training = model.training
    model.eval()
    try:
        scores: dict[int, dict[str, float]] = {}
        if auto and not _one_pass_affordable(model, layered, band, int(f_counts.sum()), config.max_stat_memory_gb):
            stats = passes([], layered)  # attribution pass, then a key pass over the chosen band only
            scores = attribution_scores(**_attr_args(stats))
            chosen = select_band({k: v["score"] for k, v in scores.items()}, band)
            layered = [t for t in layered if t.layer in chosen]
            stats = passes(layered + heads, [])
            passes_done = 2
        else:
            stats = passes(layered + heads, layered if auto else [])
            if auto:
                scores = attribution_scores(**_attr_args(stats))
                chosen = select_band({k: v["score"] for k, v in scores.items()}, band)
                layered = [t for t in layered if t.layer in chosen]
            passes_done = 1
    finally:
        model.train(was_training)
    edited = layered + heads
    records = stats["records"]
    if records["gold"].numel() == 0:
        raise ValueError("No forget keys were collected: the forget set has no answer tokens.")

    gold = records["gold"]
    alpha_t = alpha.to(gold.device)[gold]
    solutions, deltas, keys_out, targets_out = {}, {}, {}, {}
    for t in edited:
        keys = stats["forget_keys"][t.name]
        if suppression:
            w = records["w_logit"] if t.is_lm_head else records["w_resid"]
            d = suppression_targets(w.double(), records["margin"].double(), alpha_t, config.suppression_margin, len(edited))
        else:
            mean_norm = stats["out_norm_sum"][t.name] / keys.shape[0]
            direction = random_direction(t.module.out_features, config.seed + (t.layer or 0)).to(keys.device)
            d = corruption_targets(alpha_t.double(), direction, config.corruption_norm * mean_norm)
        if not bool(torch.isfinite(keys).all()) or not bool(torch.isfinite(d).all()):
            raise ValueError(
                f"GROM keys or targets of {t.name} are not finite (NaN/inf): the model's forward pass overflowed "
                "(e.g. a model in half precision) or suppression_margin / corruption_norm is too large. Load the "
                "model in float32 or lower them; nothing was solved."
            )
        sol = solve_grom(
            stats["retain_moment"][t.name], stats["num_retain"], keys, d,
            config.forget_weight, config.retain_weight, config.ridge,
            stats["generic_moment"].get(t.name), stats["num_generic"], config.generic_retain_weight,
        )
        if not bool(torch.isfinite(sol.delta).all()):
            raise ValueError(
                f"The GROM edit of {t.name} is not finite (NaN/inf): the solve overflowed with "
                f"suppression_margin={config.suppression_margin}, forget_weight={config.forget_weight}, "
                f"ridge={config.ridge}. Lower suppression_margin or forget_weight, or raise ridge."
            )
        solutions[t.name], keys_out[t.name], targets_out[t.name] = sol, keys, d
        deltas[t.name] = sol.delta.float().cpu()
    elapsed = time.perf_counter() - start
    return GROMEdit(
        config=config,
        deltas=deltas,
        solutions=solutions,
        forget_keys=keys_out,
        targets=targets_out,
        example_ids=records["example"].cpu(),
        num_forget_examples=len(forget_feats),
        layer_scores=scores,
        selected_layers=sorted({t.layer for t in layered}),
        stats={
            "num_forget_keys": int(gold.numel()),
            "num_retain_keys": stats["num_retain"],
            "num_retain_rows_read": len(retain_feats),
            "num_generic_keys": stats["num_generic"],
            "num_generic_rows_read": len(generic_feats),
            "candidate_layers": prep.candidates,
            "max_positions": prep.limit,
            "forward_passes_over_data": passes_done,
            "processes": world,
            "distributed": distributed,
            "mean_specificity": float(alpha_t.mean()),
            "mean_forget_margin": float(records["margin"].mean()) if suppression else None,
            "seconds": elapsed,
        },
        base_model_name_or_path=getattr(model.config, "_name_or_path", None) or None,
        base_fingerprint=base_fingerprint(model, [t.name for t in edited]),
        retain_indices=prep.retain_indices,
        untied_lm_head=prep.untied_lm_head,
    )


def _one_pass_affordable(
    model: Any, candidates: list[TargetModule], band: int, num_forget_keys: int, budget_gb: float
) -> bool:
    """Whether ``layers="auto"`` should collect keys of every candidate layer in the attribution pass (one pass
    over the data) rather than run an attribution pass and then a key pass over the chosen band only.

    One pass keeps, for every candidate layer, the float64 retain moment (``8 d_in^2`` bytes) and the float32
    forget keys (``4 s d_in`` bytes); it must fit in ``budget_gb``. It also spends ``2 d_in^2`` float64
    multiply-adds per retain key on every layer that will not be edited (counted twice, float64 being about half
    as fast as float32), which must cost less than half of the second forward pass it saves (``2 N`` float32
    flops per token for ``N`` parameters). TOFU-tiny (band 1 of 1 candidate) takes one pass; a 30-layer model
    with a 3-layer band takes two when all 30 layers are candidates (it takes one over the default 10 late
    candidates, whose extra moments cost less than the second pass).
    """
    stat_bytes = sum(8 * t.module.in_features**2 + 4 * num_forget_keys * t.module.in_features for t in candidates)
    if stat_bytes > budget_gb * 2**30:
        return False
    n_params = sum(p.numel() for p in model.parameters())
    unused = max(len(candidates) - band, 0) / max(len(candidates), 1)
    extra_flops_per_key = unused * sum(2 * 2 * t.module.in_features**2 for t in candidates)
    return extra_flops_per_key <= 0.5 * 2 * n_params


def _attr_args(stats: dict[str, Any]) -> dict[str, Any]:
    a = stats["attribution"]
    return {
        "forget_sums": a["forget"], "forget_count": a["forget_count"],
        "retain_sums": a["retain"], "retain_count": a["retain_count"],
    }
