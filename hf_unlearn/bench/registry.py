"""The benchmark's view of the methods: each registered method run the same way, with its presets.

The methods are those of the core registry (:mod:`hf_unlearn.registry`: name, entry point, CLI help); this
module adds how the benchmark runs each kind of entry point and the presets (demo setting, grid) from the
subject TOML files. The CLI (`hf-unlearn unlearn|demo|bench`), `examples/unlearn_tofu.py` and the benchmark
all go through :func:`run_method`, so every method is applied, timed, saved and evaluated identically.
A method's result is an :class:`Unlearned`: the model to evaluate (with, for T3, the scorer and
the generation arguments that make its distribution), the artifact to save or push, and the
trainable-parameter count.

Adding a method is one :func:`hf_unlearn.registry.register_method` call (and, for the benchmark, its presets
in the subject TOML files).
"""

from __future__ import annotations

import contextvars
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from .. import registry as core_registry

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass
class Unlearned:
    """What a method produced.

    ``model`` is what the evaluator scores and generates with (for GROM the merged model, for T3
    the untouched base); ``scorer`` and ``generation_kwargs`` are set for methods that change the
    decoding distribution rather than the weights (T3). ``artifact`` is the native object that
    ``save_pretrained`` / ``push_to_hub`` handle (a model, a ``GROMEdit``, a ``T3Classifier``).
    ``metrics`` holds numbers only the method can measure (ATWU's token AUROC); the benchmark runner
    copies them into the method's result row and table.
    """

    method: str
    model: Any
    artifact: Any
    settings: dict[str, Any]
    trainable_params: int
    total_params: int
    seconds: float = 0.0
    scorer: Callable | None = None
    generation_kwargs: dict[str, Any] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    weights_changed: bool = True
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def trainable_share(self) -> float:
        return self.trainable_params / max(1, self.total_params)

    def save_pretrained(self, path: str | os.PathLike) -> None:
        """Save the native artifact; trainer methods save through ``trainer.save_model`` so that
        what they keep beside the weights (MASC's stopping record, ATWU's token scorer) is written too."""
        trainer = self.info.get("trainer")
        if trainer is not None:
            trainer.save_model(str(path))
        else:
            self.artifact.save_pretrained(path)

    def push_to_hub(self, repo_id: str, report: Any = None, **kwargs: Any) -> Any:
        """Push the native artifact with its card (:func:`hf_unlearn.hub.push_unlearned`), naming this
        result's method and settings; ``kwargs`` go to ``push_unlearned``."""
        from ..hub import push_unlearned

        kwargs.setdefault("method", self.method)
        kwargs.setdefault("settings", dict(self.settings))
        return push_unlearned(self.artifact, repo_id, report, **kwargs)


#: Per-call options of :func:`run_method` for the trainer runners: ``callbacks`` (extra ``TrainerCallback``s,
#: e.g. a JSON-lines log), ``quiet`` (drop the Trainer's console progress bar and log printing) and
#: ``resume_from_checkpoint`` (passed to ``trainer.train``).
RUN_OPTIONS: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("hf_unlearn_run_options", default=None)


class JsonlLogCallback(TrainerCallback):
    """Append every Trainer log (``on_log``) to a JSON Lines file, one object per line with ``step`` and
    ``epoch``; with ``echo`` the line is also printed (``--verbose``)."""

    def __init__(self, path: str | os.PathLike, echo: bool = False):
        self.path = Path(path)
        self.echo = echo

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        record = {"step": state.global_step, "epoch": state.epoch, **logs}
        line = json.dumps(record, default=lambda v: v.item() if hasattr(v, "item") else str(v))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
        if self.echo:
            print(line, flush=True)


def _num_params(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def _as_dataset(rows: Any) -> Any:
    import datasets

    if isinstance(rows, datasets.Dataset):
        return rows
    return datasets.Dataset.from_list([{"question": r["question"], "answer": r["answer"]} for r in rows])


def _trainer_runner(trainer_path: str, config_path: str) -> Callable[..., Unlearned]:
    """The runner of a trainer method: ``trainer_path`` / ``config_path`` are the dotted paths of its trainer
    class and config (imported when it runs)."""

    def run(model, tokenizer, forget, retain, output_dir, settings):
        trainer_cls = core_registry.resolve(trainer_path)
        config_cls = core_registry.resolve(config_path)
        options = RUN_OPTIONS.get() or {}
        # The settings may override the run defaults (e.g. save_strategy="steps" to checkpoint and resume).
        args = config_cls(**{"output_dir": str(output_dir), "report_to": "none", "save_strategy": "no", **settings})
        # GradAscent's objective has no retain term, but its divergence guard watches a retain set when given one
        needs_retain = getattr(trainer_cls, "needs_retain", lambda _: True)(args) or getattr(
            trainer_cls, "watches_retain", lambda _: False)(args)
        trainer = trainer_cls(
            model=model, args=args, train_dataset=_as_dataset(forget),
            retain_dataset=_as_dataset(retain) if needs_retain else None,
            processing_class=tokenizer, callbacks=list(options.get("callbacks", ())) or None,
        )
        if options.get("quiet"):  # the console shows one line per phase; the per-step logs go to callbacks
            from transformers.trainer_callback import PrinterCallback, ProgressCallback

            trainer.remove_callback(ProgressCallback)
            trainer.remove_callback(PrinterCallback)
        trainer.train(resume_from_checkpoint=options.get("resume_from_checkpoint"))
        trained = trainer.model
        trained.eval()
        info: dict[str, Any] = {"global_step": trainer.state.global_step}
        for attr in ("stopped_at_step", "violation_history", "stop_reason"):
            if hasattr(trainer, attr):
                info[attr] = getattr(trainer, attr)
        trainable = sum(p.numel() for p in trained.parameters() if p.requires_grad)
        result = Unlearned(
            method="", model=trained, artifact=trained, settings=dict(settings),
            trainable_params=trainable, total_params=_num_params(trained), info=info,
        )
        if hasattr(trainer, "token_scores"):  # ATWU: how well its token scores find the forget-specific tokens
            from ..trainers.atwu.weighter import answer_token_ids, forget_specific_auroc

            scores = trainer.token_scores(_as_dataset(forget))
            retain_ids = answer_token_ids(tokenizer, retain, template=trainer.args.prompt_template)
            result.metrics["token_auroc"] = forget_specific_auroc(scores, retain_ids)
        result.info["trainer"] = trainer
        return result

    return run


def _run_grom(model, tokenizer, forget, retain, output_dir, settings):
    from ..grom import GROMConfig, fit_grom

    edit = fit_grom(model, tokenizer, forget, retain, GROMConfig(progress=False, **settings))
    total = _num_params(model)
    # The adapter's size: the LoRA factors that reproduce each P (rank <= number of forget keys).
    delta_params = sum(f.lora_A.numel() + f.lora_B.numel() for f in edit.lora_factors().values())
    merged = edit.to_peft(model).merge_and_unload()
    merged.eval()
    info = {"selected_layers": list(edit.selected_layers), "truncation_errors": edit.truncation_errors(),
            "retain_rows_read": edit.stats["num_retain_rows_read"]}
    return Unlearned(
        method="grom", model=merged, artifact=edit, settings=dict(settings),
        trainable_params=delta_params, total_params=total, info=info,
    )


def _run_t3(model, tokenizer, forget, retain, output_dir, settings):
    """Fit the head (every setting is a ``T3ClassifierConfig`` field: head, fit, and the decoding defaults
    ``temperature`` / ``tilt_weight``); evaluation scores and generates with the tilted distribution. The runner
    measures T3 ``generate`` tokens/s against plain ``generate`` (batch 16, 32 new tokens) in the same process."""
    from transformers import LogitsProcessorList

    from ..t3 import T3ClassifierConfig, T3LogitsProcessor, fit_t3, t3_scorer

    clf = fit_t3(model, tokenizer, forget, retain, T3ClassifierConfig(**settings), progress=False)
    processor = T3LogitsProcessor(model, clf)  # the head's own decoding defaults
    model.eval()
    # fit time in two parts: cache_seconds (one forward pass of the base) and train_seconds (the head)
    info = {k: v for k, v in (getattr(clf, "fit_report", None) or {}).items() if isinstance(v, (int, float, str))}
    return Unlearned(
        method="t3", model=model, artifact=clf, settings=dict(settings),
        trainable_params=_num_params(clf), total_params=_num_params(model),
        scorer=t3_scorer(model, clf),
        generation_kwargs={"logits_processor": LogitsProcessorList([processor])},
        weights_changed=False,
        info=info,
    )


@dataclass(frozen=True)
class MethodSpec:
    """A registered method: how to run it, its demo settings and its benchmark grid (<= 6 settings)."""

    name: str
    run: Callable[..., Unlearned]
    demo: dict[str, Any]
    grid: tuple[dict[str, Any], ...]
    description: str


METHODS: dict[str, MethodSpec] = {}


def register(spec: MethodSpec) -> None:
    METHODS[spec.name] = spec


#: How the benchmark runs a fit-function entry point (GROM's and T3's): ``{entry point: runner}``.
FIT_RUNNERS: dict[str, Callable[..., Unlearned]] = {
    "hf_unlearn.grom:fit_grom": _run_grom,
    "hf_unlearn.t3:fit_t3": _run_t3,
}


def runner_for(info: core_registry.MethodInfo) -> Callable[..., Unlearned]:
    """The runner ``run(model, tokenizer, forget, retain, output_dir, settings) -> Unlearned`` of a registered
    method: the trainer runner for a trainer method, GROM's / T3's runner for their fit function, else the
    entry point itself (a runner)."""
    if info.is_trainer:
        return _trainer_runner(info.trainer_class, info.config_class)
    if info.entry_point in FIT_RUNNERS:
        return FIT_RUNNERS[info.entry_point]
    return info.load()


def method_spec(name: str) -> MethodSpec:
    """The :class:`MethodSpec` of ``name``: from :data:`METHODS` (with its presets), else, for a method registered
    with :mod:`hf_unlearn.registry` after this module loaded, one without presets (its config's defaults)."""
    if name in METHODS:
        return METHODS[name]
    try:
        info = core_registry.get_method(name)
    except KeyError:
        raise ValueError(f"Unknown method {name!r}; choose from {sorted(core_registry.method_names())}.") from None
    return MethodSpec(name, runner_for(info), demo={}, grid=({},), description=info.cli_help)


def run_method(
    name: str,
    model: Any,
    tokenizer: Any,
    forget: Any,
    retain: Any,
    output_dir: str | os.PathLike,
    settings: dict[str, Any] | None = None,
    *,
    callbacks: Sequence[Any] = (),
    quiet: bool = False,
    resume_from_checkpoint: str | bool | None = None,
) -> Unlearned:
    """Run method ``name`` on ``model`` with ``settings`` (default: its demo settings), timed.

    ``callbacks``, ``quiet`` and ``resume_from_checkpoint`` apply to the trainer methods (see ``RUN_OPTIONS``).
    """
    spec = method_spec(name)
    settings = dict(spec.demo if settings is None else settings)
    torch.manual_seed(0)
    start = time.perf_counter()
    token = RUN_OPTIONS.set({"callbacks": tuple(callbacks), "quiet": quiet, "resume_from_checkpoint": resume_from_checkpoint})
    try:
        result = spec.run(model, tokenizer, forget, retain, output_dir, settings)
    finally:
        RUN_OPTIONS.reset(token)
    result.seconds = time.perf_counter() - start
    result.method = name
    return result


# Each method's demo setting and benchmark grid are data, one TOML file per benchmark subject
# (``benchmarks/configs/<subject>.toml``, installed as ``hf_unlearn.bench.configs``).
DEFAULT_SUBJECT = "tofu_tiny"


def configs_dir() -> Path:
    """Folder of the subject TOML files: ``hf_unlearn/bench/configs`` when installed from a wheel,
    ``benchmarks/configs`` in a source checkout."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("hf_unlearn.bench.configs")
    except ModuleNotFoundError:
        spec = None
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(__file__).resolve().parents[2] / "benchmarks" / "configs"


def subject_config_path(subject: str | os.PathLike) -> Path:
    """The TOML file of ``subject``: a name (``"tofu_tiny"``) in :func:`configs_dir`, or a path to a ``.toml``."""
    if str(subject).endswith(".toml"):
        path = Path(subject)
    else:
        path = configs_dir() / f"{subject}.toml"
    if not path.is_file():
        known = sorted(p.stem for p in configs_dir().glob("*.toml"))
        raise FileNotFoundError(f"No benchmark config {path}; shipped subjects: {known}.")
    return path


def _merge(shared: dict[str, Any], names: Sequence[str], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in names:
        if name not in shared:
            raise ValueError(f"{where}: unknown shared table {name!r}; defined: {sorted(shared)}.")
        out.update(shared[name])
    return out


def load_subject_presets(subject: str | os.PathLike = DEFAULT_SUBJECT) -> dict[str, dict[str, Any]]:
    """Every method's ``{"demo": settings, "grid": (settings, ...)}`` from a subject's TOML file.

    Each method's table is assembled as the file's header describes: ``[shared.<name>]`` tables named
    in ``use``, then ``settings``, then ``demo`` (the demo setting) or, for each grid entry, the shared
    tables named in ``grid_use`` and then the entry.
    """
    path = subject_config_path(subject)
    with open(path, "rb") as fh:
        data = tomllib.load(fh)
    shared = data.get("shared", {})
    presets: dict[str, dict[str, Any]] = {}
    for name, table in data.get("methods", {}).items():
        unknown = set(table) - {"use", "settings", "demo", "grid_use", "grid"}
        if unknown:
            raise ValueError(f"{path}: method {name!r} has unknown keys {sorted(unknown)}.")
        base = {**_merge(shared, table.get("use", ()), f"{path} [{name}]"), **table.get("settings", {})}
        grid_base = {**base, **_merge(shared, table.get("grid_use", ()), f"{path} [{name}]")}
        presets[name] = {
            "demo": {**base, **table.get("demo", {})},
            "grid": tuple({**grid_base, **entry} for entry in table.get("grid", ())),
        }
    return presets


def _register_all(subject: str | os.PathLike = DEFAULT_SUBJECT) -> None:
    """Register every method of the core registry with its presets, in the subject file's order (then the
    methods it has no table for, with empty presets). Each built-in method must have a table."""
    presets = load_subject_presets(subject)
    names = core_registry.method_names()
    for name in [n for n in presets if n in names] + [n for n in names if n not in presets]:
        info = core_registry.get_method(name)
        if name not in presets and info.entry_point.startswith("hf_unlearn."):
            raise ValueError(f"{subject_config_path(subject)} has no [methods.{name}] table.")
        preset = presets.get(name, {"demo": {}, "grid": ({},)})
        register(MethodSpec(name, runner_for(info), demo=preset["demo"], grid=preset["grid"],
                            description=info.cli_help))


_register_all()
