"""The method registry: one entry per unlearning method, each run the same way.

The CLI (`hf-unlearn unlearn|demo|bench`), `examples/unlearn_tofu.py` and the benchmark all go
through :func:`run_method`, so every method is applied, timed, saved and evaluated identically.
A method's result is an :class:`Unlearned`: the model to evaluate (with, for T3, the scorer and
the generation arguments that make its distribution), the artifact to save or push, and the
trainable-parameter count.

Adding a method is one entry in ``METHODS``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Unlearned:
    """What a method produced.

    ``model`` is what the evaluator scores and generates with (for GROM the merged model, for T3
    the untouched base); ``scorer`` and ``generation_kwargs`` are set for methods that change the
    decoding distribution rather than the weights (T3). ``artifact`` is the native object that
    ``save_pretrained`` / ``push_to_hub`` handle (a model, a ``GROMEdit``, a ``T3Classifier``).
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


def _num_params(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def _as_dataset(rows: Any) -> Any:
    import datasets

    if isinstance(rows, datasets.Dataset):
        return rows
    return datasets.Dataset.from_list([{"question": r["question"], "answer": r["answer"]} for r in rows])


def _trainer_runner(trainer_name: str, config_name: str) -> Callable[..., Unlearned]:
    def run(model, tokenizer, forget, retain, output_dir, settings):
        from .. import trainers

        trainer_cls = getattr(trainers, trainer_name)
        config_cls = getattr(trainers, config_name)
        args = config_cls(output_dir=str(output_dir), report_to="none", save_strategy="no", **settings)
        trainer = trainer_cls(
            model=model, args=args, train_dataset=_as_dataset(forget), retain_dataset=_as_dataset(retain),
            processing_class=tokenizer,
        )
        trainer.train()
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
    info = {"selected_layers": list(edit.selected_layers), "truncation_errors": edit.truncation_errors()}
    return Unlearned(
        method="grom", model=merged, artifact=edit, settings=dict(settings),
        trainable_params=delta_params, total_params=total, info=info,
    )


def _run_t3(model, tokenizer, forget, retain, output_dir, settings):
    from transformers import LogitsProcessorList

    from ..t3 import T3ClassifierConfig, T3LogitsProcessor, fit_t3, t3_scorer

    config_kwargs = dict(settings)
    decoding = {k: config_kwargs.pop(k) for k in ("temperature", "top_k", "tilt_weight") if k in config_kwargs}
    fit_kwargs = {k: config_kwargs.pop(k) for k in ("steps", "learning_rate", "holdout_fraction") if k in config_kwargs}
    clf = fit_t3(model, tokenizer, forget, retain, T3ClassifierConfig(**config_kwargs), progress=False, **fit_kwargs)
    processor = T3LogitsProcessor(model, clf, **decoding)
    model.eval()
    return Unlearned(
        method="t3", model=model, artifact=clf, settings=dict(settings),
        trainable_params=_num_params(clf), total_params=_num_params(model),
        scorer=t3_scorer(model, clf, **decoding),
        generation_kwargs={"logits_processor": LogitsProcessorList([processor])},
        weights_changed=False,
        info={k: v for k, v in getattr(clf, "fit_report", {}).items() if isinstance(v, (int, float, str))},
    )


@dataclass(frozen=True)
class MethodSpec:
    """A registered method: how to run it, its demo settings and its benchmark grid (<= 6 settings)."""

    name: str
    run: Callable[..., Unlearned]
    demo: dict[str, Any]
    grid: tuple[dict[str, Any], ...]
    description: str


def _trainer_settings(lr: float, epochs: float, **extra: Any) -> dict[str, Any]:
    return {"learning_rate": lr, "num_train_epochs": epochs, "per_device_train_batch_size": 8,
            "logging_steps": 5, "seed": 0, "gradient_checkpointing": False, **extra}


METHODS: dict[str, MethodSpec] = {}


def register(spec: MethodSpec) -> None:
    METHODS[spec.name] = spec


def run_method(
    name: str,
    model: Any,
    tokenizer: Any,
    forget: Any,
    retain: Any,
    output_dir: str | os.PathLike,
    settings: dict[str, Any] | None = None,
) -> Unlearned:
    """Run method ``name`` on ``model`` with ``settings`` (default: its demo settings), timed."""
    if name not in METHODS:
        raise ValueError(f"Unknown method {name!r}; choose from {sorted(METHODS)}.")
    spec = METHODS[name]
    settings = dict(spec.demo if settings is None else settings)
    torch.manual_seed(0)
    start = time.perf_counter()
    result = spec.run(model, tokenizer, forget, retain, output_dir, settings)
    result.seconds = time.perf_counter() - start
    result.method = name
    return result


# Benchmark grids: every method gets the same budget of 3 settings (`hf-unlearn bench`), sized so
# that the whole forget10 grid runs in under an hour on 2 CPU cores. Gradient methods train 4 epochs
# at batch 16 (100 steps on forget10) over a learning-rate bracket from "barely moves" to "utility
# collapses" on TOFU-tiny; their demo settings (10 epochs, batch 8) were tuned on the synthetic set.
GRID_EPOCHS = 4
GRID_BATCH = 16


def _grid(lrs: Sequence[float], **extra: Any) -> tuple[dict[str, Any], ...]:
    return tuple(_trainer_settings(lr, GRID_EPOCHS, per_device_train_batch_size=GRID_BATCH, **extra) for lr in lrs)


register(MethodSpec(
    "grad_ascent", _trainer_runner("GradAscentTrainer", "UnlearningConfig"),
    demo=_trainer_settings(1e-4, 10),
    grid=_grid((3e-5, 1e-4, 3e-4)),
    description="gradient ascent on the forget NLL",
))
register(MethodSpec(
    "grad_diff", _trainer_runner("GradDiffTrainer", "UnlearningConfig"),
    demo=_trainer_settings(3e-4, 10),
    grid=_grid((3e-5, 1e-4, 3e-4)),
    description="gradient ascent on forget + descent on retain NLL",
))
register(MethodSpec(
    "npo", _trainer_runner("NPOTrainer", "UnlearningConfig"),
    demo=_trainer_settings(1e-3, 10, beta=0.1),
    grid=_grid((3e-5, 1e-4, 3e-4), beta=0.1),
    description="negative preference optimization (with retain NLL)",
))
register(MethodSpec(
    "simnpo", _trainer_runner("SimNPOTrainer", "UnlearningConfig"),
    demo=_trainer_settings(1e-3, 10),
    grid=_grid((1e-4, 3e-4, 1e-3)),
    description="reference-free NPO with length normalisation",
))
_MASC = {"learning_rate": 3e-4, "per_device_train_batch_size": 4, "top_k": 10, "kl_weight": 1.0,
         "validation_fraction": 0.1, "check_every": 2, "max_steps": 200, "logging_steps": 5, "seed": 0,
         "gradient_checkpointing": False}
register(MethodSpec(
    "masc", _trainer_runner("MASCTrainer", "MASCConfig"),
    demo={**_MASC, "margin_threshold": 1.0, "stop_tolerance": 0.3},
    grid=(  # MASC sets its own step count (max 200): the grid varies the stopping rule and the step size
        {**_MASC, "margin_threshold": 1.0, "stop_tolerance": 0.3},
        {**_MASC, "margin_threshold": 1.0, "stop_tolerance": 0.4},
        {**_MASC, "margin_threshold": 1.0, "stop_tolerance": 0.3, "learning_rate": 1e-3},
    ),
    description="margin self-correction with its own stopping rule",
))
_ATWU = {"forget_loss": "satga", "budget": 0.2, "budget_weight": 50.0, "entropy_weight": 0.01, "scorer_lr": 1e-2,
         "saturation_beta": 0.2, "saturation_c": 20.0, "weight_decay": 0.0}
register(MethodSpec(
    "atwu", _trainer_runner("ATWUTrainer", "ATWUConfig"),
    demo=_trainer_settings(5e-4, 10, **_ATWU),
    grid=_grid((1e-4, 3e-4, 1e-3), **_ATWU),
    description="alternating token-weighted unlearning with a learned token scorer",
))
register(MethodSpec(
    "grom", _run_grom,
    demo={"target_modules": "lm_head", "forget_weight": 10.0, "suppression_margin": 30.0, "ridge": 1e-2},
    grid=tuple(  # the MLP down-projection of the attributed layer; less retain weight = a stronger edit
        {"target_modules": "down_proj", "retain_weight": rw, "ridge": 1e-3, "suppression_margin": 80.0}
        for rw in (30.0, 10.0, 3.0)
    ),
    description="closed-form one-shot edit saved as a PEFT LoRA adapter",
))
_T3 = {"rank": 8, "layer": 1, "pooling": "mean", "top_k": 20}
register(MethodSpec(
    "t3", _run_t3,
    demo={**_T3, "temperature": 2.0, "tilt_weight": 1.0},
    grid=tuple({**_T3, "temperature": t, "tilt_weight": 1.0} for t in (1.0, 2.0, 4.0)),
    description="temper-then-tilt decoding with a low-rank classifier head",
))
