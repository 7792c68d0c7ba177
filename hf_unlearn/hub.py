"""Model cards and metric Spaces for unlearned artifacts.

- :func:`build_model_card` renders a ``hub_cards/<kind>.md`` template with
  ``huggingface_hub.ModelCard.from_template``: YAML metadata (``base_model``, ``library_name``,
  ``tags`` [``unlearning``, the method], ``datasets``, ``model-index`` with forget quality, model
  utility, forget ROUGE-L and forget truth ratio from the evaluator's report, as ``EvalResult`` s) and a
  body saying which forget split was removed, the method, its paper and settings, the quantization
  check and how to load it. :func:`trainer_model_card` is the card of the unlearning trainers'
  ``create_model_card`` (so ``trainer.push_to_hub(report=...)`` publishes the evaluator's numbers).
- :func:`push_unlearned` saves an artifact (weights + config + card + report) to a temporary
  folder and uploads it in ONE commit; it refuses, before anything is uploaded, a missing token
  and a report computed for another base model or forget split.
- :func:`push_metric_space` publishes an ``evaluate_metrics/<name>`` module as a Gradio Space so
  ``evaluate.load("<owner>/<name>")`` loads it from that Hub.

Artifact kinds live in :data:`ARTIFACT_KINDS`; adding one is one :func:`register_artifact_kind`
call (a template in ``hub_cards/`` plus the classes of the artifact and how to recognise a saved
folder). An in-memory artifact's kind is found with ``isinstance`` against those classes.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import hub_cards_dir, metric_path
from .registry import MethodView, method_for_artifact

__all__ = [
    "ARTIFACT_KINDS",
    "REPORT_METRICS",
    "ArtifactKind",
    "METHOD_PAPERS",
    "build_model_card",
    "check_report_matches",
    "detect_artifact_kind",
    "push_metric_space",
    "push_unlearned",
    "register_artifact_kind",
    "trainer_model_card",
]

#: Report keys written to the card's ``model-index``: key -> (metric type, pretty name).
REPORT_METRICS: dict[str, tuple[str, str]] = {
    "forget_quality": ("forget_quality", "Forget quality (KS-test p-value vs. retain model)"),
    "model_utility": ("model_utility", "Model utility"),
    "forget_rouge_l": ("rouge_l_recall", "Forget ROUGE-L recall"),
    "forget_truth_ratio": ("truth_ratio", "Forget truth ratio"),
}

#: Further report keys written to ``model-index`` when the report has them (open-unlearning's TOFU table, MU-ROUGE).
OPTIONAL_REPORT_METRICS: dict[str, tuple[str, str]] = {
    "mu_rouge": ("mu_rouge", "MU-ROUGE (harmonic mean of three ROUGE-L recalls)"),
    "extraction_strength": ("extraction_strength", "Forget extraction strength"),
    "exact_memorization": ("exact_memorization", "Forget exact memorization"),
    "mia_loss": ("mia_auc_loss", "MIA AUC (loss), forget vs holdout"),
    "mia_zlib": ("mia_auc_zlib", "MIA AUC (zlib), forget vs holdout"),
    "mia_min_k": ("mia_auc_min_k", "MIA AUC (min-k 40%), forget vs holdout"),
    "mia_min_k_plus_plus": ("mia_auc_min_k_plus_plus", "MIA AUC (min-k++ 40%), forget vs holdout"),
    "privleak": ("privleak", "Privleak (min-k AUC vs. retain model, %)"),
    # the attacks of hf_unlearn.evaluation.attacks (evaluate_tofu(..., attacks=...))
    "attack_nf4_forget_rouge_l": ("rouge_l_recall_nf4_attack", "Forget ROUGE-L recall after 4-bit NF4 quantization"),
    "attack_int8_forget_rouge_l": ("rouge_l_recall_int8_attack", "Forget ROUGE-L recall after 8-bit quantization"),
    "attack_nf4_recovered": ("recovered_fraction_nf4_attack", "Forget NLL gap recovered by 4-bit NF4 quantization"),
    "attack_int8_recovered": ("recovered_fraction_int8_attack", "Forget NLL gap recovered by 8-bit quantization"),
    "attack_relearn_forget_nll": ("forget_nll_relearn_attack", "Forget answer NLL after a relearning attack"),
    "attack_relearn_recovered": ("recovered_fraction_relearn_attack",
                                 "Forget NLL gap recovered by relearning on 10% of the forget rows"),
    "attack_benign_recovered": ("recovered_fraction_benign_finetune",
                                "Forget NLL gap recovered by benign fine-tuning on retain rows"),
}

#: Variables every card template must use (checked before rendering).
REQUIRED_TEMPLATE_FIELDS = ("card_data", "method", "forget_split", "repo_id", "base_model")

#: ``{method: title}`` of every registered method (read from :mod:`hf_unlearn.registry` on access).
METHOD_TITLES: Mapping[str, str] = MethodView(lambda info: info.title)

#: The paper of each registered method (``{"title", "id"}``, arXiv id), cited by every card; methods without a
#: paper to cite (GROM) are left out. Read from :mod:`hf_unlearn.registry` on access.
METHOD_PAPERS: Mapping[str, dict[str, str]] = MethodView(
    lambda info: dict(info.paper) if info.paper is not None else None, skip_none=True)

_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
_REPORT_SECTIONS = ("meta", "metadata", "config")


# ---------------------------------------------------------------------- artifact kinds
def _config_base(artifact: Any) -> str | None:
    config = getattr(artifact, "config", None)
    for name in ("base_model_name_or_path", "base_model", "_name_or_path"):
        value = getattr(config, name, None)
        if value:
            return str(value)
    return None


def _model_base(artifact: Any) -> str | None:
    """The base a model or PEFT adapter was made from (for a PEFT model, its adapter config's base)."""
    from peft import PeftModel

    if isinstance(artifact, PeftModel):
        return next(iter(artifact.peft_config.values())).base_model_name_or_path
    return _config_base(artifact)


def _grom_classes() -> tuple[type, ...]:
    from .grom.model import GROMEdit

    return (GROMEdit,)


def _t3_classes() -> tuple[type, ...]:
    from .t3.modeling import T3Classifier

    return (T3Classifier,)


def _model_classes() -> tuple[type, ...]:
    from peft import PeftModel
    from transformers import PreTrainedModel

    return (PreTrainedModel, PeftModel)


def _grom_settings(edit: Any) -> dict[str, Any]:
    return dict(edit.config.saved_dict())


def _t3_settings(head: Any) -> dict[str, Any]:
    keep = ("rank", "layer", "pooling", "temperature", "tilt_weight", "hidden_size", "vocab_size")
    return {k: getattr(head.config, k) for k in keep if getattr(head.config, k, None) is not None}


def _model_library(artifact: Any) -> str:
    from peft import PeftModel

    return "peft" if isinstance(artifact, PeftModel) else "transformers"


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}


def _folder_is_grom(folder: Path) -> bool:
    from .grom.peft_export import GROM_METADATA

    return (folder / "adapter_config.json").is_file() and (folder / GROM_METADATA).is_file()


def _folder_is_t3(folder: Path) -> bool:
    from .t3.config import T3ClassifierConfig

    return _read_json(folder / "config.json").get("model_type") == T3ClassifierConfig.model_type


@dataclass(frozen=True)
class ArtifactKind:
    """How one kind of unlearned artifact is carded and recognised.

    ``template``: file name in ``hub_cards/``. ``method``: the fixed method of this kind (``None``
    when the caller names it). ``classes``: returns the classes whose instances are of this kind
    (imported on call, so that importing this module stays light). ``library_name``: card metadata
    (a callable gets the artifact). ``base_model``: the base model an artifact was made from.
    ``settings``: default method settings read from the artifact. ``folder_matches``: recognises a
    saved folder by the files its ``save_pretrained`` writes.
    """

    name: str
    template: str
    method: str | None = None
    classes: Callable[[], tuple[type, ...]] = field(default=lambda: ())
    library_name: str | Callable[[Any], str] = "transformers"
    base_model: Callable[[Any], str | None] = _model_base
    settings: Callable[[Any], Mapping[str, Any]] = field(default=lambda artifact: {})
    folder_matches: Callable[[Path], bool] = field(default=lambda folder: False)

    def matches(self, artifact: Any) -> bool:
        return isinstance(artifact, self.classes())

    def library_for(self, artifact: Any) -> str:
        if callable(self.library_name):
            return self.library_name(artifact) if artifact is not None else "transformers"
        return self.library_name


#: Registered kinds, checked in insertion order by :func:`detect_artifact_kind` (the last one,
#: ``unlearned_model``, accepts any transformers model or PEFT model).
ARTIFACT_KINDS: dict[str, ArtifactKind] = {}


def register_artifact_kind(kind: ArtifactKind, *, before: str | None = "unlearned_model") -> None:
    """Add (or replace) an artifact kind; by default it is tried before the catch-all kind."""
    items = [(k, v) for k, v in ARTIFACT_KINDS.items() if k != kind.name]
    index = next((i for i, (k, _) in enumerate(items) if k == before), len(items))
    items.insert(index, (kind.name, kind))
    ARTIFACT_KINDS.clear()
    ARTIFACT_KINDS.update(items)


register_artifact_kind(ArtifactKind(
    "unlearned_model", "unlearned_model.md", None, _model_classes, _model_library, folder_matches=lambda f: True,
), before=None)
register_artifact_kind(ArtifactKind(
    "grom_adapter", "grom_adapter.md", "grom", _grom_classes, "peft",
    base_model=lambda edit: edit.base_model_name_or_path, settings=_grom_settings, folder_matches=_folder_is_grom,
))
register_artifact_kind(ArtifactKind(
    "t3_classifier", "t3_classifier.md", "t3", _t3_classes, "transformers", base_model=_config_base,
    settings=_t3_settings, folder_matches=_folder_is_t3,
))


def detect_artifact_kind(artifact: Any) -> str:
    """Name of the registered kind an artifact (object or saved folder) belongs to."""
    if isinstance(artifact, (str, os.PathLike)):
        folder = Path(artifact)
        if not folder.is_dir():
            raise ValueError(f"Artifact folder {folder} does not exist.")
        return next(name for name, kind in ARTIFACT_KINDS.items() if kind.folder_matches(folder))
    for name, kind in ARTIFACT_KINDS.items():
        if kind.matches(artifact):
            return name
    raise ValueError(
        f"Cannot push a {type(artifact).__name__}: expected a PreTrainedModel, a PEFT model, a GROMEdit, "
        "a T3Classifier or a saved folder."
    )


def _kind(kind: str) -> ArtifactKind:
    if kind not in ARTIFACT_KINDS:
        raise ValueError(f"Unknown artifact kind {kind!r}; registered kinds: {sorted(ARTIFACT_KINDS)}.")
    return ARTIFACT_KINDS[kind]


# ---------------------------------------------------------------------- reports
def _report_value(report: Mapping[str, Any], *names: str) -> Any:
    for name in names:
        if report.get(name) is not None:
            return report[name]
    for section in _REPORT_SECTIONS:
        sub = report.get(section)
        if isinstance(sub, Mapping):
            for name in names:
                if sub.get(name) is not None:
                    return sub[name]
    return None


def _same_model(a: str, b: str) -> bool:
    if a == b:
        return True
    if os.path.exists(a) and os.path.exists(b):
        return os.path.realpath(a) == os.path.realpath(b)
    return a.rstrip("/") == b.rstrip("/")


def _load_report(report: Mapping[str, Any] | str | os.PathLike | None) -> dict[str, Any] | None:
    if report is None:
        return None
    if isinstance(report, (str, os.PathLike)):
        path = Path(report)
        if not path.is_file():
            raise ValueError(f"Report file {path} does not exist.")
        try:
            report = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"Report file {path} is not valid JSON: {err}") from err
    if not isinstance(report, Mapping):
        raise ValueError(f"A report must be a dict or a JSON file, got {type(report).__name__}.")
    return dict(report)


def _has_key(report: Mapping[str, Any], key: str) -> bool:
    return key in report or any(
        isinstance(report.get(section), Mapping) and key in report[section] for section in _REPORT_SECTIONS
    )


def _metric_results(report: Mapping[str, Any]) -> list[tuple[str, str, str, float | None]]:
    """(report key, metric type, pretty name, value) for the four card metrics of a report.

    A metric the evaluator could not compute is ``None`` (forget quality without a retain
    reference) and is left out of ``model-index``; a key absent from the report is an error.
    """
    missing = [key for key in REPORT_METRICS if not _has_key(report, key)]
    if missing:
        raise ValueError(f"The report lacks {missing}; build_model_card needs {list(REPORT_METRICS)}.")
    rows = []
    optional = {k: v for k, v in OPTIONAL_REPORT_METRICS.items() if _has_key(report, k)}
    for key, (metric_type, pretty) in {**REPORT_METRICS, **optional}.items():
        raw = _report_value(report, key)
        if raw is None:
            rows.append((key, metric_type, pretty, None))
            continue
        try:
            value = float(raw)
        except (TypeError, ValueError) as err:
            raise ValueError(f"Report value {key}={raw!r} is not a number.") from err
        if not math.isfinite(value):
            raise ValueError(f"Report value {key}={raw!r} is not finite.")
        rows.append((key, metric_type, pretty, value))
    if all(row[3] is None for row in rows):
        raise ValueError(f"The report has no value for any of {list(REPORT_METRICS)}.")
    return rows


def check_report_matches(
    report: Mapping[str, Any], base_model: str | None, forget_split: str | None, *, aliases: tuple[str, ...] = ()
) -> None:
    """Refuse a report computed for another model or forget split than the artifact's.

    The report names the model it evaluated under ``base_model`` / ``base_model_name_or_path`` /
    ``model_name`` (the evaluator writes ``model_name``, the evaluated model's ``name_or_path``) and
    its split under ``forget_split``, at top level or in a ``meta``/``metadata``/``config`` section.
    The model must be ``base_model`` or one of ``aliases`` (other names of the base, or of the
    artifact itself, e.g. the folder it was saved to and reloaded from).
    """
    known = list(dict.fromkeys(str(m) for m in (base_model, *aliases) if m))
    for key in ("base_model", "base_model_name_or_path", "model_name"):
        named = _report_value(report, key)
        if named is not None and known and not any(_same_model(str(named), m) for m in known):
            raise ValueError(
                f"The report was computed for model {named!r} ({key}), but the artifact was made from base model "
                f"{' / '.join(repr(m) for m in known)}; refusing to publish mismatched numbers."
            )
    report_split = _report_value(report, "forget_split")
    if report_split is not None and forget_split is not None and str(report_split) != str(forget_split):
        raise ValueError(
            f"The report is for forget split {report_split!r}, but the artifact removed {forget_split!r}; "
            "refusing to publish mismatched numbers."
        )


def _quantization_rows(quantization: Mapping[str, Any]) -> dict[str, Any]:
    """Scalar entries of a quantization check; only the card metrics when it is a whole report."""
    scalars = {k: v for k, v in quantization.items() if v is None or isinstance(v, (str, int, float, bool))}
    if any(key in scalars for key in REPORT_METRICS):
        keep = (*REPORT_METRICS, "method", "quantization", "quant_type", "bits", "compute_dtype")
        scalars = {k: v for k, v in scalars.items() if k in keep}
    return {k: ("not computed" if v is None else v) for k, v in scalars.items()}


# ---------------------------------------------------------------------- model cards
def _template_path(kind: ArtifactKind, template_path: str | os.PathLike | None) -> Path:
    path = Path(template_path) if template_path is not None else Path(hub_cards_dir()) / kind.template
    if not path.is_file():
        raise ValueError(f"Model-card template {path} is missing (kind {kind.name!r}).")
    return path


def _check_template(path: Path, variables: Mapping[str, Any]) -> None:
    """Every required field is used and every used field is provided (StrictUndefined render)."""
    import jinja2
    import jinja2.meta

    text = path.read_text(encoding="utf-8")
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    try:
        used = jinja2.meta.find_undeclared_variables(env.parse(text))
    except jinja2.TemplateSyntaxError as err:
        raise ValueError(f"Model-card template {path} has a syntax error: {err}") from err
    absent = [name for name in REQUIRED_TEMPLATE_FIELDS if name not in used]
    if absent:
        raise ValueError(f"Model-card template {path} is missing the required field(s) {absent}.")
    unknown = sorted(name for name in used if name not in variables)
    if unknown:
        raise ValueError(f"Model-card template {path} uses {unknown}, which build_model_card does not provide.")
    try:
        env.from_string(text).render(**variables)
    except jinja2.UndefinedError as err:
        raise ValueError(f"Model-card template {path} uses a missing field: {err.message}.") from err


def _hub_id(name: str | None) -> str | None:
    """``name`` when it can be a Hub repo id (not a local path), else ``None``."""
    if not name or os.path.exists(name) or not _HUB_ID.match(name):
        return None
    return name


def build_model_card(
    kind: str,
    base_model: str,
    method: str | None = None,
    settings: Mapping[str, Any] | None = None,
    report: Mapping[str, Any] | str | os.PathLike | None = None,
    *,
    forget_split: str | None = None,
    dataset: str | None = None,
    quantization: Mapping[str, Any] | None = None,
    repo_id: str | None = None,
    library_name: str | None = None,
    license: str | None = None,
    template_path: str | os.PathLike | None = None,
    base_model_aliases: tuple[str, ...] = (),
    extra_tags: tuple[str, ...] = (),
    selection: Mapping[str, Any] | None = None,
):
    """Render the model card of an unlearned artifact.

    Args:
        kind: a key of :data:`ARTIFACT_KINDS` (``grom_adapter``, ``t3_classifier``, ``unlearned_model``).
        base_model: the model that was unlearned (Hub id or local path; only a Hub id goes to the metadata).
        method: unlearning method (fixed for ``grom_adapter``/``t3_classifier``, required otherwise).
        settings: the method's hyperparameters (shown in the card body).
        report: the evaluator's report (dict or JSON path); its ``forget_quality``, ``model_utility``,
            ``forget_rouge_l`` and ``forget_truth_ratio`` go to ``model-index``; its ``quantization``
            entry is used when ``quantization`` is not given.
        forget_split: the TOFU split that was forgotten (taken from the report when omitted).
        dataset: dataset the split comes from (Hub id, local folder or ``"synthetic"``; default:
            the report's ``source``, else ``locuslab/TOFU``).
        quantization: result of the 4-bit re-check (metric name -> value, plus e.g. ``method``).
        repo_id: where the card will live (used in the loading snippet and as model name).
        base_model_aliases: other names of the base model the report may use (e.g. the local
            folder of a base published as ``base_model``).
        extra_tags: further metadata tags (after ``unlearning``, the method, ``tofu`` and the kind).
        selection: a strength-selection record (:class:`hf_unlearn.selection.SelectionRecord` as a dict), shown
            as a section of the card body with every candidate's measurements and the decision.

    Returns:
        a ``huggingface_hub.ModelCard``.
    """
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    spec = _kind(kind)
    report = _load_report(report)
    if method is None:
        method = spec.method
    if not method:
        raise ValueError(f"Artifact kind {kind!r} needs a method name (e.g. {sorted(METHOD_TITLES)}).")
    if spec.method is not None and method != spec.method:
        raise ValueError(f"A {kind} artifact is made by method {spec.method!r}, not {method!r}.")
    if not base_model:
        raise ValueError("build_model_card needs the base model the artifact was made from.")
    if forget_split is None and report is not None:
        forget_split = _report_value(report, "forget_split")
    if dataset is None:
        dataset = (_report_value(report, "source") if report is not None else None) or "locuslab/TOFU"
    if not forget_split:
        raise ValueError("build_model_card needs the forget split (pass forget_split= or a report that has one).")
    if report is not None:
        check_report_matches(report, base_model, forget_split, aliases=base_model_aliases)
    if settings is not None and not isinstance(settings, Mapping):
        raise ValueError(f"settings must be a dict, got {type(settings).__name__}.")
    if quantization is None and report is not None and isinstance(report.get("quantization"), Mapping):
        quantization = report["quantization"]

    repo_id = repo_id or f"{Path(str(base_model)).name}-{method}-{forget_split}"
    model_name = repo_id.split("/")[-1]
    library = library_name or spec.library_for(None)
    hub_dataset = _hub_id(dataset) if dataset not in ("synthetic",) and "/" in str(dataset) else None
    results = _metric_results(report) if report is not None else []
    eval_results = [
        EvalResult(
            task_type="text-generation", task_name="Machine unlearning",
            dataset_type=hub_dataset or "tofu", dataset_name=f"TOFU ({forget_split})",
            dataset_config=forget_split, dataset_split="train",
            metric_type=metric_type, metric_name=pretty, metric_value=value,
        )
        for _, metric_type, pretty, value in results
        if value is not None
    ]
    card_data = ModelCardData(
        base_model=_hub_id(str(base_model)),
        library_name=library,
        license=license,
        tags=list(dict.fromkeys(["unlearning", method, "tofu", kind.replace("_", "-"), *extra_tags])),
        datasets=[hub_dataset] if hub_dataset else None,
        model_name=model_name if eval_results else None,
        eval_results=eval_results or None,
    )
    variables = dict(
        card_data.to_dict(),
        card_data=card_data.to_yaml(),
        kind=kind,
        repo_id=repo_id,
        model_name=model_name,
        base_model=str(base_model),
        method=method,
        method_title=METHOD_TITLES.get(method, method),
        paper=METHOD_PAPERS.get(method),
        forget_split=forget_split,
        dataset=str(dataset),
        settings=dict(settings or {}),
        results=[{"key": k, "type": t, "name": n, "value": v} for k, t, n, v in results],
        quantization=_quantization_rows(quantization) if quantization else None,
        library_name=library,
        is_peft=library == "peft",
    )
    path = _template_path(spec, template_path)
    _check_template(path, variables)
    render_kwargs = {k: v for k, v in variables.items() if k != "card_data"}
    card = ModelCard.from_template(card_data, template_path=str(path), **render_kwargs)
    if card.data.to_dict().get("tags") != card_data.tags:
        raise ValueError(f"Model-card template {path} does not write the card metadata block ({{{{ card_data }}}}).")
    if selection is not None:
        from .selection import SelectionRecord

        card.text = card.text.rstrip("\n") + "\n\n" + SelectionRecord.from_dict(selection).markdown()
    return card


# ---------------------------------------------------------------------- trainer cards
def _trainer_method(trainer: Any) -> str:
    """The method key of an unlearning trainer: its class's ``_method`` (most derived first, see
    :func:`hf_unlearn.registry.method_for_artifact`), else its config's objective."""
    method = method_for_artifact(trainer)
    if method is not None:
        return method
    forget_loss = getattr(trainer.args, "forget_loss", None)
    if forget_loss == "grad_ascent":
        return "grad_ascent" if getattr(trainer.args, "retain_loss", "none") == "none" else "grad_diff"
    return str(forget_loss or "unlearning")


def _trainer_settings(args: Any) -> dict[str, Any]:
    """The method's hyperparameters (the config's own fields, beyond TRL's ``SFTConfig``) and the budget."""
    import dataclasses

    from trl import SFTConfig

    base = {f.name for f in dataclasses.fields(SFTConfig)}
    budget = ("learning_rate", "num_train_epochs", "max_steps", "per_device_train_batch_size",
              "gradient_accumulation_steps", "seed")
    own = [f.name for f in dataclasses.fields(args) if f.name not in base and f.repr]
    settings = {name: getattr(args, name) for name in (*own, *budget)}
    return {k: v for k, v in settings.items() if v is None or isinstance(v, (str, int, float, bool))}


def trainer_model_card(
    trainer: Any,
    model_name: str | None = None,
    dataset_name: str | None = None,
    tags: str | list[str] | None = None,
    report: Mapping[str, Any] | str | os.PathLike | None = None,
    forget_split: str | None = None,
):
    """The model card of an unlearning trainer's model (what its ``create_model_card`` writes).

    The method (from the trainer's class) with its paper, the config's method settings and training budget,
    and, given the evaluator's ``report`` (dict or JSON path), its numbers in ``model-index``; the report
    must be for this trainer's base model (or its output folder). ``forget_split`` defaults to the report's,
    else ``dataset_name``. Tags: the trainer's TRL tags plus ``tags``.
    """
    report = _load_report(report)
    model = trainer.accelerator.unwrap_model(trainer.model) if hasattr(trainer, "accelerator") else trainer.model
    base_model = _model_base(model) or "unknown base model"
    if forget_split is None and report is not None:
        forget_split = _report_value(report, "forget_split")
    forget_split = forget_split or dataset_name or "custom forget set"
    repo_id = trainer.hub_model_id if getattr(trainer, "hub_model_id", None) else None
    repo_id = repo_id or model_name or Path(trainer.args.output_dir).name
    extra = [tags] if isinstance(tags, str) else list(tags or [])
    return build_model_card(
        "unlearned_model", base_model, _trainer_method(trainer), _trainer_settings(trainer.args), report,
        forget_split=forget_split, dataset=dataset_name, repo_id=repo_id, library_name=_model_library(model),
        base_model_aliases=(str(trainer.args.output_dir),), extra_tags=tuple([*trainer._tag_names, *extra]),
    )


# ---------------------------------------------------------------------- pushing
def _resolve_token(token: str | None) -> str:
    from huggingface_hub import get_token

    token = token or get_token()
    if not token:
        raise ValueError(
            "No Hugging Face token: pass token=..., set HF_TOKEN, or run `hf auth login`. Nothing was uploaded."
        )
    return token


def _check_repo_id(repo_id: str) -> None:
    if not isinstance(repo_id, str) or not _HUB_ID.match(repo_id):
        raise ValueError(f"Invalid repo id {repo_id!r}: expected 'name' or 'owner/name'.")


def _upload_folder_one_commit(
    folder: Path, repo_id: str, token: str, *, repo_type: str = "model", private: bool | None = None,
    space_sdk: str | None = None, commit_message: str, endpoint: str | None = None,
):
    """Create the repo if needed and upload every file of ``folder`` in a single commit."""
    from huggingface_hub import CommitOperationAdd, HfApi

    api = HfApi(endpoint=endpoint, token=token, library_name="hf-unlearn")
    url = api.create_repo(repo_id, private=private, repo_type=repo_type, space_sdk=space_sdk, exist_ok=True)
    operations = [
        CommitOperationAdd(path_in_repo=path.relative_to(folder).as_posix(), path_or_fileobj=str(path))
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    ]
    return api.create_commit(
        url.repo_id, operations, commit_message=commit_message, repo_type=repo_type, token=token
    )


def _save_artifact(artifact: Any, folder: Path) -> None:
    if isinstance(artifact, (str, os.PathLike)):
        src = Path(artifact)
        for path in src.rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.name != "README.md":
                (folder / path.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, folder / path.relative_to(src))
    else:
        artifact.save_pretrained(str(folder))
    pickled = [p.name for p in folder.rglob("*") if p.suffix in _PICKLE_SUFFIXES]
    if pickled:
        raise ValueError(f"Refusing to push pickle files {pickled}: hf-unlearn publishes safetensors only.")
    if not any(p.suffix == ".safetensors" for p in folder.rglob("*")):
        raise ValueError(f"The artifact wrote no .safetensors weights to {folder}; nothing to push.")


def push_unlearned(
    artifact: Any,
    repo_id: str,
    report: Mapping[str, Any] | str | os.PathLike | None = None,
    token: str | None = None,
    private: bool | None = None,
    *,
    kind: str | None = None,
    method: str | None = None,
    settings: Mapping[str, Any] | None = None,
    forget_split: str | None = None,
    dataset: str | None = None,
    base_model: str | None = None,
    quantization: Mapping[str, Any] | None = None,
    tokenizer: Any = None,
    license: str | None = None,
    commit_message: str | None = None,
    endpoint: str | None = None,
    selection: Mapping[str, Any] | None = None,
):
    """Push an unlearned artifact with its model card (and report) to the Hub in one commit.

    ``artifact`` is a ``GROMEdit``, a ``T3Classifier`` head, a model or PEFT adapter from a trainer, or
    a folder where one was saved. Its kind is detected (or pass ``kind=``). Refused before anything
    is uploaded: no token, a report for another base model or forget split, a report lacking the
    card metrics, a card template missing a field, an artifact saving pickle files.

    ``base_model`` overrides the base recorded in the artifact (e.g. the Hub id of a local base);
    the report must name one of the two. ``selection`` (default: the record the artifact carries, see
    :func:`hf_unlearn.selection.selection_record_of`) is shown in the card and uploaded as
    ``selection_record.json``. Returns the ``huggingface_hub.CommitInfo``.
    """
    _check_repo_id(repo_id)
    token = _resolve_token(token)
    kind = kind or detect_artifact_kind(artifact)
    spec = _kind(kind)
    report = _load_report(report)
    is_folder = isinstance(artifact, (str, os.PathLike))
    if is_folder:
        recorded = _folder_base(Path(artifact))
    else:
        recorded = spec.base_model(artifact)
    card_base = base_model or recorded
    if not card_base:
        raise ValueError(f"Cannot tell which base model this {kind} was made from; pass base_model=.")
    if forget_split is None and report is not None:
        forget_split = _report_value(report, "forget_split")
    aliases = tuple(str(m) for m in (recorded, *_own_names(artifact)) if m)
    if report is not None:
        check_report_matches(report, card_base, forget_split, aliases=aliases)
    if settings is None:
        settings = {} if is_folder else dict(spec.settings(artifact))
    if selection is None:
        from .selection import selection_record_of

        selection = selection_record_of(artifact)
    library = "peft" if is_folder and (Path(artifact) / "adapter_config.json").is_file() else None
    library = library or spec.library_for(None if is_folder else artifact)
    card = build_model_card(
        kind, card_base, method, settings, report, forget_split=forget_split, dataset=dataset,
        quantization=quantization, repo_id=repo_id, library_name=library, license=license,
        base_model_aliases=aliases, selection=selection,
    )
    with tempfile.TemporaryDirectory(prefix="hf-unlearn-push-") as tmp:
        folder = Path(tmp)
        _save_artifact(artifact, folder)
        if selection is not None:
            (folder / "selection_record.json").write_text(json.dumps(selection, indent=2, default=str))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(folder))
        card.save(str(folder / "README.md"))
        if report is not None:
            (folder / "unlearning_report.json").write_text(json.dumps(report, indent=2, default=str))
        message = commit_message or f"Upload {kind} ({card.data.tags[1]}, forgot {forget_split})"
        return _upload_folder_one_commit(
            folder, repo_id, token, private=private, commit_message=message, endpoint=endpoint
        )


def _own_names(artifact: Any) -> tuple[str, ...]:
    """Names the artifact itself goes by (the folder it was saved to / loaded from)."""
    if isinstance(artifact, (str, os.PathLike)):
        return (str(artifact),)
    names = [getattr(artifact, "name_or_path", None), getattr(getattr(artifact, "config", None), "_name_or_path", None)]
    return tuple(str(n) for n in names if n)


def _folder_base(folder: Path) -> str | None:
    for name, keys in (("adapter_config.json", ("base_model_name_or_path",)),
                       ("config.json", ("base_model_name_or_path", "base_model", "_name_or_path"))):
        data = _read_json(folder / name)
        for key in keys:
            if data.get(key):
                return str(data[key])
    return None


def push_metric_space(
    name: str,
    repo_id: str,
    token: str | None = None,
    private: bool | None = None,
    *,
    commit_message: str | None = None,
    endpoint: str | None = None,
):
    """Publish the ``evaluate_metrics/<name>`` module as a Gradio Space, in one commit.

    The Space's name must be the metric's name: ``evaluate.load("<owner>/<name>")`` downloads
    ``<name>.py`` from the Space ``<owner>/<name>``. Returns the ``huggingface_hub.CommitInfo``.
    """
    source = Path(metric_path(name))
    _check_repo_id(repo_id)
    if "/" not in repo_id or repo_id.split("/")[1] != name:
        raise ValueError(
            f"A metric Space must be named '<owner>/{name}' so evaluate.load('<owner>/{name}') finds "
            f"{name}.py; got {repo_id!r}."
        )
    token = _resolve_token(token)
    from huggingface_hub import RepoCard

    with tempfile.TemporaryDirectory(prefix="hf-unlearn-space-") as tmp:
        folder = Path(tmp)
        for path in source.iterdir():
            if path.is_file() and path.suffix not in (".pyc",):
                shutil.copy2(path, folder / path.name)
        if not (folder / "app.py").is_file():
            (folder / "app.py").write_text(
                "import evaluate\nfrom evaluate.utils import launch_gradio_widget\n\n"
                f"module = evaluate.load({repo_id!r})\nlaunch_gradio_widget(module)\n"
            )
        readme = folder / "README.md"
        card = RepoCard(readme.read_text(encoding="utf-8")) if readme.is_file() else RepoCard("---\n---\n")
        changed = False
        for key, value in (("sdk", "gradio"), ("app_file", "app.py")):
            if getattr(card.data, key, None) is None:
                card.data[key] = value
                changed = True
        tags = list(card.data.get("tags") or [])
        for tag in ("evaluate", "metric"):
            if tag not in tags:
                tags.append(tag)
                changed = True
        if changed:
            card.data["tags"] = tags
            card.save(str(readme))
        return _upload_folder_one_commit(
            folder, repo_id, token, repo_type="space", private=private, space_sdk="gradio",
            commit_message=commit_message or f"Upload the {name} metric", endpoint=endpoint,
        )
