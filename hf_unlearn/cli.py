"""The `hf-unlearn` command line: `demo`, `unlearn`, `eval`, `bench` and `tiny`.

Console: one progress line per method and phase (training, evaluation, NF4 re-check), then the table. The
Trainer's per-step logs go to ``<output>/logs/<method>.jsonl`` (``--verbose`` also prints them).
Third-party chatter a user cannot act on (library log messages, progress bars, deprecation notices raised
inside transformers/TRL/PEFT/bitsandbytes) is silenced here, in the CLI only: importing ``hf_unlearn``
changes no global logging or warning state.

`unlearn` takes the method's own config fields as options, generated from its config dataclass with
:class:`transformers.HfArgumentParser` (``hf-unlearn unlearn --method masc --help`` lists every field).

``--data`` (``unlearn``, ``eval``, ``tiny``, ``bench``) defaults to the folder in ``$HF_UNLEARN_TOFU_DIR`` when
set, else the Hub dataset ``locuslab/TOFU``.

Bad input ends with one ``hf-unlearn: error: ...`` line and exit status 2, before any training step and before
any output folder is created: an unknown method or option, a value of the wrong type or one the method's config
refuses (for the trainers: a learning rate that is not a finite number > 0, zero or negative epochs,
``--max_steps 0``, a batch size below 1, ``--max_length`` below 2), an output folder that is unsafe or not
writable, a model folder without weights or without a tokenizer, a rows file or TOFU config with a missing,
empty, null or non-string question or answer, forget rows that also occur in the retain rows, a forget prompt
that leaves no room for an answer token, a prompt template the tokenizer cannot render, a T3 ``--layer`` outside
the model, a GROM ``--target_modules`` entry the model does not have, a retain reference that is missing,
unreadable or (with ``--eval``) made on other rows, TOFU configs that ``--eval`` needs but the data source lacks,
an invalid repo id, a missing token when pushing (:func:`check_run_preconditions` holds the checks that need the
model). A failure during a run prints one line naming the method, the phase and the log file (exit status 1).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import logging
import os
import shutil
import sys
import types
import typing
import warnings
from pathlib import Path
from typing import Any

from .registry import MethodView, get_method, method_names

DEFAULT_DEMO_DIR = "hf_unlearn_demo"

#: Third-party packages whose log messages, progress bars and warnings the CLI hides.
THIRD_PARTY = ("transformers", "trl", "peft", "accelerate", "bitsandbytes", "datasets", "huggingface_hub", "torch")

#: Config fields the CLI sets itself (``--output``, ``--resume``, ``--push-to-hub``) or that describe the base
#: model and are filled in from it: never options.
CLI_OWNED_FIELDS = frozenset({
    "output_dir", "resume_from_checkpoint", "push_to_hub", "hub_token", "overwrite_output_dir", "overwrite",
    "hidden_size", "vocab_size", "fit_report",
})

#: ``{method: trainer class name}`` of the registered methods trained by a trainer (read from
#: :mod:`hf_unlearn.registry` on access).
TRAINER_CLASSES: typing.Mapping[str, str] = MethodView(
    lambda info: info.trainer_class.rpartition(":")[2].rpartition(".")[2] if info.is_trainer else None, skip_none=True)


def method_help() -> str:
    """The ``--method`` help: the registered methods (:func:`hf_unlearn.registry.method_names`)."""
    names = method_names()
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else "".join(names)


class _UnlearnHelpFormatter(argparse.HelpFormatter):
    """Writes the ``--method`` help from the registry when the help is shown (the lookup imports the method
    packages, which the other commands do not need)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return method_help() if action.dest == "method" else super()._get_help_string(action)


class UserError(Exception):
    """A mistake in the command line or its inputs: reported as one line, exit status 2."""


class RunFailure(Exception):
    """A method failed during a phase: reported as one line (method, phase, log file), exit status 1.

    ``printed`` is true when the progress line already showed it (then :func:`main` prints nothing more)."""

    def __init__(self, message: str, printed: bool = False):
        super().__init__(message)
        self.printed = printed


class _ArgumentParser(argparse.ArgumentParser):
    """argparse that raises :class:`UserError` (one line) instead of printing usage and exiting."""

    def error(self, message: str) -> typing.NoReturn:
        raise UserError(message)


# ---------------------------------------------------------------------------------------------- console
class _DropMessages(logging.Filter):
    def __init__(self, *fragments: str):
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(f in record.getMessage() for f in self.fragments)


def quiet_console(verbose: bool = False) -> typing.Callable[[], None]:
    """Silence third-party noise for a CLI run (called by :func:`main`, never on import); returns a function that
    restores the previous state (``main`` calls it when the command ends).

    Hides: library log messages below ERROR and progress bars of transformers, datasets and huggingface_hub;
    bitsandbytes' notice that its optional CPU kernel package is missing; deprecation and user warnings
    whose origin is inside a third-party package. Warnings raised from hf_unlearn's own code stay visible.
    With ``verbose`` the library log messages are kept at WARNING.
    """
    import datasets
    import transformers
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    level = logging.WARNING if verbose else logging.ERROR
    saved_levels = {name: logging.getLogger(name).level for name in THIRD_PARTY}
    saved_filters = list(warnings.filters)
    saved = (transformers.utils.logging.get_verbosity(), transformers.utils.logging.is_progress_bar_enabled(),
             datasets.utils.logging.get_verbosity(), datasets.is_progress_bar_enabled(), are_progress_bars_disabled())
    drop = _DropMessages("Failed to load CPU gemm_4bit_forward")
    for name in THIRD_PARTY:
        logging.getLogger(name).setLevel(level)
    for name in ("bitsandbytes", "bitsandbytes.backends.cpu.ops"):
        logging.getLogger(name).addFilter(drop)
    pattern = r"^(" + "|".join(THIRD_PARTY) + r")(\.|$)"
    for category in (FutureWarning, DeprecationWarning, UserWarning):
        warnings.filterwarnings("ignore", category=category, module=pattern)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    transformers.utils.logging.set_verbosity(level)
    transformers.utils.logging.disable_progress_bar()
    datasets.utils.logging.set_verbosity(level)
    datasets.disable_progress_bars()
    disable_progress_bars()

    def restore() -> None:
        for name, old in saved_levels.items():
            logging.getLogger(name).setLevel(old)
        for name in ("bitsandbytes", "bitsandbytes.backends.cpu.ops"):
            logging.getLogger(name).removeFilter(drop)
        warnings.filters[:] = saved_filters
        warnings._filters_mutated()  # noqa: SLF001 (what warnings.catch_warnings does on exit)
        transformers.utils.logging.set_verbosity(saved[0])
        if saved[1]:
            transformers.utils.logging.enable_progress_bar()
        datasets.utils.logging.set_verbosity(saved[2])
        if saved[3]:
            datasets.enable_progress_bars()
        if not saved[4]:
            enable_progress_bars()

    return restore


# ------------------------------------------------------------------------------- config options per method
def method_config_class(method: str) -> type:
    """The config dataclass of ``method`` as registered (:mod:`hf_unlearn.registry`): the trainer's
    ``config_class``, ``GROMConfig`` or ``T3ClassifierConfig``."""
    try:
        config_class = get_method(method).load_config_class()
    except KeyError:
        config_class = None
    if config_class is None:
        raise UserError(f"Method {method!r} has no config class the CLI knows.")
    return config_class


def _resolved_hints(cls: type, names: list[str]) -> dict[str, Any]:
    """Resolved annotations of the fields ``names`` of ``cls`` (string annotations evaluated one by one)."""
    try:
        hints = typing.get_type_hints(cls)
        return {n: hints[n] for n in names}
    except Exception:  # a config base annotates a name its module does not import: resolve only our fields
        namespace = {**vars(sys.modules[cls.__module__])}
        for klass in cls.__mro__:
            namespace = {**vars(sys.modules[klass.__module__]), **namespace}
        out = {}
        for f in dataclasses.fields(cls):
            if f.name in names:
                out[f.name] = eval(f.type, namespace) if isinstance(f.type, str) else f.type  # noqa: S307
        return out


def option_fields(config_class: type) -> list[dataclasses.Field]:
    """The fields of ``config_class`` that become options: every init field except those the CLI owns and,
    for a ``PreTrainedConfig``, the generic fields every transformers config has."""
    if not dataclasses.is_dataclass(config_class):
        raise UserError(f"{config_class.__name__} is not a dataclass; cannot build its options.")
    skip = set(CLI_OWNED_FIELDS)
    try:
        from transformers import PreTrainedConfig

        if issubclass(config_class, PreTrainedConfig) and dataclasses.is_dataclass(PreTrainedConfig):
            skip |= {f.name for f in dataclasses.fields(PreTrainedConfig)}
    except ImportError:  # pragma: no cover
        pass
    return [f for f in dataclasses.fields(config_class)
            if f.init and f.name not in skip and not f.name.startswith("base_") and not f.name.startswith("_")]


def _is_list_type(hint: Any) -> bool:
    args = [a for a in typing.get_args(hint) if a not in (type(None), str)] if typing.get_args(hint) else [hint]
    if typing.get_origin(hint) is list:
        return True
    return typing.get_origin(hint) in (typing.Union, types.UnionType) and any(typing.get_origin(a) is list for a in args)


def options_dataclass(config_class: type) -> type:
    """A plain dataclass with the :func:`option_fields` of ``config_class`` (resolved types, same defaults and
    help): what :class:`~transformers.HfArgumentParser` turns into options. Configs whose own annotations it
    cannot resolve (a ``PreTrainedConfig`` such as ``T3ClassifierConfig``) parse through this too; build the
    config with ``config_class(**dataclasses.asdict(options))``."""
    selected = option_fields(config_class)
    hints = _resolved_hints(config_class, [f.name for f in selected])
    spec = []
    unset: set[str] = set()
    for f in selected:
        kwargs: dict[str, Any] = {"metadata": dict(f.metadata)}
        if _is_list_type(hints.get(f.name)) and f.default is not dataclasses.MISSING and not isinstance(
                f.default, (list, type(None))):
            # A list option whose default is not a list (GROM's layers="auto"): argparse would convert the default
            # with the element type, so the option defaults to None, which config_kwargs() leaves out.
            kwargs["default"] = None
            kwargs["metadata"]["help"] = f"{f.metadata.get('help', '')} (default when not given: {f.default!r})"
            unset.add(f.name)
        elif f.default is not dataclasses.MISSING:
            kwargs["default"] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            kwargs["default_factory"] = f.default_factory
        else:
            kwargs["default"] = None
        spec.append((f.name, hints.get(f.name, f.type), dataclasses.field(**kwargs)))
    return dataclasses.make_dataclass(f"{config_class.__name__}Options", spec,
                                      namespace={"_default_when_none": frozenset(unset)})


def config_kwargs(options: Any) -> dict[str, Any]:
    """The keyword arguments for the config from an :func:`options_dataclass` instance: every field, except
    an option left at None that stands for a non-list default (which the config then applies itself)."""
    skip = getattr(options, "_default_when_none", frozenset())
    return {k: v for k, v in dataclasses.asdict(options).items() if not (k in skip and v is None)}


def config_parser(method: str, config_class: type | None = None) -> argparse.ArgumentParser:
    """An :class:`~transformers.HfArgumentParser` with one option per field of the method's config."""
    from transformers import HfArgumentParser

    config_class = config_class or method_config_class(method)

    class _Parser(HfArgumentParser):
        def error(self, message: str) -> typing.NoReturn:
            raise UserError(f"{method}: {message}")

    parser = _Parser(options_dataclass(config_class), prog=f"hf-unlearn unlearn --method {method}",
                     allow_abbrev=False, add_help=False,
                     description=f"Options of {config_class.__name__} (the config of method {method!r}).")
    parser.config_class = config_class
    return parser


def parse_method_settings(method: str, argv: list[str], preset: dict[str, Any] | None = None) -> dict[str, Any]:
    """Method settings from ``argv`` (``--field value`` options of the method's config).

    Returns the ``preset`` (if any) updated with every option given on the command line (even one equal to the
    config's default), so the settings record exactly what was chosen. Unknown options and wrong types raise
    :class:`UserError`.
    """
    parser = config_parser(method)
    argv = _join_negative_values(list(argv))
    dests = {a.dest for a in parser._actions}
    preset = {k: v for k, v in (preset or {}).items() if k in dests}
    namespace, unknown = parser.parse_known_args(argv)
    if unknown:
        flags = [u for u in unknown if u.startswith("-")] or unknown
        names = [opt for a in parser._actions for opt in a.option_strings]
        hint = difflib.get_close_matches(flags[0].split("=", 1)[0], names, n=1)
        suggestion = f" (did you mean {hint[0]}?)" if hint else ""
        raise UserError(
            f"Unknown option {flags[0]} for method {method!r}{suggestion}; "
            f"`hf-unlearn unlearn --method {method} --help` lists its {parser.config_class.__name__} fields."
        )
    given = {arg.split("=", 1)[0] for arg in argv if arg.startswith("--")}
    chosen = {a.dest for a in parser._actions if given.intersection(a.option_strings)}
    values = vars(namespace)
    return {**preset, **{k: values[k] for k in chosen}}


def validate_settings(method: str, settings: dict[str, Any], output_dir: str | os.PathLike) -> Any:
    """Build the method's config from ``settings`` so that a bad value fails now (one line), not mid-run."""
    config_class = method_config_class(method)
    kwargs = dict(settings)
    if method in TRAINER_CLASSES:
        kwargs = {"output_dir": str(output_dir), "report_to": "none", "save_strategy": "no", **kwargs}
    elif method == "t3":
        kwargs = {k: v for k, v in kwargs.items() if k not in ("top_k",)}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return config_class(**kwargs)
    except (ValueError, TypeError) as err:
        raise UserError(f"Invalid {method} setting: {' '.join(str(err).split())}") from None


# ------------------------------------------------------------------------------------------- preconditions
#: Files of which a saved model folder holds at least one (weights) / a saved tokenizer at least one.
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")


def _first_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= 200 else text[:197] + "..."


def _load_model(name_or_path: str):
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


def _prompt_fits(tokenizer: Any, rows: list[dict[str, Any]], cut: int | None, why: str, template: Any, what: str,
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
    _prompt_fits(tokenizer, forget, cut, why, template, "forget", every=True)
    if method == "grom":  # GROM cannot leave out a retain row it samples
        from .grom.model import retain_subsample

        sample = retain_subsample(len(retain), config.retain_sample, config.seed)
        _prompt_fits(tokenizer, [retain[i] for i in sample], cut, why, template, "retain (GROM's sample)", every=True)
    elif uses_retain:
        _prompt_fits(tokenizer, retain, cut, why, template, "retain", every=False)


def _checkpoints(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("checkpoint-*") if p.is_dir()) if folder.is_dir() else []


def _load_rows(split: str, source: str, file: str | None) -> list[dict[str, Any]]:
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


# ---------------------------------------------------------------------------------------------- commands
def cmd_demo(args: argparse.Namespace) -> int:
    from .bench.registry import METHODS
    from .bench.report import write_results
    from .bench.runner import run_comparison
    from .bench.subjects import build_tiny_pair, recipe_for

    methods = args.methods or list(METHODS)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise UserError(f"Unknown method(s) {unknown}; choose from {', '.join(sorted(METHODS))}.")
    out = Path(args.output)
    print(f"hf-unlearn demo: synthetic fictitious authors, tiny Llama models, methods: {', '.join(methods)}")
    print(f"per-step training logs: {out / 'logs'}/<method>.jsonl")
    pair = _tiny_pair(build_tiny_pair, "synthetic", "forget10", recipe_for("test"), args.cache_dir)
    results = run_comparison(
        pair, methods, grid=False, source="synthetic", forget_split="forget10",
        eval_kwargs={"max_new_tokens": 40}, quantization_check=not args.no_quantization, progress=True,
        log_dir=out / "logs", verbose=args.verbose,
    )
    paths = write_results(results, out, "demo", {"source": "synthetic", "forget_split": "forget10", "mode": "demo"})
    print()
    print(paths["markdown"].read_text())
    print(f"Results: {paths['json']}  table: {paths['markdown']}  plot: {paths['png']}")
    return _report_failures(results, out / "logs")


def _tiny_pair(build, source, split, recipe, cache_dir):
    from .bench.console import PhaseReporter

    say = PhaseReporter()
    say.start("tiny models", "preparing")
    pair = build(source, split, recipe, cache_dir=cache_dir, progress=False)
    say.done("cached after the first run")
    return pair


def _report_failures(results: dict[str, Any], log_dir: Path) -> int:
    """Exit status of a comparison: 1 when a method failed (its progress line already named the phase and log)."""
    return 1 if any(r.get("error") for r in results["rows"].values()) else 0


def _unlearn_help(parser: argparse.ArgumentParser, method: str | None) -> int:
    from .bench.registry import METHODS

    print(parser.format_help())
    if method:
        print(config_parser(method).format_help())
    else:
        print("Method options: every field of the method's config is an option. List them with\n"
              "  hf-unlearn unlearn --method METHOD --help\n")
        for name in METHODS:
            try:
                cls = method_config_class(name)
            except UserError:
                continue
            print(f"  {name:12s} {cls.__module__}.{cls.__name__}")
    return 0


def _check_selection_flags(args: argparse.Namespace) -> None:
    """``--select`` needs ``--holdout``; ``--holdout`` / ``--retain-validation`` need ``--select`` (one line, before
    any work)."""
    if args.select and not args.holdout:
        raise UserError("--select needs --holdout SPLIT_OR_FILE: rows of the same kind the model never saw (TOFU's "
                        "holdout01/05/10, or a JSON Lines file of question/answer rows).")
    if not args.select and (args.holdout or args.retain_validation):
        raise UserError("--holdout and --retain-validation apply with --select only.")
    if args.select and args.selection_steps < 1:
        raise UserError(f"--selection-steps must be >= 1, got {args.selection_steps}.")


def _selection_setup(args: argparse.Namespace, forget: list[dict[str, Any]], retain: list[dict[str, Any]],
                     settings: dict[str, Any]) -> tuple[Any, list[dict[str, Any]]]:
    """The :class:`~hf_unlearn.selection.SelectionCriterion` of ``--select`` and the retain rows the method sees
    (without the validation rows when they are split off the retain rows)."""
    from .data.pairing import overlapping_examples
    from .selection import SelectionCriterion

    def rows(spec: str) -> list[dict[str, Any]]:
        return _load_rows(spec, args.data, spec if os.path.isfile(spec) else None)

    holdout = rows(args.holdout)
    if overlapping_examples(forget, holdout):
        raise UserError(f"--holdout {args.holdout} shares rows with the forget set; holdout rows must be unseen.")
    if args.retain_validation:
        validation = rows(args.retain_validation)
        if overlapping_examples(validation, retain):
            raise UserError(f"--retain-validation {args.retain_validation} shares rows with the retain rows the "
                            "method unlearns with; pass rows it does not see (or omit it to split them off).")
    else:
        if len(retain) < 2:
            raise UserError("--select splits validation rows off the retain rows, but there is only one; pass "
                            "--retain-validation.")
        n = max(1, min(100, len(retain) // 10))
        retain, validation = retain[:-n], retain[-n:]
    return SelectionCriterion(forget, holdout, validation, template=settings.get("prompt_template")), retain


def cmd_unlearn(args: argparse.Namespace, extra: list[str]) -> int:
    from .bench.console import PhaseReporter, log_event, log_exception
    from .bench.registry import METHODS, JsonlLogCallback, run_method
    from .data import RETAIN_FOR_FORGET
    from .safe_output import OutputDirError, atomic_directory, check_output_dir

    if args.help:
        return _unlearn_help(args.subparser, args.method)
    names = method_names()
    if not args.method:
        raise UserError(f"--method is required; choose from {', '.join(sorted(names))}.")
    if args.method not in names:
        raise UserError(f"Unknown method {args.method!r}; choose from {', '.join(sorted(names))}.")
    for flag, value in (("--model", args.model), ("--output", args.output)):
        if not value:
            raise UserError(f"{flag} is required.")
    _check_selection_flags(args)
    method = args.method
    preset = dict(METHODS[method].demo) if args.preset == "demo" and method in METHODS else {}
    settings = parse_method_settings(method, extra, preset)
    out = Path(args.output).expanduser()
    config = validate_settings(method, settings, out)
    is_trainer = method in TRAINER_CLASSES
    checkpointing = is_trainer and str(settings.get("save_strategy", "no")).lower().split(".")[-1] != "no"
    inputs = [args.model, args.data if args.data and os.path.isdir(args.data) else None,
              args.forget_file, args.retain_file]
    try:
        if args.resume:
            if not is_trainer:
                trainer_methods = [m for m in METHODS if m in TRAINER_CLASSES]
                trainer_methods += [m for m in TRAINER_CLASSES if m not in trainer_methods]
                raise UserError(f"--resume applies to trainer methods ({', '.join(trainer_methods)}), not {method}.")
            if not _checkpoints(out):
                raise UserError(f"--resume: no checkpoint-* folder in {out} to resume from.")
            check_output_dir(out, inputs, overwrite=True)
        else:
            if checkpointing and args.overwrite and out.is_dir() and any(out.iterdir()):
                raise UserError(f"With save_strategy={settings['save_strategy']} the run writes its checkpoints "
                                f"into {out}; choose an empty folder, or --resume a run that stopped.")
            check_output_dir(out, inputs, overwrite=args.overwrite)
    except OutputDirError as err:
        raise UserError(str(err)) from None
    forget = _load_rows(args.forget_split, args.data, args.forget_file)
    retain = _load_rows(RETAIN_FOR_FORGET[args.forget_split], args.data, args.retain_file)
    criterion, retain = _selection_setup(args, forget, retain, settings) if args.select else (None, retain)
    check_retain_reference(args.retain_reference, args.forget_split, args.data if args.eval else None)
    if args.eval:
        if args.max_new_tokens < 1:
            raise UserError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}.")
        check_eval_configs(args.data, args.forget_split)
    token = check_push_target(args.push_to_hub, args.hub_token)
    model, tokenizer = _load_model(args.model)
    check_run_preconditions(method, config, model, tokenizer, forget, retain)

    say = PhaseReporter(inline=not args.verbose)
    state: dict[str, Any] = {}

    def run(work: Path) -> None:
        log_path = work / "logs" / f"{method}.jsonl"
        state["log"] = log_path
        phase = "training"
        try:
            say.start(method, phase)
            options = dict(callbacks=[JsonlLogCallback(log_path, echo=args.verbose)], quiet=True,
                           resume_from_checkpoint=True if args.resume else None)
            if criterion is None:
                result = run_method(method, model, tokenizer, forget, retain, work, settings, **options)
            else:
                from .bench.registry import Unlearned
                from .selection import run_with_selection

                result = run_with_selection(run_method, Unlearned, method, model, tokenizer, forget, retain, work,
                                            settings, criterion, selection_steps=args.selection_steps, **options)
            state["result"] = result
            phase = "training (saving the result)"
            result.save_pretrained(work)
            if result.info.get("selection"):
                from .selection import SelectionRecord

                SelectionRecord.from_dict(result.info["selection"]).save(work)
            if result.weights_changed and result.artifact is result.model:
                tokenizer.save_pretrained(work)
            say.done(f"{result.info['global_step']} steps" if result.info.get("global_step") else "")
            log_event(log_path, "trained", method=method, seconds=result.seconds, settings=settings)
            if args.eval:
                from .evaluation import evaluate_tofu

                phase = "evaluation"
                say.start(method, phase)
                state["report"] = evaluate_tofu(
                    result.model, tokenizer, source=args.data, forget_split=args.forget_split,
                    retain_reference=args.retain_reference, scorer=result.scorer,
                    generation_kwargs=result.generation_kwargs, progress=args.verbose,
                    output_path=work / "tofu_report.json", max_new_tokens=args.max_new_tokens,
                    template=settings.get("prompt_template"),
                )
                say.done()
                if args.nf4_check and result.weights_changed:
                    from .bench.runner import nf4_check

                    phase = "NF4 re-check"
                    say.start(method, phase)
                    row: dict[str, Any] = {}
                    nf4_check(row, result, state["report"], tokenizer, args.data, args.forget_split,
                              {"max_new_tokens": args.max_new_tokens})
                    state["report"]["forget_rouge_l_nf4"] = row.get("forget_rouge_l_nf4")
                    say.done(f"forget ROUGE-L {row.get('forget_rouge_l_nf4'):.3f}")
        except Exception as err:
            log_exception(log_path, phase, err)
            state["failure"] = (phase, err)
            raise

    try:
        if checkpointing or args.resume:  # checkpoints must outlive an interrupted run: train in place
            out.mkdir(parents=True, exist_ok=True)
            run(out)
        else:
            with atomic_directory(out, overwrite=args.overwrite) as work:
                try:
                    run(work)
                except BaseException:
                    kept = out.parent / f"{out.name}.failed"  # keep the log (and anything written) to inspect
                    shutil.rmtree(kept, ignore_errors=True)
                    os.replace(work, kept)
                    state["log"] = kept / "logs" / f"{method}.jsonl"
                    raise
    except Exception as err:
        phase = state.get("failure", ("its run", err))[0]
        raise RunFailure(say.fail(err, state.get("log"), phase=phase), printed=True) from err

    result = state["result"]
    log_path = out / "logs" / f"{method}.jsonl"
    print(f"{method}: unlearned in {result.seconds:.1f}s, saved to {out}  (log: {log_path})")
    report = state.get("report")
    if report is not None:
        from .evaluation import format_report_table

        print(format_report_table({method: report}))
    if args.push_to_hub:
        say.start(method, "push")
        try:
            commit = result.push_to_hub(
                args.push_to_hub, report=report, token=token, forget_split=args.forget_split,
                dataset=args.data, base_model=args.model, selection=result.info.get("selection"),
                tokenizer=tokenizer if result.artifact is result.model else None,
            )
        except Exception as err:
            raise RunFailure(say.fail(err), printed=True) from err
        say.done(str(getattr(commit, "commit_url", commit)))
    return 0


AUTOCAST_CHOICES = ["none", "bfloat16", "float16"]
"""``--autocast-dtype`` / ``--eval-autocast`` values: ``evaluate_tofu``'s ``autocast_dtype`` options, ``none`` for ``None``."""


def _autocast_dtype(choice: str | None, default: str | None = None) -> str | None:
    """``evaluate_tofu``'s ``autocast_dtype`` from a CLI choice (``None``: the option was not given)."""
    choice = default if choice is None else choice
    return None if choice in (None, "none") else choice


def cmd_eval(args: argparse.Namespace) -> int:
    from .bench.console import PhaseReporter
    from .evaluation import evaluate_tofu, render_report, save_truth_ratios

    for name in ("batch_size", "max_new_tokens", "max_examples"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UserError(f"--{name.replace('_', '-')} must be >= 1, got {value}.")
    check_eval_configs(args.data, args.forget_split)
    check_retain_reference(args.retain_reference, args.forget_split, args.data, args.max_examples)
    for path in (args.output, args.save_truth_ratios):
        if path:
            target = Path(path).expanduser().resolve()
            if target.is_dir():
                raise UserError(f"{path} is a folder; give a file path for the JSON.")
            probe = target.parent
            while not probe.exists():
                probe = probe.parent
            if not os.access(probe, os.W_OK | os.X_OK):
                raise UserError(f"Cannot write {path}: {probe} is not writable.")
    attacks = _eval_attacks(args)
    model, tokenizer = _load_model(args.model)
    if args.attack_original:  # the model before unlearning: the attacks' recovered fractions
        original, _ = _load_model(args.attack_original)
        for options in attacks.values():
            options["original"] = original
    name = Path(args.model).name
    say = PhaseReporter(inline=not args.verbose)
    say.start(name, "evaluation" + (" and attacks" if attacks else ""))
    try:
        report = evaluate_tofu(
            model, tokenizer, source=args.data, forget_split=args.forget_split,
            retain_reference=args.retain_reference, batch_size=args.batch_size,
            max_new_tokens=args.max_new_tokens, max_examples=args.max_examples, output_path=args.output,
            progress=args.verbose, template=args.template,
            autocast_dtype=_autocast_dtype(args.autocast_dtype), attacks=attacks or None,
        )
    except Exception as err:
        raise RunFailure(say.fail(err), printed=True) from err
    say.done()
    if args.save_truth_ratios:
        save_truth_ratios(report, args.save_truth_ratios)
    print(render_report(report))
    if report.get("attacks"):
        from .evaluation import format_attacks

        print(format_attacks(report["attacks"]))
    return 0


def _eval_attacks(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """``evaluate_tofu``'s ``attacks`` from ``--attacks`` / ``--relearn-*``, checked before any model loads."""
    from .evaluation.attacks import check_attack_options, parse_attacks

    if not args.attacks:
        if args.attack_original:
            raise UserError("--attack-original needs --attacks.")
        return {}
    try:
        attacks = parse_attacks(args.attacks)
        if "relearn" in attacks:
            attacks["relearn"].update(steps=args.relearn_steps, learning_rate=args.relearn_lr)
        check_attack_options(attacks)
    except ValueError as err:
        raise UserError(str(err)) from None
    if args.relearn_lr < 0:
        raise UserError(f"--relearn-lr must be >= 0, got {args.relearn_lr}.")
    return attacks


def _bench_subject(args: argparse.Namespace, methods: list[str]) -> int:
    """``bench --subject NAME``: TOFU-small on a pretrained subject (:func:`hf_unlearn.bench.runner.run_subject_bench`)."""
    from .bench.report import markdown_table
    from .bench.runner import format_gate, run_subject_bench
    from .bench.subjects import SUBJECTS

    if args.subject not in SUBJECTS:
        raise UserError(f"Unknown subject {args.subject!r}; choose from tofu_tiny, {', '.join(sorted(SUBJECTS))}.")
    if args.model or args.retain_model or args.split != "forget10":
        raise UserError("--subject builds its own TOFU-small pair (forget10 authors); drop --model/--retain-model/--split.")
    eval_kwargs: dict[str, Any] = {"max_new_tokens": args.max_new_tokens}
    if args.max_examples is not None:
        eval_kwargs["max_examples"] = args.max_examples
    autocast = _autocast_dtype(args.eval_autocast, default="bfloat16")  # the subject is fine-tuned under bf16
    if autocast is not None:
        eval_kwargs["autocast_dtype"] = autocast
    results, paths = run_subject_bench(
        args.subject, methods, source=args.data, output_dir=args.output_dir, cache_dir=args.cache_dir,
        build_only=args.build_only, grid=not args.no_grid, eval_kwargs=eval_kwargs,
        quantization_check=not args.no_quantization, progress=True, verbose=args.verbose,
        attacks=args.attacks, layout=args.layout, bar=args.bar, resume=args.resume, select=args.select,
        selection_steps=args.selection_steps,
    )
    if paths is None:
        print(format_gate(results))
        print(f"target: {results['target']}\nretain reference: {results['retain_reference']}")
        return 0 if results["passed"] else 1
    print()
    print(markdown_table(results))
    print(format_gate(results["sanity_gate"]))
    print(f"Results: {paths['json']}  plot: {paths['png']}")
    return _report_failures(results, Path(args.output_dir) / "logs" / args.subject)


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench.registry import METHODS
    from .bench.report import write_results
    from .bench.runner import run_comparison
    from .bench.subjects import TinyPair, build_tiny_pair, recipe_for

    methods = args.methods or list(METHODS)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise UserError(f"Unknown method(s) {unknown}; choose from {', '.join(sorted(METHODS))}.")
    if args.attacks:
        from .evaluation.attacks import check_attack_options, parse_attacks

        try:
            check_attack_options(parse_attacks(args.attacks))
        except ValueError as err:
            raise UserError(str(err)) from None
    if args.subject not in (None, "tofu_tiny"):
        return _bench_subject(args, methods)
    if args.build_only:
        raise UserError("--build-only needs --subject (e.g. --subject smollm2-135m); for TOFU-tiny use `hf-unlearn tiny`.")
    if args.model:
        if not args.retain_model:
            raise UserError("--model needs --retain-model (the model fine-tuned on the retain split only).")
        pair = TinyPair(Path(args.model), Path(args.retain_model), args.data, args.split)
    else:
        pair = _tiny_pair(build_tiny_pair, args.data, args.split, recipe_for(args.size), args.cache_dir)
    out = Path(args.output_dir)
    eval_kwargs: dict[str, Any] = {"max_new_tokens": args.max_new_tokens, "max_examples": args.max_examples}
    autocast = _autocast_dtype(args.eval_autocast)
    if autocast is not None:
        eval_kwargs["autocast_dtype"] = autocast
    results = run_comparison(
        pair, methods, grid=not args.no_grid, source=args.data, forget_split=args.split,
        eval_kwargs=eval_kwargs,
        quantization_check=not args.no_quantization, progress=True, log_dir=out / "logs", verbose=args.verbose,
        attacks=args.attacks,
    )
    name = f"tofu_tiny_{args.split}" if not args.model else f"bench_{args.split}"
    meta = {"source": args.data, "forget_split": args.split, "size": args.size, "mode": "bench",
            "target": str(pair.target), "retain_reference_model": str(pair.retain), "seed": 0}
    paths = write_results(results, out, name, meta)
    print()
    print(paths["markdown"].read_text())
    print(f"Results: {paths['json']}  plot: {paths['png']}")
    return _report_failures(results, out / "logs")


def cmd_tiny(args: argparse.Namespace) -> int:
    from .bench.runner import format_gate, reference_rows, sanity_gate
    from .bench.subjects import build_tiny_pair, recipe_for
    from .evaluation import write_json_atomic

    pair = _tiny_pair(build_tiny_pair, args.data, args.split, recipe_for(args.size), args.cache_dir)
    target_report, retain_report = reference_rows(pair, args.data, args.split, {"max_examples": args.max_examples})
    gate = sanity_gate(target_report, retain_report)
    gate.update(target=str(pair.target), retain_reference=str(pair.retain), source=args.data, forget_split=args.split, size=args.size)
    write_json_atomic(gate, Path(pair.target) / "sanity_gate.json")
    print(format_gate(gate))
    print(f"target: {pair.target}\nretain reference: {pair.retain}")
    return 0 if gate["passed"] else 1


#: Environment variable naming a local folder of TOFU ``<config>.jsonl`` files: the default of ``--data``.
TOFU_DIR_ENV = "HF_UNLEARN_TOFU_DIR"
DATA_HELP = (f"TOFU source: a local folder of <config>.jsonl files, 'synthetic', or a Hub dataset id (default: "
             f"${TOFU_DIR_ENV} when set, else the Hub dataset locuslab/TOFU)")


def default_data_source() -> str:
    """``--data`` when not given: the folder in ``$HF_UNLEARN_TOFU_DIR`` when set, else the Hub id ``locuslab/TOFU``."""
    from .data import TOFU_HUB_ID

    folder = os.environ.get(TOFU_DIR_ENV, "").strip()
    if not folder:
        return TOFU_HUB_ID
    if not os.path.isdir(os.path.expanduser(folder)):
        raise UserError(f"{TOFU_DIR_ENV}={folder} is not a folder; point it at a folder of TOFU <config>.jsonl files, "
                        "or unset it to use the Hub dataset.")
    return os.path.expanduser(folder)


def _join_negative_values(argv: list[str]) -> list[str]:
    """``--option -1e-3`` as ``--option=-1e-3``: argparse reads a token such as ``-1e-3`` or ``-inf`` as an option,
    so the value of a negative number would be missing; joined, it parses and the config can refuse it clearly."""
    out: list[str] = []
    for token in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and token.startswith("-") and len(token) > 1:
            try:
                float(token)
            except ValueError:
                pass
            else:
                out[-1] = f"{out[-1]}={token}"
                continue
        out.append(token)
    return out


RETAIN_REFERENCE_HELP = (
    "the retain model's numbers for forget quality: our report or saved truth ratios, open-unlearning's "
    "TOFU_EVAL.json, or TOFU's eval_log_forget.json (or its results folder)"
)


def build_parser() -> argparse.ArgumentParser:
    from .data import FORGET_SPLITS
    from .data.prompts import PROMPT_TEMPLATES
    from .evaluation.generation import DEFAULT_MAX_NEW_TOKENS
    from .evaluation.report import metric_definitions_text

    parser = _ArgumentParser(prog="hf-unlearn", allow_abbrev=False,
                             description="Machine unlearning for causal LMs on the Hugging Face stack.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_ArgumentParser)

    def add(name: str, **kwargs: Any) -> argparse.ArgumentParser:
        return sub.add_parser(name, allow_abbrev=False, **kwargs)

    demo = add("demo", help="every method on the embedded synthetic set with tiny models (offline)")
    demo.add_argument("--output", default=DEFAULT_DEMO_DIR, help="folder for demo.json / demo.md / demo.png and logs/")
    demo.add_argument("--methods", nargs="+", help="subset of methods (default: all)")
    demo.add_argument("--cache-dir", default=None, help="model cache (default $HF_UNLEARN_CACHE or ~/.cache/hf_unlearn)")
    demo.add_argument("--no-quantization", action="store_true", help="skip the 4-bit NF4 re-check")
    demo.add_argument("--verbose", action="store_true", help="also print the per-step training logs")
    demo.set_defaults(func=cmd_demo)

    un = add("unlearn", add_help=False, formatter_class=_UnlearnHelpFormatter, help="unlearn a forget split from a model and save the result",
             description="Unlearn a forget split and save the method's native artifact (weights, LoRA adapter or "
                         "T3 head). Every field of the method's config is also an option: "
                         "`hf-unlearn unlearn --method METHOD --help` lists them.")
    un.add_argument("-h", "--help", action="store_true", help="show this help (with --method: its config options)")
    un.add_argument("--method", help="the registered methods (hf_unlearn.registry)")
    un.add_argument("--model", help="model folder or Hub id")
    un.add_argument("--data", default=None, help=DATA_HELP)
    un.add_argument("--forget-split", default="forget10", choices=FORGET_SPLITS)
    un.add_argument("--forget-file", help="JSON Lines file of question/answer rows to forget (instead of --forget-split)")
    un.add_argument("--retain-file", help="JSON Lines file of question/answer rows to keep (instead of the retain split)")
    un.add_argument("--output", help="output folder (refused when it overlaps the model folder)")
    un.add_argument("--overwrite", action="store_true", help="replace a non-empty output folder (swapped in when complete)")
    un.add_argument("--resume", action="store_true", help="resume from the latest checkpoint-* in --output (trainer methods)")
    un.add_argument("--preset", choices=("none", "demo"), default="none",
                    help="start from the config defaults (none) or the method's TOFU-tiny demo setting; options override")
    un.add_argument("--eval", action="store_true", help="run the TOFU evaluator on the result")
    un.add_argument("--nf4-check", action="store_true", help="with --eval: forget ROUGE-L again after NF4 quantization")
    un.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS,
                    help=f"generated answer length for --eval (TOFU's {DEFAULT_MAX_NEW_TOKENS})")
    un.add_argument("--retain-reference", help=RETAIN_REFERENCE_HELP)
    un.add_argument("--push-to-hub", metavar="REPO", help="push the result with a model card")
    un.add_argument("--hub-token", help="token for --push-to-hub (default: HF_TOKEN or the saved login)")
    un.add_argument("--select", action="store_true",
                    help="choose the method's strength by the reference-free criterion (hf_unlearn.selection): GROM's "
                         "exact strength path, T3's (T, w) calibration, the best checkpoint of a trainer; needs "
                         "--holdout; the record is saved as selection_record.json and shown in the model card")
    un.add_argument("--holdout", metavar="SPLIT_OR_FILE",
                    help="with --select: rows of the same kind the model never saw (TOFU holdout01/05/10 of --data, "
                         "or a JSON Lines file of question/answer rows)")
    un.add_argument("--retain-validation", metavar="SPLIT_OR_FILE",
                    help="with --select: retain rows not used for unlearning (default: the last 10%%, at most 100, of "
                         "the retain rows, which the method then does not see)")
    un.add_argument("--selection-steps", type=int, default=50,
                    help="with --select, trainer methods: measure the criterion every this many optimizer steps")
    un.add_argument("--verbose", action="store_true", help="also print the per-step training logs")
    un.set_defaults(func=cmd_unlearn, subparser=un)

    ev = add("eval", help="TOFU evaluation of a model", epilog=metric_definitions_text(),
             formatter_class=argparse.RawDescriptionHelpFormatter)
    ev.add_argument("--model", required=True, help="model folder or Hub id")
    ev.add_argument("--data", default=None, help=DATA_HELP)
    ev.add_argument("--forget-split", default="forget10", choices=FORGET_SPLITS)
    ev.add_argument("--retain-reference", help=RETAIN_REFERENCE_HELP)
    ev.add_argument("--template", choices=sorted(PROMPT_TEMPLATES), default=None,
                    help="prompt template the model was fine-tuned with (default: its chat template, else plain)")
    ev.add_argument("--save-truth-ratios", help="write this model's forget truth ratios (use for a retain model)")
    ev.add_argument("--output", help="report JSON path")
    ev.add_argument("--batch-size", type=int, default=16)
    ev.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS,
                    help=f"generated answer length (TOFU's {DEFAULT_MAX_NEW_TOKENS})")
    ev.add_argument("--max-examples", type=int, default=None)
    ev.add_argument("--autocast-dtype", choices=AUTOCAST_CHOICES, default="none",
                    help="score and generate under torch.autocast with this dtype (weights untouched; recorded in "
                         "the report, and a retain reference must match it)")
    ev.add_argument("--attacks", default=None, metavar="quant,relearn",
                    help="after the evaluation, try to bring the forget rows back: quant (4-bit NF4 and 8-bit "
                         "copies), relearn (a few fine-tuning steps on 10%% of the forget rows, and on retain rows)")
    ev.add_argument("--attack-original", default=None, metavar="MODEL",
                    help="the model before unlearning (folder or Hub id): report the share of the gap each attack "
                         "recovered")
    ev.add_argument("--relearn-steps", type=int, default=10, help="relearning attack: fine-tuning steps (10)")
    ev.add_argument("--relearn-lr", type=float, default=1e-4,
                    help="relearning attack: learning rate (1e-4; use the target's fine-tuning rate)")
    ev.add_argument("--verbose", action="store_true", help="show the evaluator's progress bars")
    ev.set_defaults(func=cmd_eval)

    tiny = add("tiny", help="build (or reuse) the TOFU-tiny target and retain reference, run the sanity gate")
    tiny.add_argument("--data", default=None, help=DATA_HELP)
    tiny.add_argument("--split", default="forget10", choices=FORGET_SPLITS)
    tiny.add_argument("--size", default="bench", help="bench, tofu-test or test")
    tiny.add_argument("--max-examples", type=int, default=None)
    tiny.add_argument("--cache-dir", default=None)
    tiny.set_defaults(func=cmd_tiny)

    be = add("bench", help="every method side by side on TOFU-tiny (or a given model pair)")
    be.add_argument("--split", default="forget10", choices=FORGET_SPLITS)
    be.add_argument("--data", default=None, help=DATA_HELP)
    be.add_argument("--size", default="bench", help="TOFU-tiny size: bench or tofu-test")
    be.add_argument("--model", help="target model (Hub id or folder) instead of TOFU-tiny")
    be.add_argument("--retain-model", help="retain reference model, with --model")
    be.add_argument("--methods", nargs="+")
    be.add_argument("--no-grid", action="store_true", help="one (default) setting per method instead of the grid")
    be.add_argument("--no-quantization", action="store_true")
    be.add_argument("--attacks", default=None, metavar="quant,relearn",
                    help="also attack the target, the retain reference and each method's chosen setting: quant (4-bit "
                         "and 8-bit copies), relearn (10 fine-tuning steps on 10%% of the forget rows, and on retain "
                         "rows; with --subject at the target's fine-tuning learning rate)")
    be.add_argument("--max-examples", type=int, default=None)
    be.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS,
                    help=f"generated answer length (TOFU's {DEFAULT_MAX_NEW_TOKENS}; recorded in the results)")
    be.add_argument("--output-dir", default="benchmarks/results")
    be.add_argument("--cache-dir", default=None)
    be.add_argument("--subject", default=None,
                    help="benchmark subject: tofu_tiny (default) or a pretrained model, smollm2-135m (TOFU-small on "
                         "SmolLM2-135M-Instruct, presets in benchmarks/configs/smollm2-135m.toml)")
    be.add_argument("--eval-autocast", choices=AUTOCAST_CHOICES, default=None,
                    help="evaluate under torch.autocast with this dtype (default: bfloat16 with --subject, as the "
                         "subject is fine-tuned; none on TOFU-tiny); recorded in the results")
    be.add_argument("--layout", choices=("v1", "v2"), default="v2",
                    help="with --subject: the TOFU-small layout; v2 (default) sets apart retain-train, retain-validation "
                         "and holdout authors, v1 unlearns on the evaluated retain rows")
    be.add_argument("--bar", choices=("single", "split"), default="split",
                    help="utility bar a setting must meet: split (retain side and general side each within 10%% of "
                         "the target's) or single (model utility >= 90%% of the target's)")
    be.add_argument("--select", action="store_true",
                    help="with --subject and --layout v2: every method picks its own strength with the reference-free "
                         "criterion (forget vs holdout10, retain-validation rows); rows say what was chosen and why")
    be.add_argument("--selection-steps", type=int, default=8,
                    help="with --select: trainers measure the criterion every this many optimizer steps")
    be.add_argument("--resume", action="store_true",
                    help="with --subject: keep the rows an interrupted run of the same comparison finished")
    be.add_argument("--build-only", action="store_true",
                    help="with --subject: build (or reuse) the target / retain reference pair and run its sanity gate")
    be.add_argument("--verbose", action="store_true", help="also print the per-step training logs")
    be.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 1 a run failed, 2 bad input)."""
    argv = _join_negative_values(list(sys.argv[1:] if argv is None else argv))
    data_hint = ""
    try:
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        if args.command != "unlearn" and extra:
            raise UserError(f"unrecognized arguments: {' '.join(extra)}")
        if hasattr(args, "data") and not getattr(args, "help", False):
            given = args.data is not None
            args.data = args.data if given else default_data_source()
            if not os.path.isdir(args.data) and not str(args.data).startswith("synthetic"):
                data_hint = (f"Could not load the TOFU data from the Hub dataset {args.data} ({{cause}}); offline, "
                             f"pass --data with a local folder of TOFU <config>.jsonl files (or --data synthetic)"
                             f"{'' if given else ', or set ' + TOFU_DIR_ENV}.")
        restore = quiet_console(getattr(args, "verbose", False))
        try:
            if args.command == "unlearn":
                from .safe_output import output_lock

                # the output folder is this run's alone from its first check to the end; a second run is refused
                with output_lock(getattr(args, "output", None) if not getattr(args, "help", False) else None):
                    return int(cmd_unlearn(args, extra) or 0)
            return int(args.func(args) or 0)
        finally:
            restore()
    except UserError as err:
        print(f"hf-unlearn: error: {err}", file=sys.stderr)
        return 2
    except RunFailure as err:
        if not err.printed:
            print(f"hf-unlearn: error: {err}", file=sys.stderr)
        return 1
    except ConnectionError as err:
        message = " ".join(str(err).split())
        if data_hint:
            message = data_hint.format(cause=type(err.__cause__ or err).__name__)
        print(f"hf-unlearn: error: {message}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError) as err:
        print(f"hf-unlearn: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hf-unlearn: interrupted (a run with save_strategy=steps can continue with --resume)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
