"""Model cards of unlearned artifacts: :func:`build_model_card` renders a ``hub_cards/<kind>.md`` template
(``ModelCard.from_template``) with the metadata (``model-index`` from a TOFU or MUSE report) and a body naming the
forget split, the method (title and paper from :mod:`hf_unlearn.registry` unless given), its settings, the
quantization check and how to load it; :func:`trainer_model_card` is the trainers' ``create_model_card``.
"""

from __future__ import annotations

import html
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..artifact_kinds import _kind, _model_base, _model_library
from ..assets import hub_cards_dir
from ..registry import MethodView, method_for_artifact
from .push import _HUB_ID
from .reports import (
    _load_report,
    _metric_results,
    _quantization_rows,
    _report_entry,
    _report_value,
    check_report_matches,
)

#: Variables every card template must use (checked before rendering).
REQUIRED_TEMPLATE_FIELDS = ("card_data", "method", "forget_split", "repo_id", "base_model")

#: ``{method: title}`` of every registered method (read from :mod:`hf_unlearn.registry` on access).
METHOD_TITLES: Mapping[str, str] = MethodView(lambda info: info.title)

#: The paper of each registered method (``{"title", "id"}``, arXiv id), cited by every card; methods without a
#: paper to cite (GROM) are left out. Read from :mod:`hf_unlearn.registry` on access.
METHOD_PAPERS: Mapping[str, dict[str, str]] = MethodView(
    lambda info: dict(info.paper) if info.paper is not None else None, skip_none=True)


#: Characters no card field may carry into the body: line breaks and other control characters (a field could
#: otherwise start a new YAML block or markdown section).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _check_card_name(value: Any, what: str) -> str:
    """``value`` (``base_model``, ``repo_id``) as a Hub repo id or a local model name for the card: refused
    (``ValueError``) when it holds a line break or another control character, a backtick or a double quote
    (the card shows it in code and in Python string literals)."""
    text = str(value)
    if _CONTROL.search(text) or "`" in text or '"' in text:
        raise ValueError(f"{what}={text!r} is not a Hub repo id or a local model name: it holds a line break, a "
                         "control character, a backtick or a double quote, which a model card cannot show as written.")
    return text


def _inline(value: Any, cell: bool = False) -> str:
    """``value`` as text on one line of the card body: every run of whitespace (line breaks included) becomes one
    space, other control characters are dropped, backticks become ``'`` (the card shows values in code spans) and,
    in a table ``cell``, ``|`` is escaped."""
    text = _CONTROL.sub("", " ".join(str(value).split())).replace("`", "'")
    return text.replace("|", "\\|") if cell else text


#: Markdown's inline markup characters, backslash-escaped in running text (:func:`_text`).
_MARKDOWN_MARKUP = re.compile(r"([\\*_\[\]~|#!])")


def _text(value: Any) -> str:
    """``value`` as running text of the card body (not in a code span): :func:`_inline`, then ``&``, ``<`` and
    ``>`` as HTML entities (raw HTML such as ``<!--`` cannot hide the rest of the card) and Markdown's inline markup
    (``\\ * _ [ ] ~ | # !``) backslash-escaped, so the text renders as written."""
    return _MARKDOWN_MARKUP.sub(r"\\\1", html.escape(_inline(value), quote=False))


def _hub_id(name: str | None) -> str | None:
    """``name`` when it can be a Hub repo id (not a local path), else ``None``."""
    if not name or os.path.exists(name) or not _HUB_ID.match(name):
        return None
    return name


def build_model_card(
    kind: str, base_model: str, method: str | None = None, settings: Mapping[str, Any] | None = None,
    report: Mapping[str, Any] | str | os.PathLike | None = None, *, forget_split: str | None = None,
    dataset: str | None = None, quantization: Mapping[str, Any] | None = None, repo_id: str | None = None,
    library_name: str | None = None, license: str | None = None,
    template_path: str | os.PathLike | None = None, base_model_aliases: tuple[str, ...] = (),
    extra_tags: tuple[str, ...] = (), selection: Mapping[str, Any] | None = None, title: str | None = None,
    paper: Mapping[str, str] | None = None,
):
    """Render the model card (a ``huggingface_hub.ModelCard``) of an unlearned artifact.

    Args:
        kind: a key of :data:`~hf_unlearn.artifact_kinds.ARTIFACT_KINDS`.
        base_model: the model that was unlearned (only a Hub id goes to the metadata).
        method: unlearning method (fixed for a kind of one method's artifact, required otherwise).
        report: a TOFU or MUSE report (typed, its dict, or a JSON path): its figures go to ``model-index``, its
            ``quantization`` entry is the default ``quantization`` (the 4-bit re-check, metric name -> value).
        forget_split, dataset: default to the report's (``locuslab/TOFU`` without one).
        base_model_aliases: other names of the base model the report may use.
        selection: a :class:`hf_unlearn.selection.SelectionRecord` as a dict, shown as a section of the body.
        title, paper: the method's display name and ``{"title", "id"}`` paper (default: its registered ones).
    """
    spec = _kind(kind)
    muse = _muse_report(report)  # a MUSE report: MUSE figures in model-index and the evaluation section
    report = _load_report(muse.to_dict() if muse is not None else report)
    method = spec.method if method is None else method  # a kind of one method's artifact names it
    if not method:
        raise ValueError(f"Artifact kind {kind!r} needs a method name (e.g. {sorted(METHOD_TITLES)}).")
    if spec.method is not None and method != spec.method:
        raise ValueError(f"A {kind} artifact is made by method {spec.method!r}, not {method!r}.")
    base_model = _check_card_name(base_model, "base_model") if base_model else None
    if not base_model:
        raise ValueError("build_model_card needs the base model the artifact was made from.")
    if repo_id is not None:
        repo_id = _check_card_name(repo_id, "repo_id")
    if forget_split is None and report is not None:
        forget_split = _report_value(report, "forget_split") or ("forget" if muse is not None else None)
    if dataset is None:
        dataset = (_report_value(report, "source") if report is not None else None) or "locuslab/TOFU"
    if not forget_split:
        raise ValueError("build_model_card needs the forget split (pass forget_split= or a report that has one).")
    if report is not None:
        check_report_matches(report, base_model, forget_split, aliases=base_model_aliases)
    if settings is not None and not isinstance(settings, Mapping):
        raise ValueError(f"settings must be a dict, got {type(settings).__name__}.")
    if quantization is None and report is not None and isinstance(_report_entry(report, "quantization"), Mapping):
        quantization = _report_entry(report, "quantization")
    repo_id = repo_id or _inline(f"{Path(str(base_model)).name}-{method}-{forget_split}").replace('"', "'")
    library = library_name or spec.library_for(None)
    if muse is not None:  # MUSE's four criteria, else the TOFU report's card metrics (none without a report)
        from ..evaluation.muse_report import muse_card_results

        results = muse_card_results(muse)
    else:
        results = _metric_results(report) if report is not None else []
    card_data = _card_data(kind, base_model, method, dataset, forget_split, results, repo_id, library, license,
                           extra_tags, muse is not None)
    variables = _card_variables(card_data, kind, repo_id, base_model, method, title, paper, forget_split, dataset,
                                settings, results, quantization, library)
    path = Path(template_path) if template_path is not None else Path(hub_cards_dir()) / spec.template
    if not path.is_file():
        raise ValueError(f"Model-card template {path} is missing (kind {kind!r}).")
    card = _render(card_data, path, variables)
    if muse is not None:
        from ..evaluation.muse_report import muse_card_section

        # the MUSE section replaces the template's TOFU evaluation section (up to the next heading), or is appended
        section = muse_card_section(results, forget_split)
        pattern = re.compile(r"^## Evaluation \(TOFU[^\n]*\n.*?(?=^#|\Z)", re.S | re.M)
        if pattern.search(card.text):
            card.text = pattern.sub(lambda _: section + "\n", card.text, count=1)
        else:
            card.text = card.text.rstrip("\n") + "\n\n" + section
    if selection is not None:
        from ..selection import SelectionRecord

        card.text = card.text.rstrip("\n") + "\n\n" + SelectionRecord.from_dict(selection).markdown()
    return card


def _card_variables(card_data: Any, kind: str, repo_id: str, base_model: str, method: str, title: str | None,
                    paper: Mapping[str, str] | None, forget_split: str, dataset: str,
                    settings: Mapping[str, Any] | None, results: list, quantization: Mapping[str, Any] | None,
                    library: str) -> dict[str, Any]:
    """What the card template is rendered with: the front matter's fields, each text on one line, code-span text
    (method key, split, dataset, settings) by :func:`_inline` and running text (titles, names, quantization rows)
    by :func:`_text`."""
    paper = paper if paper is not None else METHOD_PAPERS.get(method)
    return dict(card_data.to_dict(), card_data=card_data.to_yaml(), kind=kind, repo_id=repo_id,
                model_name=_text(repo_id.split("/")[-1]), base_model=str(base_model), method=_inline(method),
                method_title=_text(title if title is not None else METHOD_TITLES.get(method, method)),
                paper=None if paper is None else {k: _text(v) for k, v in dict(paper).items()},
                forget_split=_inline(forget_split), dataset=_inline(dataset),
                settings={_inline(k, cell=True): _inline(v, cell=True) for k, v in (settings or {}).items()},
                results=[{"key": k, "type": t, "name": _text(n), "value": v} for k, t, n, v in results],
                quantization={_text(k): _text(v) for k, v in _quantization_rows(quantization).items()}
                if quantization else None,
                library_name=library, is_peft=library == "peft")


def _card_data(kind: str, base_model: str, method: str, dataset: str, forget_split: str, results: list,
               repo_id: str, library: str, license: str | None, extra_tags: tuple[str, ...], muse: bool) -> Any:
    """The card's front matter (``huggingface_hub.ModelCardData``): base model, library, tags, dataset and the
    ``model-index`` entries of ``results`` (``(key, type, name, value)``; ``None`` values left out)."""
    from huggingface_hub import EvalResult, ModelCardData

    hub_dataset = _hub_id(dataset) if dataset not in ("synthetic",) and "/" in str(dataset) else None
    benchmark = "muse" if muse else "tofu"
    eval_results = [
        EvalResult(task_type="text-generation", task_name="Machine unlearning",
                   dataset_type=hub_dataset or benchmark,
                   dataset_name=f"{'MUSE-News' if muse else 'TOFU'} ({forget_split})",
                   dataset_config=forget_split, dataset_split="train",
                   metric_type=metric_type, metric_name=pretty, metric_value=value)
        for _, metric_type, pretty, value in results
        if value is not None
    ]
    return ModelCardData(
        base_model=_hub_id(str(base_model)), library_name=library, license=license,
        tags=list(dict.fromkeys(["unlearning", method, benchmark, kind.replace("_", "-"), *extra_tags])),
        datasets=[hub_dataset] if hub_dataset else None,
        model_name=repo_id.split("/")[-1] if eval_results else None, eval_results=eval_results or None,
    )


def _render(card_data: Any, path: Path, variables: dict[str, Any]) -> Any:
    """The template at ``path`` rendered with ``variables``: refused unless it uses every required field, every
    field it uses is given (StrictUndefined render) and it writes the metadata block."""
    import jinja2
    import jinja2.meta
    from huggingface_hub import ModelCard

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
    render_kwargs = {k: v for k, v in variables.items() if k != "card_data"}
    card = ModelCard.from_template(card_data, template_path=str(path), **render_kwargs)
    if card.data.to_dict().get("tags") != card_data.tags:
        raise ValueError(f"Model-card template {path} does not write the card metadata block ({{{{ card_data }}}}).")
    return card


def _muse_report(report: Any) -> Any:
    """``report`` as a :class:`~hf_unlearn.evaluation.MUSEReport` when it is one (the object, its dict form or a
    JSON file of it), else ``None``."""
    from ..evaluation.muse_report import MUSEReport, is_muse_report

    if isinstance(report, (str, os.PathLike)) and Path(report).is_file():
        try:
            report = json.loads(Path(report).read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None  # _load_report names the problem
    if is_muse_report(report):
        return report if isinstance(report, MUSEReport) else MUSEReport.from_dict(report)
    return None


def _trainer_method(trainer: Any) -> str:
    """The method key of an unlearning trainer: its class's ``_method`` (most derived first, see
    :func:`hf_unlearn.registry.method_for_artifact`), else the method its config's objective is (the config's
    ``objective_name``), else ``"unlearning"``."""
    return method_for_artifact(trainer) or str(getattr(trainer.args, "objective_name", None) or "unlearning")


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
    trainer: Any, model_name: str | None = None, dataset_name: str | None = None,
    tags: str | list[str] | None = None, report: Mapping[str, Any] | str | os.PathLike | None = None,
    forget_split: str | None = None,
):
    """The model card an unlearning trainer's ``create_model_card`` writes: the trainer's method, its config's
    settings and budget, and a ``report`` for its base model (or output folder) in ``model-index``."""
    muse = _muse_report(report)
    report = muse.to_dict() if muse is not None else _load_report(report)
    model = trainer.accelerator.unwrap_model(trainer.model) if hasattr(trainer, "accelerator") else trainer.model
    base_model = _model_base(model) or "unknown base model"
    if forget_split is None and report is not None:
        forget_split = _report_value(report, "forget_split") or ("forget" if muse is not None else None)
    forget_split = forget_split or dataset_name or "custom forget set"
    repo_id = trainer.hub_model_id if getattr(trainer, "hub_model_id", None) else None
    repo_id = repo_id or model_name or Path(trainer.args.output_dir).name
    extra = [tags] if isinstance(tags, str) else list(tags or [])
    return build_model_card(
        "unlearned_model", base_model, _trainer_method(trainer), _trainer_settings(trainer.args), report,
        forget_split=forget_split, dataset=dataset_name, repo_id=repo_id, library_name=_model_library(model),
        base_model_aliases=(str(trainer.args.output_dir),), extra_tags=tuple([*trainer._tag_names, *extra]),
    )
