"""Retain references with their provenance: :func:`load_retain_reference` reads a retain model's forget truth ratios,
model-utility components and MIA AUCs from our report or ``save_truth_ratios`` file, open-unlearning's
``TOFU_EVAL.json`` or TOFU's ``eval_log_forget.json`` (components as TOFU's ``aggregate_eval_stat.py``). Truth
ratios are ``exp(true_loss - mean(false_losses))`` (TOFU's files give the inverse; the KS test is the same either
way). :func:`check_provenance` refuses a known mismatch with an evaluation."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..jsonutil import read_json_file
from .report import TOFUReport, checked_truth_ratios

UTILITY_SPLITS = ("retain", "real_authors", "world_facts")
UTILITY_STATS = ("prob", "rouge_l", "truth_ratio")
COMPONENT_NAMES = tuple(f"{split}_{stat}" for split in UTILITY_SPLITS for stat in UTILITY_STATS)

# open-unlearning metric name -> our component name
OPEN_UNLEARNING_COMPONENTS = {
    "retain_Q_A_Prob": "retain_prob", "retain_Q_A_ROUGE": "retain_rouge_l",
    "retain_Truth_Ratio": "retain_truth_ratio", "ra_Q_A_Prob_normalised": "real_authors_prob",
    "ra_Q_A_ROUGE": "real_authors_rouge_l", "ra_Truth_Ratio": "real_authors_truth_ratio",
    "wf_Q_A_Prob_normalised": "world_facts_prob", "wf_Q_A_ROUGE": "world_facts_rouge_l",
    "wf_Truth_Ratio": "world_facts_truth_ratio",
}
OPEN_UNLEARNING_MIA = {"mia_loss": "loss", "mia_zlib": "zlib", "mia_min_k": "min_k", "mia_min_k_plus_plus": "min_k_plus_plus"}

# TOFU eval file -> our split
TOFU_FILES = {
    "eval_log.json": "retain", "eval_real_author_wo_options.json": "real_authors",
    "eval_real_world_wo_options.json": "world_facts",
}
TOFU_FORGET_FILE = "eval_log_forget.json"
TOFU_DS_SIZE = 300  # locuslab/tofu config/eval_everything.yaml: ds_size: 300

# Provenance fields compared between a reference and an evaluation (refused when both know them and differ).
COMPARED_FIELDS = ("forget_split", "num_rows", "data_sha256", "template", "tokenizer_sha256", "dtype")


@dataclass
class RetainReference:
    """A retain model's numbers and where they came from: ``forget_truth_ratios`` (per forget question, in row
    order), ``model_utility_components`` (the nine, or ``None``), ``mia_auc`` (by attack, when known) and
    ``provenance`` (what the source says about how they were made)."""

    forget_truth_ratios: np.ndarray
    model_utility_components: dict[str, float] | None = None
    provenance: dict[str, Any] = field(default_factory=dict)
    mia_auc: dict[str, float] | None = None

    @property
    def model_utility(self) -> float | None:
        """Harmonic mean of the nine components (through the ``tofu_model_utility`` module), or ``None``."""
        if self.model_utility_components is None:
            return None
        from . import metrics

        return metrics.model_utility([self.model_utility_components[k] for k in COMPONENT_NAMES])

    def summary(self) -> dict[str, Any]:
        """JSON-ready description recorded in reports (no per-example values)."""
        return {
            "provenance": dict(self.provenance), "num_rows": int(len(self.forget_truth_ratios)),
            "model_utility": self.model_utility,
            "mia_auc": None if self.mia_auc is None else dict(self.mia_auc),
        }


def _sha256(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=False, default=str).encode("utf-8")).hexdigest()


def rows_fingerprint(rows: Sequence[Mapping[str, Any]]) -> str:
    """sha256 of the evaluated rows' question, answer, paraphrased and perturbed answers, in order."""
    keys = ("question", "answer", "paraphrased_answer", "perturbed_answer")
    return _sha256([[r.get(k) for k in keys] for r in rows])


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """sha256 of the tokenizer's vocabulary (token -> id) and special tokens: equal for the same tokenizer
    saved in different folders, different for another vocabulary."""
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    special = sorted(str(t) for t in getattr(tokenizer, "all_special_tokens", []) or [])
    return _sha256([sorted(vocab.items()), special])


def _ratios(values: Any, origin: str) -> np.ndarray:
    return np.asarray(checked_truth_ratios({"forget_truth_ratios": list(values)}, origin), dtype=np.float64)


def _by_index(mapping: Mapping[str, Any], origin: str) -> list[Any]:
    """Values of a ``{"0": v0, "1": v1, ...}`` mapping in index order."""
    try:
        keys = sorted(mapping, key=lambda k: int(k))
    except (TypeError, ValueError):
        raise ValueError(f"{origin}: per-example values are not keyed by row index.") from None
    return [mapping[k] for k in keys]


def _from_ours(data: Mapping[str, Any], origin: str) -> RetainReference:
    """A retain reference from our report's dict form or a file of :func:`~hf_unlearn.evaluation.save_truth_ratios`."""
    values, components, mia = data.get("forget_truth_ratios"), data.get("components"), data.get("mia")
    if not isinstance(values, (list, tuple, np.ndarray)):
        raise ValueError(f"{origin} has no non-empty 'forget_truth_ratios' list.")
    ratios = _ratios(values, origin)
    whole = isinstance(components, Mapping) and all(k in components for k in COMPONENT_NAMES)
    components = {k: float(components[k]) for k in COMPONENT_NAMES} if whole else None
    auc = ({k: float(v) for k, v in mia["auc"].items() if v is not None}
           if isinstance(mia, Mapping) and isinstance(mia.get("auc"), Mapping) else None)
    top = {k: data[k] for k in ("source", "forget_split", "model_name") if data.get(k) is not None}
    provenance = {**(data.get("provenance") or {}), **top,  # top-level fields are authoritative
                  "format": "hf_unlearn", "num_rows": int(ratios.size)}
    return RetainReference(ratios, components, provenance, auc or None)


def _agg(value: Any) -> float | None:
    value = value.get("agg_value") if isinstance(value, Mapping) else value
    return None if value is None else float(value)


def _from_open_unlearning(data: Mapping[str, Any], origin: str) -> RetainReference:
    ftr = data.get("forget_truth_ratio")
    if not isinstance(ftr, Mapping) or not isinstance(ftr.get("value_by_index"), Mapping):
        raise ValueError(f"{origin} has no per-example 'forget_truth_ratio.value_by_index' (TOFU_SUMMARY.json keeps only aggregates); use the TOFU_EVAL.json written beside it.")
    rows = _by_index(ftr["value_by_index"], origin)
    ratios = _ratios([r["score"] if isinstance(r, Mapping) else r for r in rows], origin)
    values = {ours: _agg(data.get(theirs)) for theirs, ours in OPEN_UNLEARNING_COMPONENTS.items()}
    components = None if any(v is None for v in values.values()) else {k: values[k] for k in COMPONENT_NAMES}
    auc = {ours: _agg(data[theirs]) for theirs, ours in OPEN_UNLEARNING_MIA.items() if _agg(data.get(theirs)) is not None}
    provenance = {"format": "open-unlearning", "num_rows": int(ratios.size)}
    return RetainReference(ratios, components, provenance, auc or None)


def _tofu_truth_ratios(log: Mapping[str, Any], origin: str) -> np.ndarray:
    """``exp(avg_paraphrased_loss - mean(average_perturb_loss))`` per row (TOFU's files hold the losses)."""
    for key in ("avg_paraphrased_loss", "average_perturb_loss"):
        if not isinstance(log.get(key), Mapping):
            raise ValueError(f"{origin} lacks TOFU's per-example '{key}'.")
    para = np.asarray(_by_index(log["avg_paraphrased_loss"], origin), dtype=np.float64)
    pert = [np.asarray(v, dtype=np.float64).reshape(-1) for v in _by_index(log["average_perturb_loss"], origin)]
    if len(pert) != len(para):
        raise ValueError(f"{origin}: {len(para)} paraphrased losses but {len(pert)} perturbed-loss lists.")
    return _ratios(np.exp(para - np.array([p.mean() for p in pert])), origin)


def _tofu_components(logs: Mapping[str, Mapping[str, Any]], origin: str) -> dict[str, float]:
    """The nine components from TOFU's three non-forget logs, as ``aggregate_eval_stat.get_model_utility``."""
    out: dict[str, float] = {}
    for name, split in TOFU_FILES.items():
        log = logs[name]
        gt = np.asarray(_by_index(log["avg_gt_loss"], f"{origin}/{name}"), dtype=np.float64)
        if split == "retain":
            prob = float(np.mean(np.exp(-gt)))
        else:
            false = np.asarray(_by_index(log["average_perturb_loss"], f"{origin}/{name}"), dtype=np.float64)
            p_true = np.exp(-gt)
            prob = float(np.mean(p_true / (p_true + np.exp(-false).sum(axis=-1))))
        rouge = float(np.mean(np.asarray(_by_index(log["rougeL_recall"], f"{origin}/{name}"), dtype=np.float64)))
        tr = _tofu_truth_ratios(log, f"{origin}/{name}")
        out[f"{split}_prob"] = prob
        out[f"{split}_rouge_l"] = rouge
        out[f"{split}_truth_ratio"] = float(np.mean(np.maximum(0.0, 1.0 - tr)))
    return {k: out[k] for k in COMPONENT_NAMES}


def _from_tofu(logs: Mapping[str, Any], origin: str) -> RetainReference:
    ratios = _tofu_truth_ratios(logs[TOFU_FORGET_FILE], f"{origin}/{TOFU_FORGET_FILE}")
    components = _tofu_components(logs, origin) if all(isinstance(logs.get(n), Mapping) for n in TOFU_FILES) else None
    provenance: dict[str, Any] = {"format": "tofu", "num_rows": int(ratios.size)}
    if ratios.size == TOFU_DS_SIZE:
        provenance["max_examples"] = TOFU_DS_SIZE
    return RetainReference(ratios, components, provenance, None)


def _tofu_sibling_logs(folder: Path) -> dict[str, Any]:
    """TOFU's non-forget logs found in ``folder``, by file name."""
    return {name: read_json_file(folder / name) for name in TOFU_FILES if (folder / name).is_file()}


def _from_folder(folder: Path) -> RetainReference:
    if (folder / "TOFU_EVAL.json").is_file():
        return _from_open_unlearning(read_json_file(folder / "TOFU_EVAL.json"), str(folder / "TOFU_EVAL.json"))
    if (folder / TOFU_FORGET_FILE).is_file():
        logs = {TOFU_FORGET_FILE: read_json_file(folder / TOFU_FORGET_FILE), **_tofu_sibling_logs(folder)}
        return _from_tofu(logs, str(folder))
    found = sorted({p.parent for p in folder.rglob(TOFU_FORGET_FILE)} | {p.parent for p in folder.rglob("TOFU_EVAL.json")})
    if len(found) == 1:
        return _from_folder(found[0])
    if not found:
        raise FileNotFoundError(f"{folder} holds no retain reference: expected TOFU_EVAL.json (open-unlearning), {TOFU_FORGET_FILE} (TOFU) or a JSON report of hf-unlearn.")
    raise ValueError(f"{folder} holds several evaluation results ({', '.join(map(str, found))}); pass one of them.")


def _from_mapping(data: Mapping[str, Any], origin: str, folder: Path | None = None) -> RetainReference:
    if "forget_truth_ratios" in data:
        return _from_ours(data, origin)
    if "forget_truth_ratio" in data:
        return _from_open_unlearning(data, origin)
    if TOFU_FORGET_FILE in data and isinstance(data[TOFU_FORGET_FILE], Mapping):
        return _from_tofu(data, origin)
    if "avg_paraphrased_loss" in data and "average_perturb_loss" in data:
        return _from_tofu({TOFU_FORGET_FILE: data, **(_tofu_sibling_logs(folder) if folder else {})}, origin)
    raise ValueError(
        f"{origin} is not a retain reference this package reads: expected an hf-unlearn report "
        "('forget_truth_ratios'), open-unlearning's TOFU_EVAL.json ('forget_truth_ratio') or TOFU's "
        f"{TOFU_FORGET_FILE} ('avg_paraphrased_loss', 'average_perturb_loss')."
    )


def load_retain_reference(
    path: str | os.PathLike | Mapping[str, Any] | RetainReference,
) -> RetainReference:
    """A :class:`RetainReference` from a JSON file, a folder holding one, a report (typed or dict) or a
    ``RetainReference``; its provenance records ``format``, ``path`` and what the source says.
    ``FileNotFoundError``: no such file or no known result in the folder; ``ValueError``: invalid JSON, an unknown
    layout, truth ratios missing or not finite positive numbers."""
    if isinstance(path, RetainReference):
        return path
    if isinstance(path, TOFUReport):
        path = path.to_dict()
    if isinstance(path, Mapping):
        return _from_mapping(path, str(path.get("model_name") or "the report"))
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"retain_reference must be a path (file or folder), a TOFUReport, a report dict or a RetainReference; got {type(path).__name__}.")
    p = Path(path)
    if p.is_dir():
        ref = _from_folder(p)
    elif p.is_file():
        data = read_json_file(p)
        if not isinstance(data, Mapping):
            raise ValueError(f"{p} does not hold a JSON object.")
        ref = _from_mapping(data, str(p), folder=p.parent)
    else:
        raise FileNotFoundError(f"Retain reference not found: {p}.")
    ref.provenance.setdefault("path", str(p))
    return ref


def _comparable(key: str, value: Any) -> Any:
    if key == "template" and isinstance(value, Mapping):
        fields = dict(value.get("fields") or {})
        fields.pop("name", None)
        return {"kind": value.get("kind"), "fields": fields, "chat_template_sha256": value.get("chat_template_sha256")}
    return value


FIELD_LABELS = {"forget_split": "forget split", "num_rows": "forget rows", "data_sha256": "forget data (sha256)",
                "template": "prompt template", "tokenizer_sha256": "tokenizer vocabulary (sha256)", "dtype": "dtype"}


def check_provenance(
    reference: RetainReference, evaluation: Mapping[str, Any], fields: Sequence[str] = COMPARED_FIELDS
) -> list[str]:
    """Refuse (``ValueError`` naming every difference) a reference whose known provenance ``fields`` differ from
    the evaluation's; return the fields the reference does not record."""
    prov = reference.provenance
    mismatches, unknown = [], []
    for key in fields:
        ours = evaluation.get(key)
        theirs = prov.get(key)
        if theirs is None:
            unknown.append(key)
            continue
        if ours is None:
            continue
        if _comparable(key, theirs) != _comparable(key, ours):
            shown_theirs = theirs.get("template") if key == "template" and isinstance(theirs, Mapping) else theirs
            shown_ours = ours.get("template") if key == "template" and isinstance(ours, Mapping) else ours
            mismatches.append(f"{FIELD_LABELS.get(key, key)} {shown_theirs!r} (this evaluation: {shown_ours!r})")
    if mismatches:
        where = prov.get("path") or prov.get("model_name") or prov.get("format") or "the retain reference"
        raise ValueError(f"The retain reference ({where}) was made differently from this evaluation, so forget quality and privleak would compare unlike numbers. It was computed on {'; '.join(mismatches)}. Evaluate the retain model with the same data, forget split, max_examples, prompt template, tokenizer and dtype.")
    return unknown

