"""What a run would refuse, checked before any work and before any output folder is created.

Each check ends with one :class:`~hf_unlearn.options.UserError` line naming the problem and the fix: a model
folder without weights or tokenizer (:func:`load_model`), a rows file or TOFU config with a bad row
(:func:`load_rows`), a retain reference that is missing or made on other rows (:func:`check_retain_reference`),
TOFU configs the evaluator needs but the data source lacks (:func:`check_eval_configs`), an invalid repo id or a
missing token (:func:`check_push_target`), and what the method itself would refuse with this model and these
rows (:func:`check_run_preconditions`). ``hf-unlearn unlearn`` / ``eval`` and the per-method scripts run them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .options import TRAINER_CLASSES, UserError
from .registry import get_method

__all__ = [
    "TOKENIZER_FILES", "WEIGHT_FILES", "check_eval_configs", "check_push_target", "check_retain_reference",
    "check_run_preconditions", "load_model", "load_rows", "prompt_fits",
]

#: Files of which a saved model folder holds at least one (weights) / a saved tokenizer at least one.
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")


def _first_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= 200 else text[:197] + "..."


def load_model(name_or_path: str) -> tuple[Any, Any]:
    """The causal LM and its tokenizer from a local folder or a Hub id; one line naming the problem and the fix
    when the folder does not exist, is not a saved model, holds no weights or no tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    local = os.path.isdir(name_or_path)
    if not local and (name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1):
        raise UserError(f"Model folder {name_or_path} does not exist.")
    if local:
        folder = Path(name_or_path)
        if not (folder / "config.json").is_file():
            kind = " (it holds a PEFT adapter, not a model)" if (folder / "adapter_config.json").is_file() else ""
            raise UserError(
                f"Model folder {name_or_path} has no config.json{kind}: pass a folder written by "
                "model.save_pretrained() (with its tokenizer), or a Hub model id."
            )
        if not any((folder / name).is_file() for name in WEIGHT_FILES) and not any(folder.glob("*.safetensors")):
            raise UserError(
                f"Model folder {name_or_path} has no weights ({', '.join(WEIGHT_FILES[:3])}): save the model into it "
                "with model.save_pretrained(folder), or pass the folder that holds the weights."
            )
        if not any((folder / name).is_file() for name in TOKENIZER_FILES):
            raise UserError(
                f"Model folder {name_or_path} has no tokenizer ({', '.join(TOKENIZER_FILES[:2])}): save the model's "
                "tokenizer beside its weights with tokenizer.save_pretrained(folder)."
            )
    offline = "" if local else " Without network access, pass a local model folder."
    try:
        model = AutoModelForCausalLM.from_pretrained(name_or_path)
    except (OSError, ValueError) as err:
        raise UserError(
            f"Could not load the model {name_or_path!r} ({err.__class__.__name__}: {_first_line(err)}).{offline}"
        ) from err
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError, TypeError) as err:
        raise UserError(
            f"Could not load the tokenizer of {name_or_path!r} ({err.__class__.__name__}: {_first_line(err)}); "
            "save the model's tokenizer beside its weights with tokenizer.save_pretrained(folder)." + offline
        ) from err
    return model, tokenizer


def check_retain_reference(path: str | None, forget_split: str, source: str | None = None,
                           max_examples: int | None = None) -> None:
    """The retain reference loads (our report or saved ratios, open-unlearning's ``TOFU_EVAL.json``, TOFU's
    ``eval_log_forget.json`` or its results folder; :func:`~hf_unlearn.evaluation.load_retain_reference`) and,
    where it says so, was computed on ``forget_split``. With ``source`` (an evaluation will run): it has one
    forget truth ratio per evaluated forget row (the first ``max_examples`` rows of ``<forget_split>_perturbed``)
    and, where it records them, the same row count and rows."""
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
        raise UserError(
            f"Retain reference {path} has {n_ref} forget truth ratios but the evaluation scores {len(rows)} forget "
            f"rows of {forget_split}_perturbed from {source}; evaluate the retain model on the same data, forget "
            f"split and max_examples{hint}."
        )
    try:
        check_provenance(reference, {"forget_split": forget_split, "num_rows": len(rows),
                                     "data_sha256": rows_fingerprint(rows)}, ("forget_split", "num_rows", "data_sha256"))
    except ValueError as err:
        raise UserError(" ".join(str(err).split())) from None


def check_eval_configs(source: str, forget_split: str) -> None:
    """Every TOFU config the evaluator reads (``*_perturbed``, ``real_authors*``, ``world_facts*``) loads."""
    from .data import load_tofu_rows
    from .evaluation.tofu import evaluation_splits

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
    """``repo_id`` passes huggingface_hub's validator and a token exists; returns the token."""
    if not repo_id:
        return None
    from huggingface_hub import get_token
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise UserError(f"Invalid repo id {repo_id!r} for --push-to-hub: {' '.join(str(err).split())}") from None
    token = token or get_token()
    if not token:
        raise UserError("--push-to-hub needs a token: pass --hub-token, set HF_TOKEN or run `hf auth login`.")
    return token


def prompt_fits(tokenizer: Any, rows: list[dict[str, Any]], cut: int | None, why: str, template: Any, what: str,
                 every: bool) -> None:
    """With ``every``: each row of ``rows`` leaves room for an answer token within ``cut`` tokens (``why`` says
    where the limit comes from); otherwise at least one does. Raises :class:`UserError` naming the first row that
    does not (or the set)."""
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
    """What a method would refuse during its run, checked before any work and before any folder is created.

    For every method: the prompt template renders with this tokenizer, and every forget row leaves room for at
    least one answer token within ``max_length`` (the config's, cut to the model's maximum positions). Trainer
    methods: the trainer's own setting checks (preset, learning rate, steps), forget/retain overlap unless
    ``allow_overlap`` (when the objective uses the retain set), and at least one retain row that fits. GROM: no
    overlap, every ``target_modules`` entry names a module of the model, and the retain rows it reads fit. T3: no
    overlap, ``layer`` within the model's hidden states, and a retain row that fits.
    """
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
    try:
        if method in TRAINER_CLASSES:
            trainer_cls = get_method(method).load_trainer_class()
            trainer_cls._resolve_args(config, model)  # noqa: SLF001 (the trainer's own checks, without building it)
            uses_retain = trainer_cls.needs_retain(config)
            may_overlap = bool(getattr(config, "allow_overlap", False))
        elif method in ("t3", "grom"):  # the config's own checks against the loaded model, without running it
            config.check_for(model)
    except (ValueError, TypeError) as err:
        raise UserError(f"Invalid {method} setting: {' '.join(str(err).split())}") from None
    if uses_retain and not may_overlap:
        shared = overlapping_examples(forget, retain)
        if shared:
            allow = " (or pass --allow_overlap)" if method in TRAINER_CLASSES else ""
            raise UserError(f"{shared} of the {len(forget)} forget rows also occur in the retain rows: {method} would "
                            f"unlearn and keep them at once; remove them from one side{allow}.")
    prompt_fits(tokenizer, forget, cut, why, template, "forget", every=True)
    if method == "grom":  # GROM cannot leave out a retain row it samples
        from .methods.grom.model import retain_subsample

        sample = retain_subsample(len(retain), config.retain_sample, config.seed)
        prompt_fits(tokenizer, [retain[i] for i in sample], cut, why, template, "retain (GROM's sample)", every=True)
    elif uses_retain:
        prompt_fits(tokenizer, retain, cut, why, template, "retain", every=False)


def load_rows(split: str, source: str, file: str | None) -> list[dict[str, Any]]:
    """The rows of ``file`` (JSON Lines) or of TOFU config ``split``, checked as they load (one line naming the
    file or config and the row: a missing field, an empty, blank, null or non-string question or answer)."""
    from .data import load_tofu_rows, read_qa_file

    try:
        if file:
            if not os.path.isfile(file):
                raise UserError(f"Rows file {file} does not exist.")
            return read_qa_file(file)
        return load_tofu_rows(split, source)
    except ValueError as err:
        raise UserError(" ".join(str(err).split())) from None
