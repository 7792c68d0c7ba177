"""What a run would refuse, checked before any work and before any output folder is created: the model, the rows,
a resume's request, the output path, the retain reference, the evaluation's TOFU configs, the push target, and what
the method would refuse with this model and these rows. Each ends with one :class:`~hf_unlearn.options.UserError`
line naming the problem and the fix."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .options import UserError
from .registry import get_method

__all__ = [
    "TOKENIZER_FILES", "WEIGHT_FILES", "check_eval_configs", "check_push_target", "check_retain_reference",
    "check_no_remote_code", "check_output_parent", "check_resume_request", "check_run_preconditions",
    "load_model", "load_rows", "prompt_fits", "rows_from_spec", "run_request",
]

#: Files of which a saved model folder holds at least one (weights) / a saved tokenizer at least one.
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")


def _first_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= 200 else text[:197] + "..."


def _json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path`` (``{}`` when there is no such file)."""
    import json

    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(f"{path} cannot be read as JSON ({type(err).__name__}: {_first_line(err)}).") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} holds a JSON {type(data).__name__}, not an object.")
    return data


def check_no_remote_code(folder: str | os.PathLike) -> None:
    """Refuse a model folder that asks for its own code (an ``auto_map``, or a ``model_type``
    transformers does not know)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    folder = Path(folder)
    fix = "hf-unlearn never runs code shipped with a model; pass a model of an architecture transformers provides."
    for name in ("config.json", "tokenizer_config.json"):
        if "auto_map" in _json_object(folder / name):
            raise UserError(f"{folder / name} asks to run the model's own Python code (auto_map); {fix}")
    model_type = _json_object(folder / "config.json").get("model_type")
    if (folder / "config.json").is_file() and (not isinstance(model_type, str) or model_type not in CONFIG_MAPPING):
        raise UserError(f"{folder / 'config.json'} names model_type {model_type!r}, which transformers does not know "
                        f"(only the model's own code could build it); {fix}")


def load_model(name_or_path: str, device: str | None = None, dtype: Any = None) -> tuple[Any, Any]:
    """The causal LM and its tokenizer from a local folder or a Hub id (``trust_remote_code=False``), moved to
    ``device`` when given. Refused in one line, before any work: a missing folder (a local path is never looked up on
    the Hub), no model, no safetensors weights, a damaged weight file, no tokenizer, weights that do not fit the
    config or are not finite, a folder that asks to run its own code."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .model_files import check_weight_files, first_non_finite, loading_problems

    if local := os.path.isdir(name_or_path):  # config.json, readable safetensors weights and a tokenizer
        folder = Path(name_or_path)
        if not (folder / "config.json").is_file():
            kind = " (it holds a PEFT adapter, not a model)" if (folder / "adapter_config.json").is_file() else ""
            raise UserError(f"Model folder {name_or_path} has no config.json{kind}: pass a folder written by "
                            "model.save_pretrained() (with its tokenizer), or a Hub model id.")
        if not any((folder / name).is_file() for name in WEIGHT_FILES) and not any(folder.glob("*.safetensors")):
            raise UserError(f"Model folder {name_or_path} has no weights ({', '.join(WEIGHT_FILES[:3])}): save the model "
                            "into it with model.save_pretrained(folder), or pass the folder that holds the weights.")
        check_no_remote_code(folder)
        if not any((folder / name).is_file() for name in TOKENIZER_FILES):
            raise UserError(f"Model folder {name_or_path} has no tokenizer ({', '.join(TOKENIZER_FILES[:2])}): save "
                            "the model's tokenizer beside its weights with tokenizer.save_pretrained(folder).")
        try:
            check_weight_files(folder)
        except (ValueError, OSError) as err:
            raise UserError(" ".join(str(err).split())) from None
    else:  # a missing local path rather than a Hub id is refused
        from huggingface_hub.utils import HFValidationError, validate_repo_id

        if os.path.exists(name_or_path):
            raise UserError(f"{name_or_path} is a file, not a model folder; pass the folder that holds config.json "
                            "and the weights.")
        if name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1 or "\\" in name_or_path:
            raise UserError(f"Model folder {name_or_path} does not exist.")
        if "/" in name_or_path and os.path.isdir(first := name_or_path.split("/", 1)[0]):
            raise UserError(f"Model folder {name_or_path} does not exist ({first}/ is a local folder, so this is a "
                            "local path, not a Hub model id).")
        try:
            validate_repo_id(name_or_path)
        except HFValidationError:
            raise UserError(f"Model folder {name_or_path} does not exist, and it is not a valid Hub model id "
                            "either.") from None
    offline = "" if local else " Without network access, pass a local model folder."
    where = "" if local else f": there is no local folder {name_or_path} in {os.getcwd()}, and as a Hub model id it"
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            name_or_path, use_safetensors=True, output_loading_info=True, ignore_mismatched_sizes=True,
            trust_remote_code=False, **({} if dtype is None else {"dtype": dtype}))
    except (OSError, ValueError, RuntimeError) as err:
        cause = f"{err.__class__.__name__}: {_first_line(err)}"
        raise UserError(f"Could not load the model {name_or_path!r}{where} failed to load ({cause}).{offline}"
                        if where else f"Could not load the model {name_or_path!r} ({cause}).") from err
    if problems := loading_problems(info):
        raise UserError(f"The weights of {name_or_path} do not fit the model its config.json describes: {problems}; "
                        "pass the folder the model was saved into with model.save_pretrained(), with its own "
                        "config.json.")
    if (bad := first_non_finite(model)) is not None:
        raise UserError(f"The weights of {name_or_path} hold NaN or infinite values (first: {bad}); a model with "
                        "non-finite weights cannot be unlearned: restore the weights it was saved with.")
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=False)
    except (OSError, ValueError, TypeError) as err:
        raise UserError(
            f"Could not load the tokenizer of {name_or_path!r} ({err.__class__.__name__}: {_first_line(err)}); "
            "save the model's tokenizer beside its weights with tokenizer.save_pretrained(folder)." + offline
        ) from err
    if device is not None:
        model = model.to(device)
    return model, tokenizer


def check_retain_reference(path: str | None, forget_split: str, source: str | None = None,
                           max_examples: int | None = None) -> None:
    """The retain reference at ``path`` loads and was computed on ``forget_split``; with ``source``
    it has one forget truth ratio per evaluated forget row and, where it records them, the same rows."""
    if not path:
        return
    from .evaluation import load_retain_reference

    if not os.path.exists(path):
        raise UserError(f"Retain reference {path} does not exist.")
    try:
        reference = load_retain_reference(path)
    except (ValueError, OSError) as err:
        raise UserError(f"Retain reference {path} cannot be used: {err}") from None
    split = reference.provenance.get("forget_split")
    if split is not None and split != forget_split:
        raise UserError(f"Retain reference {path} was computed on {split!r}, not --forget-split {forget_split}.")
    if source is None:
        return
    from .data import load_tofu_rows
    from .evaluation.reference import check_provenance, rows_fingerprint

    try:
        rows = load_tofu_rows(f"{forget_split}_perturbed", source)
    except (ValueError, FileNotFoundError, OSError):
        return  # check_eval_configs names the configs that do not load
    rows = rows if max_examples is None else rows[:max_examples]
    n_ref = len(reference.forget_truth_ratios)
    if n_ref != len(rows):
        hint = " (TOFU's original protocol scores the first 300 rows: --max-examples 300 with `eval`)" if n_ref == 300 else ""
        raise UserError(f"Retain reference {path} has {n_ref} forget truth ratios but the evaluation scores "
                        f"{len(rows)} forget rows of {forget_split}_perturbed from {source}; evaluate the retain "
                        f"model on the same data, forget split and max_examples{hint}.")
    try:
        check_provenance(reference, {"forget_split": forget_split, "num_rows": len(rows),
                                     "data_sha256": rows_fingerprint(rows)}, ("forget_split", "num_rows", "data_sha256"))
    except ValueError as err:
        raise UserError(" ".join(str(err).split())) from None


def check_eval_configs(source: str, forget_split: str) -> None:
    """Every TOFU config the evaluator reads loads from ``source``."""
    from .data import load_tofu_rows
    from .evaluation.tofu_stats import evaluation_splits

    missing = []
    for spec in evaluation_splits(forget_split):
        try:
            load_tofu_rows(spec.config, source)
        except (ValueError, FileNotFoundError, ConnectionError, OSError) as err:
            missing.append(f"{spec.config} ({type(err).__name__})")
    if missing:
        raise UserError(f"The TOFU evaluation needs configs that cannot be loaded from data source {source}: "
                        f"{', '.join(missing)}.")


def check_push_target(repo_id: str | None, token: str | None) -> str | None:
    """``repo_id`` is a valid Hub id and a token exists; returns the token."""
    if not repo_id:
        return None
    from huggingface_hub import get_token
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise UserError(f"Invalid repo id {repo_id!r} for --push-to-hub: {' '.join(str(err).split())}") from None
    if not (token := token or get_token()):
        raise UserError("--push-to-hub needs a token: pass --hub-token, set HF_TOKEN or run `hf auth login`.")
    return token


def prompt_fits(tokenizer: Any, rows: list[dict[str, Any]], cut: int | None, why: str, template: Any, what: str,
                 every: bool) -> None:
    """With ``every``, each row leaves room for an answer token within ``cut`` tokens; otherwise at least one
    does (``why``: where the limit comes from)."""
    from .data import tokenize_qa

    if cut is None:
        return
    fix = "shorten the question" + (" or raise max_length" if why.startswith("max_length") else "")
    for i, row in enumerate(rows):
        try:
            tokenize_qa(tokenizer, row["question"], row["answer"], cut, template=template)
        except ValueError:
            if every:
                n = tokenize_qa(tokenizer, row["question"], row["answer"], None, template=template)["prompt_length"]
                raise UserError(f"{what} row {i}: its prompt alone is {n} tokens, which leaves no room for an answer "
                                f"token within {cut} tokens ({why}); {fix}.") from None
            continue
        if not every:
            return
    if not every:
        raise UserError(f"No {what} row leaves room for an answer token within {cut} tokens ({why}): the prompts "
                        f"alone fill it; {fix}s.")


def check_run_preconditions(method: str, config: Any, model: Any, tokenizer: Any, forget: list[dict[str, Any]],
                            retain: list[dict[str, Any]]) -> None:
    """What ``method`` would refuse during its run with this model and these rows: a template the
    tokenizer cannot render, the trainer's or config's own checks, forget/retain overlap (unless ``allow_overlap``),
    a forget row with no room for an answer token within ``max_length`` (capped by the model's positions), and the
    retain rows it reads not fitting."""
    from .data import model_max_positions, overlapping_examples, resolve_template

    template = getattr(config, "prompt_template", None)
    try:
        template = resolve_template(tokenizer, template)
    except (ValueError, TypeError) as err:
        raise UserError(f"Invalid {method} setting prompt_template: {' '.join(str(err).split())}") from None
    max_length, positions = getattr(config, "max_length", None), model_max_positions(model)
    bounds = [v for v in (max_length, positions) if v is not None]
    cut = min(bounds) if bounds else None
    why = f"max_length={max_length}" if cut is not None and cut == max_length else f"the model's {positions} positions"
    uses_retain, may_overlap = True, False
    info = get_method(method)
    trainer_cls = info.trainer_cls
    try:
        if trainer_cls is not None:
            trainer_cls._resolve_args(config, model)  # noqa: SLF001 (the trainer's own checks, without building it)
            uses_retain = trainer_cls.needs_retain(config)
            may_overlap = bool(getattr(config, "allow_overlap", False))
        elif hasattr(config, "check_for"):  # the config's own checks against the loaded model, without running it
            config.check_for(model)
    except (ValueError, TypeError) as err:
        raise UserError(f"Invalid {method} setting: {' '.join(str(err).split())}") from None
    if trainer_cls is not None:  # what the trainer needs of each forget row besides its question and answer
        try:
            trainer_cls.check_forget_rows(forget, config)
        except ValueError as err:
            raise UserError(f"{method}: {' '.join(str(err).split())}") from None
    if uses_retain and not may_overlap:
        if shared := overlapping_examples(forget, retain):
            allow = " (or pass --allow_overlap)" if trainer_cls is not None else ""
            raise UserError(f"{shared} of the {len(forget)} forget rows also occur in the retain rows: {method} would "
                            f"unlearn and keep them at once; remove them from one side{allow}.")
    if is_document_rows(forget) or is_document_rows(retain):
        return  # documents are cut into chunks of max_length tokens: no prompt to fit
    prompt_fits(tokenizer, forget, cut, why, template, "forget", every=True)
    rows_read = info.fit.retain_rows_read if info.fit is not None else None
    if rows_read is not None:  # a method that reads a sample of the retain rows cannot leave one of them out
        prompt_fits(tokenizer, rows_read(config, retain), cut, why, template, f"retain ({method}'s sample)",
                    every=True)
    elif uses_retain:
        prompt_fits(tokenizer, retain, cut, why, template, "retain", every=False)


def load_rows(split: str, source: str, file: str | None) -> list[dict[str, Any]]:
    """The rows of ``file`` (question/answer JSON Lines, or documents as ``{"text"}`` rows) or of TOFU config
    ``split``, checked as they load."""
    import stat

    from .data import load_tofu_rows, read_qa_file
    from .data.documents import DOCUMENT_FILE_SUFFIXES, load_documents

    try:
        if file and is_documents_file(file):
            if Path(file).is_dir() and not any(p.suffix.lower() in DOCUMENT_FILE_SUFFIXES for p in Path(file).iterdir()):
                raise UserError(f"Rows file {file} is a folder with no documents in it (.txt, .json or .jsonl files).")
            return [{"text": text} for text in load_documents(file)]
        if file:  # an existing regular file
            if not os.path.lexists(file):
                raise UserError(f"Rows file {file} does not exist.")
            if os.path.isdir(file):
                raise UserError(f"Rows file {file} is a folder; pass a JSON Lines file of question/answer rows (one "
                                "JSON object per line).")
            if not stat.S_ISREG(os.stat(file).st_mode):  # an OSError here is reported below
                raise UserError(f"Rows file {file} is not a regular file (a device, pipe or socket); pass a JSON "
                                "Lines file of question/answer rows.")
            return read_qa_file(file)
        return load_tofu_rows(split, source)
    except UserError:
        raise
    except ValueError as err:
        raise UserError(" ".join(str(err).split())) from None
    except OSError as err:
        if not file:
            raise
        raise UserError(f"Rows file {file} cannot be read ({type(err).__name__}: {_first_line(err)}).") from None


def is_documents_file(file: str | os.PathLike) -> bool:
    """Whether ``file`` holds documents: a folder, a ``.txt`` file, or a ``.json``/``.jsonl`` file whose
    first item is a string or an object with ``text`` and no ``question``."""
    import json

    path = Path(file)
    if path.is_dir() or path.suffix.lower() == ".txt":
        return True
    if path.suffix.lower() not in (".json", ".jsonl") or not path.is_file():
        return False
    try:
        with open(path, encoding="utf-8") as fh:
            head = next((line for line in fh if line.strip()), "")
        first = json.loads(head) if path.suffix.lower() == ".jsonl" else json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, StopIteration):
        return False  # read_qa_file names the problem
    if isinstance(first, list):
        first = first[0] if first else None
    return isinstance(first, str) or (isinstance(first, dict) and "text" in first and "question" not in first)


def is_document_rows(rows: Sequence[Any] | None) -> bool:
    """Whether ``rows`` are ``{"text"}`` rows as :func:`load_rows` returns documents."""
    return bool(rows) and all(isinstance(r, dict) and set(r) == {"text"} for r in rows)


def rows_from_spec(spec: str, source: str, flag: str) -> list[dict[str, Any]]:
    """The rows an option such as ``--holdout SPLIT_OR_FILE`` names: a rows file when ``spec`` looks like a
    path, else TOFU config ``spec``."""
    from .data import TOFU_CONFIGS

    is_file = os.path.lexists(spec) or "/" in spec or os.sep in spec or spec.endswith((".json", ".jsonl", ".txt"))
    if not is_file and spec not in TOFU_CONFIGS:
        raise UserError(f"{flag} {spec}: no such file, and not a TOFU config (holdout01/05/10, retain90, ...; known: "
                        f"{', '.join(sorted(TOFU_CONFIGS))}).")
    try:
        return load_rows(spec, source, spec if is_file else None)
    except UserError as err:
        raise UserError(f"{flag} {spec}: {err}") from None


def check_output_parent(output: str | os.PathLike | None) -> None:
    """The nearest existing path above ``output`` is a folder (checked before the lock file is made)."""
    if not output:
        return
    parent = next(p for p in Path(output).expanduser().absolute().parents if os.path.lexists(p))  # nearest first
    if not parent.is_dir():
        raise UserError(f"Output folder {output} cannot be written: {parent} is a file, not a folder.")


def run_request(method: str, config: Any, forget: Sequence[Any], retain: Sequence[Any]) -> dict[str, Any]:
    """What a trainer run is asked to do, known before the model loads: the method, the settings that change
    the weights and the digests of the rows (``"<count>:<SHA-256 of the rows as canonical JSON>"``)."""
    import hashlib
    import json

    from .methods.base.checkpoints import _tracked_settings

    digests = {}
    for name, rows in (("forget", forget), ("retain", retain)):
        text = json.dumps(list(rows), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        digests[name] = f"{len(rows)}:{hashlib.sha256(text.encode('utf-8')).hexdigest()}"
    return {"method": method, "settings": _tracked_settings(config), "data": digests}


def check_resume_request(folder: str | os.PathLike, request: dict[str, Any]) -> None:
    """Refuse resuming the run in ``folder`` with another method, settings or rows than its
    ``logs/run_request.json`` records (a folder without one is left to the trainer's checkpoint check)."""
    from .methods.base.checkpoints import RUN_REQUEST_NAME, fingerprint_differences

    path = Path(folder) / "logs" / RUN_REQUEST_NAME
    if not path.is_file():
        return
    try:
        saved = _json_object(path)
    except UserError as err:
        raise UserError(f"--resume: {err}") from None
    if diffs := fingerprint_differences(saved, request):
        shown = "; ".join(diffs[:6]) + (f"; and {len(diffs) - 6} more" if len(diffs) > 6 else "")
        raise UserError(f"--resume: the run in {folder} was started with another setting or other rows ({shown}); "
                        "resume it with its own method, settings and rows, or start afresh in another folder.")
