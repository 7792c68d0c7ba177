"""The base unlearning trainer: a `trl.SFTTrainer` whose batches pair each forget example with a retain example.

Subclasses implement one hook, :meth:`UnlearningTrainer.compute_unlearning_loss`, and use the helpers here to score
batches (:meth:`~UnlearningTrainer.score`), query the frozen reference (:meth:`~UnlearningTrainer.reference_scores`),
compute the configured retain term (:meth:`~UnlearningTrainer.retain_term`) and log scalars
(:meth:`~UnlearningTrainer.log_metric`). The baseline objective
(``forget_weight * forget_term + retain_weight * retain_term``) is
in :mod:`hf_unlearn.methods.baselines`. Data preparation, the fused-LM-head patch, PEFT wrapping and the distributed
setup are TRL's and transformers'; this module adds the pairing (:mod:`~hf_unlearn.methods.base.pairing`), the
reference model, loss normalisation that is exact under gradient accumulation and data parallelism,
and the safety rails every method shares:

* outputs are never destroyed or mixed: the output folder is checked before any work
  (:func:`hf_unlearn.safe_output.check_output_dir`) and locked while :meth:`~UnlearningTrainer.train` runs
  (:func:`hf_unlearn.safe_output.output_lock`: a second run on it is refused), each checkpoint is written in a
  hidden staging folder by every process and renamed into place by the main process
  (:func:`~hf_unlearn.methods.base.checkpoints.stage_checkpoint`), and the final model is built in a temporary
  sibling and swapped in (:func:`hf_unlearn.safe_output.atomic_directory`);
* a resume is exact and of the same run: the pairing's epoch is restored with the data position, and a checkpoint
  whose method, settings or data differ from the resuming trainer's is refused (:func:`run_fingerprint`);
* no broken model is saved: trainable weights are checked finite before each checkpoint and the final save, and a
  divergence guard (:class:`~hf_unlearn.methods.base.guards.RetainDivergenceGuard`) stops a run whose retain NLL
  explodes (objectives without a retain term are watched on a retain batch scored without gradient);
* no-op settings (learning rate 0, zero epochs or steps) are refused before work, and a bf16/fp16 model trained
  at a learning rate that its precision cannot represent gets a warning;
* sequences are truncated to the model's maximum positions, and a forget example left without answer tokens is
  refused.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import json
import os
import shutil
import tempfile
import warnings
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from accelerate.utils import is_peft_model
from datasets import Dataset
from transformers import AutoConfig, AutoTokenizer, PreTrainedModel, TrainingArguments
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint
from trl import SFTTrainer
from trl.trainer.utils import create_model_from_path, get_config_model_id

from ...data import is_documents, model_max_positions, overlapping_examples
from ...logprobs import label_log_probs
from ...model_copy import independent_copy
from ...safe_output import OutputDirError, OutputWriteError, atomic_directory, check_output_dir, output_lock
from .checkpoints import (
    FINGERPRINT_NAME,
    RUN_ENTRIES,
    TRAINER_STATE_NAME,
    ResumeMismatchError,
    _checkpoint_dirs,
    _rows_digest,
    _tracked_settings,
    fingerprint_differences,
    stage_checkpoint,
)
from .config import BaseUnlearningConfig, UnlearningConfig
from .guards import (
    NonFiniteLossError,
    NonFiniteWeightsError,
    RetainDivergenceGuard,
    any_process,
    fraction_of_vanishing_updates,
    non_finite_parameters,
)
from .losses import LossDenominators, ScoredBatch, answer_mask, kl_retain_loss, nll_loss
from .pairing import (
    RETAIN_PREFIX,
    PairedCollator,
    PairedForgetRetainDataset,
    PairingEpochCallback,
    _identity_keys,
    as_dataset,
    to_trl_format,
)


def _batch_counts(batch: dict[str, Any]) -> torch.Tensor:
    counts = []
    for prefix in ("", RETAIN_PREFIX):
        labels = batch.get(prefix + "labels")
        if labels is None:
            counts += [0.0, 0.0]
        else:
            counts += [float(answer_mask(labels).sum()), float(labels.shape[0])]
    return torch.tensor(counts, dtype=torch.float64)


def _local_dir(path: Any) -> str | None:
    if isinstance(path, (str, os.PathLike)) and str(path) and Path(path).expanduser().is_dir():
        return str(path)
    return None



def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    """Whether the two models hold exactly the same tensors under the same names (values, shapes, dtypes)."""
    sa, sb = a.state_dict(), b.state_dict()
    if sa.keys() != sb.keys():
        return False
    return all(sa[k].dtype == sb[k].dtype and torch.equal(sa[k].cpu(), sb[k].cpu()) for k in sa)


def scalar_on_device(value: torch.Tensor | float, device: torch.device | str) -> torch.Tensor:
    """A logged value as a 0-d float32 tensor on ``device`` (the accelerator's), detached.

    Python floats (a violation rate, a count) and tensors from the model both land on the same device, so
    ``torch.stack`` over one step's values never mixes a CPU tensor with CUDA ones, and no value forces a host
    sync when it is recorded."""
    if torch.is_tensor(value):
        return value.detach().float().reshape(()).to(device)
    return torch.tensor(float(value), dtype=torch.float32, device=device)

class UnlearningTrainer(SFTTrainer):
    """Base class of the unlearning trainers (TRL ``SFTTrainer`` subclass), and the trainer of the baseline objective.

    ``train_dataset`` is the forget set, ``retain_dataset`` the retain set. Both go through ``SFTTrainer``'s dataset
    preparation: TOFU rows (``question``/``answer``, tokenized by :func:`to_trl_format` with
    ``args.prompt_template``), TRL prompt/completion rows and conversational rows all work, with labels on the
    completion tokens only; documents (a ``text`` column, a list of strings or a ``.txt``/``.json``/``.jsonl`` path,
    :func:`as_dataset`) are cut into chunks of ``max_length`` tokens with labels on every token. Each training example is a forget example paired with a retain example
    (:class:`PairedForgetRetainDataset`), and a batch holds ``input_ids``, ``attention_mask``, ``labels`` for the
    forget examples and the same keys prefixed with ``retain_``.

    With an :class:`~hf_unlearn.methods.base.UnlearningConfig` it trains the baseline objective
    ``forget_weight * forget_term + retain_weight * retain_term``
    (:func:`hf_unlearn.methods.baselines.trainer.baseline_objective`)
    with the forget term chosen by ``forget_loss`` and the retain term by ``retain_loss``. The baseline trainers
    (:mod:`hf_unlearn.methods.baselines`) are presets of it: ``config_class`` gives their defaults and ``preset``
    the field values that define the method. Other methods override :meth:`compute_unlearning_loss` and, when they
    need them, :meth:`needs_retain` and :meth:`needs_reference_model`, with a config subclassing
    :class:`~hf_unlearn.methods.base.BaseUnlearningConfig`.

    Before any work the trainer refuses an output folder that overlaps the input model folder or is not empty
    (unless ``overwrite=True``; a folder holding checkpoints is left to :meth:`train`, which resumes it or refuses
    it), no-op settings (learning rate 0, zero epochs or steps), a forget example left without answer tokens by truncation, and hyperparameters the
    objective cannot use. While training it stops on a non-finite loss, on non-finite weights before a checkpoint,
    and when the retain NLL diverges (:class:`RetainDivergenceGuard`; an objective without a retain term given a
    ``retain_dataset`` is watched on it). :meth:`train` holds the output folder's lock, so a second run on the same
    folder is refused. Checkpoints and the final model are written in a temporary folder and renamed into place,
    so an interrupted or failed write never leaves a half-written result where a complete one is expected;
    ``train(resume_from_checkpoint=True)`` continues from the latest complete checkpoint, refuses one written by
    another method or with other settings or data, and gives the weights of an uninterrupted run.

    An objective with a frozen reference reloads it from the model's folder when one is known (as TRL's
    ``DPOTrainer`` does), or copies a model changed in memory; ``ref_model=`` passes one instead (needed under
    DeepSpeed ZeRO-3 / FSDP for a model without a folder: its partitioned weights are never copied). Under a
    multi-process launch the non-finite checks are agreed across processes, so every process raises together.
    """

    _tag_names = ["trl", "hf-unlearn", "unlearning"]
    _name = "Unlearning"
    # the config dataclass this trainer resolves its arguments to (its defaults are the method's defaults)
    config_class: ClassVar[type[BaseUnlearningConfig]] = UnlearningConfig
    # config values that define this trainer's method (e.g. {"forget_loss": "npo"}): set when a config of another
    # class is converted, and required when a config of `config_class` is given
    preset: ClassVar[dict[str, Any]] = {}
    # compute_loss divides by the totals of the accumulation step itself (see LossDenominators)
    loss_is_scaled_for_ga = True

    def __init__(
        self,
        model: str | PreTrainedModel,
        args: BaseUnlearningConfig | TrainingArguments | None = None,
        data_collator: Callable | None = None,
        train_dataset: Dataset | Sequence[dict[str, Any]] | None = None,
        retain_dataset: Dataset | Sequence[dict[str, Any]] | None = None,
        eval_dataset: Dataset | dict[str, Dataset] | None = None,
        processing_class: Any = None,
        callbacks: list | None = None,
        optimizers: tuple = (None, None),
        optimizer_cls_and_kwargs: tuple | None = None,
        quantization_config: Any = None,
        peft_config: Any = None,
        ref_model: PreTrainedModel | None = None,
    ):
        args = self._resolve_args(args, model)
        if train_dataset is None:
            raise ValueError("`train_dataset` (the forget set) is required.")
        self._input_dirs = self._model_dirs(model)
        self._check_output_dir_before_work(args)
        model_config = AutoConfig.from_pretrained(model) if isinstance(model, str) else getattr(model, "config", None)
        args = self._limit_max_length(args, model_config)
        if processing_class is None:
            model_id = model if isinstance(model, str) else get_config_model_id(model.config)
            processing_class = AutoTokenizer.from_pretrained(model_id)
        template = getattr(args, "prompt_template", None)
        raw_forget = as_dataset(train_dataset)
        if len(raw_forget) == 0:
            raise ValueError("The forget set (`train_dataset`) is empty: nothing to unlearn.")
        self._document_sets = {"forget"} if is_documents(raw_forget) else set()  # chunks fill max_length by design
        retain = self._check_retain(retain_dataset, raw_forget, args, processing_class)
        forget = to_trl_format(raw_forget, processing_class, template, args.max_length)
        if args.packing or args.padding_free:
            raise ValueError(
                "`packing` and `padding_free` are not supported by unlearning trainers: the losses are per answer "
                "and each forget example is paired with one retain example."
            )
        if isinstance(eval_dataset, dict):
            eval_dataset = {k: to_trl_format(v, processing_class, template, args.max_length)
                            for k, v in eval_dataset.items()}
        elif eval_dataset is not None:
            eval_dataset = to_trl_format(eval_dataset, processing_class, template, args.max_length)

        self._divergence_guard = RetainDivergenceGuard(args.max_retain_loss_ratio, args.min_retain_loss_reference)
        self._staging_dir: Path | None = None
        super().__init__(
            model=model,
            args=args,
            data_collator=data_collator,
            train_dataset=forget,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            callbacks=[*(callbacks or []), self._divergence_guard],
            optimizers=optimizers,
            optimizer_cls_and_kwargs=optimizer_cls_and_kwargs,
            quantization_config=quantization_config,
            peft_config=peft_config,
        )
        self._check_truncation(len(forget), self.train_dataset, "forget", required=True)

        # Pair the prepared forget set with the prepared retain set
        self.forget_dataset = self.train_dataset
        self.retain_dataset = None
        if retain is not None:
            if not self._skip_prepare_dataset:
                prepared = self._prepare_dataset(retain, self.processing_class, self.args, False, None, "retain")
                self._check_truncation(len(retain), prepared, "retain", required=False)
                retain = prepared
            if len(retain) == 0:
                raise ValueError("No retain example is left after tokenization/truncation (check `max_length`).")
            self.retain_dataset = retain
            self.train_dataset = PairedForgetRetainDataset(self.forget_dataset, retain, seed=self.args.seed)
            self.add_callback(PairingEpochCallback(self.train_dataset))
        self.data_collator = PairedCollator(self.data_collator)

        # Frozen reference model, created only when the objective needs one
        self.ref_model = None
        if self.needs_reference_model(self.args) and not is_peft_model(self.model):
            self.ref_model = self._create_reference_model(model if isinstance(model, str) else None, ref_model)

        self._unlearning_metrics: dict[str, dict[str, list[torch.Tensor]]] = {
            "train": defaultdict(list), "eval": defaultdict(list)
        }
        self._step_denominators: LossDenominators | None = None
        self._in_training_step = False
        self._retain_nll_seen = False
        self._fingerprint: dict[str, Any] | None = None

    # ----- configuration -----------------------------------------------------------------------------------------

    @classmethod
    def _resolve_args(cls, args: Any, model: Any) -> BaseUnlearningConfig:
        """``args`` as a ``cls.config_class``: a default one named after the model, or other training arguments
        converted (the fields the config class has, with ``cls.preset`` applied); then checked.

        A config of ``config_class`` is used as given (never modified). When an unlearning config of another class
        is converted, a carried value equal to that class's default but different from ``config_class``'s default
        gets a warning (e.g. a plain ``UnlearningConfig`` given to ``SimNPOTrainer`` keeps ``beta=0.1``)."""
        config_class = cls.config_class
        if args is None:
            name = model if isinstance(model, str) else (get_config_model_id(model.config) or "model")
            args = config_class(f"{str(name).rstrip('/').split('/')[-1]}-{cls._name}")
        elif not isinstance(args, config_class):
            fields = {f.name: f for f in dataclasses.fields(config_class) if f.init}
            values = {k: v for k, v in args.to_dict().items() if k in fields}
            # to_dict() masks every `*_token` field (hub_token, SFTConfig's eos_token/pad_token): take them as set
            values.update({k: getattr(args, k) for k in values if k.endswith("_token") and hasattr(args, k)})
            if isinstance(args, BaseUnlearningConfig):
                source = {f.name: f.default for f in dataclasses.fields(type(args)) if f.init}
                carried = [
                    k for k, f in fields.items()
                    if k in source and k not in cls.preset and f.default is not dataclasses.MISSING
                    and source[k] != f.default and values.get(k) == source[k]
                ]
                if carried:
                    shown = ", ".join(f"{k}={values[k]!r} ({config_class.__name__}: {fields[k].default!r})" for k in carried)
                    warnings.warn(
                        f"{cls.__name__} got a {type(args).__name__}; its defaults are kept: {shown}. Pass a "
                        f"{config_class.__name__} for {cls._name}'s defaults.",
                        stacklevel=3,
                    )
            values.update(cls.preset)
            args = config_class(**values)
        for key, value in cls.preset.items():
            if getattr(args, key, None) != value:
                raise ValueError(
                    f"{cls.__name__} trains with {key}={value!r}, but its config sets {key}={getattr(args, key, None)!r}; "
                    "use UnlearningTrainer (or the trainer of that objective) instead."
                )
        cls._check_not_a_no_op(args)
        cls.check_hyperparameters(args)
        return args

    @staticmethod
    def _check_not_a_no_op(args: TrainingArguments) -> None:
        """Refuse settings that would train nothing: a learning rate <= 0, zero steps or zero epochs."""
        if not args.learning_rate > 0:
            raise ValueError(f"learning_rate={args.learning_rate} would leave the model unchanged; it must be > 0.")
        if args.max_steps == 0 or (args.max_steps < 0 and not args.num_train_epochs > 0):
            raise ValueError(
                f"max_steps={args.max_steps}, num_train_epochs={args.num_train_epochs} would train for zero steps; "
                "set num_train_epochs > 0 or max_steps > 0."
            )

    @classmethod
    def check_hyperparameters(cls, args: BaseUnlearningConfig) -> None:
        """Raise a ``ValueError`` for hyperparameters this objective cannot use (override to add checks)."""

    @classmethod
    def needs_retain(cls, args: BaseUnlearningConfig) -> bool:
        """Whether the objective uses the retain set (default: a retain term, ``retain_loss != "none"``, with a
        positive weight ``retain_weight``)."""
        return getattr(args, "retain_loss", "nll") != "none" and getattr(args, "retain_weight", 1.0) > 0

    @classmethod
    def needs_reference_model(cls, args: BaseUnlearningConfig) -> bool:
        """Whether the objective needs the frozen reference model (default: NPO's forget term or the KL retain
        term)."""
        return getattr(args, "forget_loss", None) == "npo" or (
            cls.needs_retain(args) and getattr(args, "retain_loss", None) == "kl"
        )

    @classmethod
    def watches_retain(cls, args: BaseUnlearningConfig) -> bool:
        """Whether a ``retain_dataset`` given to an objective without a retain term is kept to feed the divergence
        guard (default: when the guard is on, ``max_retain_loss_ratio`` not ``None``)."""
        return not cls.needs_retain(args) and getattr(args, "max_retain_loss_ratio", None) is not None

    def _check_retain(self, retain_dataset: Any, forget: Dataset, args: BaseUnlearningConfig, tokenizer: Any):
        needed = self.needs_retain(args)
        if retain_dataset is None:
            if needed:
                raise ValueError(
                    f"{type(self).__name__} needs a `retain_dataset` (its retain term {getattr(args, 'retain_loss', '')!r} "
                    f"has weight retain_weight={getattr(args, 'retain_weight', None)}); pass one, or set `retain_weight=0` to "
                    "unlearn without it."
                )
            return None
        if not needed and not self.watches_retain(args):
            warnings.warn(f"{type(self).__name__} does not use a retain set here; `retain_dataset` is ignored.", stacklevel=3)
            return None
        retain = as_dataset(retain_dataset)
        if len(retain) == 0:
            raise ValueError("The retain set (`retain_dataset`) is empty: a retain example is needed per forget example.")
        keys = _identity_keys(forget)
        if keys is not None and keys == _identity_keys(retain):
            shared = overlapping_examples(forget, retain, keys=keys)
            if shared and not args.allow_overlap:
                raise ValueError(
                    f"{shared} of the {len(forget)} forget examples also occur in the retain set: the objective "
                    "would push their likelihood down and up at once. Remove them, or set `allow_overlap=True`."
                )
            if shared:
                warnings.warn(f"{shared} forget examples also occur in the retain set (allow_overlap=True).", stacklevel=3)
        if is_documents(retain):
            self._document_sets = {*getattr(self, "_document_sets", ()), "retain"}
        return to_trl_format(retain, tokenizer, getattr(args, "prompt_template", None), args.max_length)

    # ----- output folder and length checks (before any work) -----------------------------------------------------

    @staticmethod
    def _model_dirs(model: Any) -> tuple[str, ...]:
        """Local folders the model was read from (refused as output folders)."""
        candidates = [model] if isinstance(model, (str, os.PathLike)) else [
            getattr(model, "name_or_path", None), getattr(getattr(model, "config", None), "_name_or_path", None)
        ]
        return tuple(dict.fromkeys(d for d in map(_local_dir, candidates) if d is not None))

    def _check_output_dir_before_work(self, args: TrainingArguments) -> None:
        """Refuse an output folder overlapping the model folder, a non-empty one without ``overwrite``, or one that
        cannot be written. A folder holding checkpoints (a run that may be resumed) is accepted here; :meth:`train`
        refuses it unless it resumes or ``overwrite=True``."""
        out = Path(args.output_dir)
        overwrite = bool(getattr(args, "overwrite", False)) or bool(_checkpoint_dirs(out))
        check_output_dir(out, self._input_dirs, overwrite=overwrite)
        self._run_dir_claimed = False  # set by train(): the run folder is then this run's to write

    def _limit_max_length(self, args: BaseUnlearningConfig, model_config: Any) -> BaseUnlearningConfig:
        """Lower ``max_length`` to the model's maximum number of positions (a copy of ``args`` when changed), so
        that no sequence ever indexes past the position table."""
        limit = model_max_positions(model_config) if model_config is not None else None
        if limit is None or (args.max_length is not None and args.max_length <= limit):
            return args
        # a warning follows only when an example is actually truncated (see _check_truncation)
        args = copy.copy(args)
        args.max_length = limit
        return args

    def _check_truncation(self, before: int, prepared: Any, name: str, required: bool) -> None:
        """After TRL's preparation: refuse (forget) or warn about (retain) examples that truncation to
        ``max_length`` left without any answer token (TRL drops them), and warn about truncated ones."""
        if self._skip_prepare_dataset or not hasattr(prepared, "__len__"):
            return
        dropped = before - len(prepared)
        limit = self.args.max_length
        if dropped > 0:
            message = (
                f"{dropped} of the {before} {name} examples have no answer token within max_length={limit} (the "
                "prompt fills it); shorten the prompts or raise max_length within the model's positions."
            )
            if required:
                raise ValueError(message)
            warnings.warn(message + " They are left out.", stacklevel=3)
        if name in getattr(self, "_document_sets", ()):
            return
        if limit is not None and isinstance(prepared, Dataset) and "input_ids" in prepared.column_names:
            full = sum(len(ids) >= limit for ids in prepared["input_ids"])
            if full:
                warnings.warn(f"{full} {name} examples were truncated to max_length={limit} tokens.", stacklevel=3)

    # ----- reference model and helpers for the loss hook ---------------------------------------------------------

    def _create_reference_model(self, model_id: str | None, ref_model: Any = None) -> torch.nn.Module:
        """Frozen eval-mode reference (the initial model), prepared by accelerate like the policy.

        ``ref_model`` (the trainer's ``ref_model=``) is used as given. Otherwise the reference is reloaded from
        the model's path when one is known (``model_id``, or the live model's ``config._name_or_path`` when that
        is a local folder), as TRL's ``DPOTrainer`` does; a reload whose weights differ from the live model's (a
        model changed in memory since it was loaded) is dropped for an independent copy of the live model. A
        partitioned model (ZeRO-3 / FSDP, :func:`hf_unlearn.partitioning.is_partitioned`) is never copied: without
        a path to reload from it is refused with a ``ValueError`` naming ``ref_model=``."""
        from ...partitioning import is_partitioned

        live = self.accelerator.unwrap_model(self.model)
        ref = ref_model
        if ref is None:
            path = model_id or _local_dir(getattr(getattr(live, "config", None), "_name_or_path", None))
            ref = self._reload_reference(path, live, check=model_id is None) if path else None
        if ref is None:
            if is_partitioned(live):
                raise ValueError(
                    f"{type(self).__name__} needs a frozen reference model, and the model's weights are partitioned "
                    "across processes (DeepSpeed ZeRO-3 / FSDP), so they cannot be copied: load the model from a "
                    "folder (its reference is reloaded from there) or pass ref_model= (the initial model, loaded "
                    "separately)."
                )
            # SFTTrainer patched `forward` on the instance; a plain deep copy would still run the original's weights
            ref = independent_copy(live)
        ref.eval()
        ref.requires_grad_(False)
        if self.is_deepspeed_enabled:
            from trl.models import prepare_deepspeed

            return prepare_deepspeed(ref, self.accelerator)
        if self.is_fsdp_enabled:
            from trl.models import prepare_fsdp

            return prepare_fsdp(ref, self.accelerator)
        return self.accelerator.prepare_model(ref, evaluation_mode=True)

    def _reload_reference(self, path: str, live: Any, check: bool) -> torch.nn.Module | None:
        """The model reloaded from ``path`` (in the live model's dtype), or ``None`` when ``check`` and its weights
        are not exactly the live model's, or when a reload that was not asked for fails."""
        from ...partitioning import is_partitioned

        kwargs = dict(self.args.model_init_kwargs or {})
        kwargs.setdefault("dtype", live.dtype)
        if self.args.distributed_state.distributed_type in ["MULTI_GPU", "DEEPSPEED"]:
            kwargs["device_map"] = None
        try:
            ref = create_model_from_path(path, **kwargs)
        except Exception:
            if not check:
                raise
            return None
        if check and not is_partitioned(live) and not _same_weights(ref, live):
            return None
        return ref

    def _set_signature_columns_if_needed(self):
        super()._set_signature_columns_if_needed()
        extra = [RETAIN_PREFIX + c for c in self._signature_columns if not c.startswith(RETAIN_PREFIX)]
        self._signature_columns = list(dict.fromkeys([*self._signature_columns, *extra]))

    # ----- helpers for the loss hook -----------------------------------------------------------------------------

    def score(self, model: Any, inputs: dict[str, Any], prefix: str = "", **forward_kwargs) -> ScoredBatch:
        """Forward ``model`` on the ``prefix`` part of the batch (``""`` forget, ``"retain_"`` retain) and score
        its labels with :func:`hf_unlearn.logprobs.label_log_probs`. Extra keyword arguments go to the forward
        (e.g. ``output_hidden_states=True``)."""
        labels = inputs[prefix + "labels"]
        outputs = model(
            input_ids=inputs[prefix + "input_ids"],
            attention_mask=inputs.get(prefix + "attention_mask"),
            use_cache=False,
            **forward_kwargs,
        )
        return ScoredBatch(outputs.logits, labels, label_log_probs(outputs.logits, labels), answer_mask(labels), outputs)

    @torch.no_grad()
    def reference_scores(self, inputs: dict[str, Any], prefix: str = "", **forward_kwargs) -> ScoredBatch:
        """:meth:`score` under the frozen reference: the reference model, or with a PEFT adapter the same model
        with the adapter disabled. Without gradients."""
        if self.ref_model is not None:
            return self.score(self.ref_model, inputs, prefix, **forward_kwargs)
        unwrapped = self.accelerator.unwrap_model(self.model)
        if is_peft_model(unwrapped):
            with unwrapped.disable_adapter():
                return self.score(unwrapped, inputs, prefix, **forward_kwargs)
        raise RuntimeError(
            f"{type(self).__name__} has no reference model: override `needs_reference_model` to return True."
        )

    def retain_term(self, model: Any, inputs: dict[str, Any], denominators: LossDenominators) -> torch.Tensor:
        """The configured retain loss on the ``retain_`` part of the batch (unweighted): the retain NLL
        (:func:`~hf_unlearn.methods.base.losses.nll_loss`) or per-token ``KL(pi_ref || pi_theta)``
        (:func:`~hf_unlearn.methods.base.losses.kl_retain_loss`). Zero when the batch carries no retain examples."""
        if RETAIN_PREFIX + "input_ids" not in inputs:
            return torch.zeros((), device=inputs["input_ids"].device)
        retain = self.score(model, inputs, RETAIN_PREFIX)
        self.log_metric("retain_nll", retain.mean_nll)
        if getattr(self.args, "retain_loss", "nll") == "kl":
            ref = self.reference_scores(inputs, RETAIN_PREFIX)
            loss = kl_retain_loss(retain.logits, ref.logits, retain.labels, denominators.retain_tokens)
        else:
            loss = nll_loss(retain.token_log_probs, retain.mask, denominators.retain_tokens)
        self.log_metric("retain_loss", loss)
        return loss

    def log_metric(self, name: str, value: torch.Tensor | float) -> None:
        """Record a scalar for this step; it is averaged over steps and processes and logged with the loss.

        A ``"retain_nll"`` recorded during a training step also feeds the divergence guard."""
        mode = "train" if self.model.training else "eval"
        value = scalar_on_device(value, self.accelerator.device)
        self._unlearning_metrics[mode][name].append(value)
        if name == "retain_nll" and self._in_training_step:
            self._retain_nll_seen = True
            self.divergence_guard.observe(value)

    # ----- the loss hook -----------------------------------------------------------------------------------------

    def compute_unlearning_loss(
        self, model: Any, inputs: dict[str, Any], denominators: LossDenominators
    ) -> torch.Tensor:
        """Return the scalar loss of this micro-batch: the hook each method implements.

        ``inputs`` holds ``input_ids``, ``attention_mask``, ``labels`` (forget) and ``retain_input_ids``,
        ``retain_attention_mask``, ``retain_labels`` when the objective uses a retain set. Divide summed token-level
        terms by ``denominators.forget_tokens`` / ``retain_tokens`` and summed sequence-level terms by
        ``denominators.forget_sequences`` / ``retain_sequences``; the pure loss functions of the methods take
        these as ``num_tokens`` / ``num_sequences``.

        The base class holds no objective: the generic trainer, given an
        :class:`~hf_unlearn.methods.base.UnlearningConfig`, trains the baseline objective that config names,
        :func:`hf_unlearn.methods.baselines.trainer.baseline_objective` (formula:
        :func:`hf_unlearn.methods.baselines.loss.baseline_loss`); any other config raises ``NotImplementedError``.
        """
        from ..baselines.trainer import baseline_objective

        return baseline_objective(self, model, inputs, denominators)

    # ----- Trainer overrides: training -----------------------------------------------------------------------------

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        batch_samples, num_items_in_batch = super().get_batch_samples(epoch_iterator, num_batches, device)
        counts = sum((_batch_counts(b) for b in batch_samples), torch.zeros(4, dtype=torch.float64))
        scale = 1.0
        if self.args.average_tokens_across_devices and self.accelerator.num_processes > 1:
            gathered = self.accelerator.gather(counts.to(self.accelerator.device, torch.float32))
            counts = gathered.reshape(-1, 4).sum(0).double().cpu()
            scale = float(self.accelerator.num_processes)
        values = (counts / scale).clamp(min=1.0 / scale).float().to(device)
        self._step_denominators = LossDenominators(*values.unbind())
        return batch_samples, num_items_in_batch

    def training_step(self, *args, **kwargs):
        self._in_training_step = True
        try:
            return super().training_step(*args, **kwargs)
        finally:
            self._in_training_step = False

    def _denominators(self, inputs: dict[str, Any]) -> LossDenominators:
        if self._in_training_step and self._step_denominators is not None:
            return self._step_denominators
        device = inputs["input_ids"].device
        return LossDenominators(*_batch_counts(inputs).clamp(min=1.0).float().to(device).unbind())

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        # `num_items_in_batch` (forget tokens only) is superseded by the four totals of LossDenominators
        self._retain_nll_seen = False
        loss = self.compute_unlearning_loss(model, inputs, self._denominators(inputs))
        if self._in_training_step and not self._retain_nll_seen and RETAIN_PREFIX + "input_ids" in inputs:
            self._watch_retain(model, inputs)
        local_bad = not torch.isfinite(loss.detach()).item()
        if any_process(local_bad, self.accelerator):  # every process raises together (none waits alone)
            step = self.state.global_step + (1 if self._in_training_step else 0)
            where = "" if local_bad else " on another process"
            raise NonFiniteLossError(
                f"The unlearning loss of {type(self).__name__} is {'non-finite' if where else loss.item()}{where} "
                f"at step {step}; training stopped. Lower the learning rate, check the data, or (NPO/SimNPO) "
                "check `beta`."
            )
        return (loss, None) if return_outputs else loss

    def _watch_retain(self, model: Any, inputs: dict[str, Any]) -> None:
        """For an objective without a retain term: the retain NLL of the batch's retain half, scored in eval mode
        without gradient (no dropout, no RNG drawn, no effect on the update), logged as ``retain_nll`` and so fed
        to the divergence guard."""
        if self.divergence_guard.max_ratio is None:
            return
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                retain = self.score(model, inputs, RETAIN_PREFIX)
        finally:
            model.train(was_training)
        self.log_metric("retain_nll", retain.mean_nll)

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs)
        return loss.detach(), None, None

    def train(self, resume_from_checkpoint: str | bool | None = None, trial: Any = None, **kwargs):
        """:meth:`transformers.Trainer.train` with the unlearning checks.

        The whole run holds the lock of ``output_dir`` (:func:`hf_unlearn.safe_output.output_lock`, taken by the
        main process): while it trains, another run on the same folder is refused before any work, so the
        checkpoints of two runs never interleave. Without ``resume_from_checkpoint``, an output folder holding
        checkpoints of an earlier run is refused unless ``overwrite=True`` (they are then set aside, and deleted
        once this run has finished). With it (``True``: the latest complete checkpoint of ``output_dir``), a
        checkpoint written by another method, with other settings (learning rate, scheduler, loss, batch size,
        seed, ...; only the run's length may change) or on other forget/retain rows is refused before any work
        (:class:`ResumeMismatchError`); otherwise the run continues exactly where the checkpoint left it (same weights, optimizer, scheduler, RNG,
        data order, retain pairing and divergence-guard reference). A bf16/fp16 model whose learning rate is too
        small to change most of its weights gets a warning.
        """
        out = Path(self.args.output_dir)
        with output_lock(out, enabled=self.accelerator.is_main_process and self.args.should_save):
            if not self._run_dir_claimed and self.args.should_save:  # it may have changed since __init__ checked it
                self._check_output_dir_before_work(self.args)
            self._warn_on_vanishing_updates()
            stale: Path | None = None
            if resume_from_checkpoint not in (None, False):
                checkpoint = get_last_checkpoint(out) if resume_from_checkpoint is True and out.is_dir() else (
                    None if resume_from_checkpoint is True else resume_from_checkpoint)
                if checkpoint is not None:
                    self._check_resume(Path(checkpoint))
                    self._restore_guard(Path(checkpoint))
            elif _checkpoint_dirs(out) and self.args.should_save:
                if not getattr(self.args, "overwrite", False):
                    raise OutputDirError(
                        f"Output folder {out} holds checkpoints of an earlier run; pass resume_from_checkpoint=True "
                        "to continue it, or overwrite=True to start afresh."
                    )
                stale = Path(tempfile.mkdtemp(prefix=f".{out.name}.stale-", dir=out.parent))
                for path in _checkpoint_dirs(out):
                    os.replace(path, stale / path.name)
            self._run_dir_claimed = True
            try:
                result = super().train(resume_from_checkpoint=resume_from_checkpoint, trial=trial, **kwargs)
            except BaseException:
                if stale is not None and not _checkpoint_dirs(out):  # nothing new: put the earlier run back
                    for path in stale.iterdir():
                        os.replace(path, out / path.name)
                    stale.rmdir()
                elif stale is not None:
                    warnings.warn(f"The earlier run's checkpoints were set aside in {stale}.", stacklevel=2)
                raise
            if stale is not None:
                shutil.rmtree(stale, ignore_errors=True)
            return result

    def run_fingerprint(self) -> dict[str, Any]:
        """What makes a checkpoint of this run resumable by another trainer: the method (the trainer class), the
        settings that change the weights (every config field except where the run writes, how it logs, evaluates,
        loads data, saves memory or when its guard stops it) and the SHA-256 of the prepared forget and retain
        rows (their tokens and labels). Written into every checkpoint as ``unlearning_run.json``. The run's length
        (``max_steps``, ``num_train_epochs``) is not part of it: a resume may extend a run (the learning-rate
        schedule then follows the new length from the checkpoint on)."""
        if self._fingerprint is None:
            self._fingerprint = {
                "method": f"{type(self).__module__}.{type(self).__qualname__}",
                "settings": _tracked_settings(self.args),
                "data": {"forget": _rows_digest(self.forget_dataset), "retain": _rows_digest(self.retain_dataset)},
            }
        return self._fingerprint

    def _check_resume(self, checkpoint: Path) -> None:
        """Refuse a checkpoint whose run fingerprint differs from this trainer's (before any work)."""
        saved_file = checkpoint / FINGERPRINT_NAME
        if not saved_file.is_file():
            warnings.warn(
                f"{checkpoint} records no run fingerprint ({FINGERPRINT_NAME}); it cannot be checked to belong to "
                "this method, these settings and this data.", stacklevel=3,
            )
            return
        try:
            saved = json.loads(saved_file.read_text())
        except ValueError as exc:
            raise ResumeMismatchError(f"Cannot resume from {checkpoint}: {saved_file} is not valid JSON ({exc}).") from None
        diffs = fingerprint_differences(saved, self.run_fingerprint())
        if diffs:
            shown = "; ".join(diffs[:6]) + (f"; and {len(diffs) - 6} more" if len(diffs) > 6 else "")
            raise ResumeMismatchError(
                f"Cannot resume from {checkpoint}: it was written by another run ({shown}). Resume with the "
                "checkpoint's method, settings and data, or start afresh in another folder (or with overwrite)."
            )

    @property
    def divergence_guard(self) -> RetainDivergenceGuard:
        """The :class:`RetainDivergenceGuard` of this run (the restored one when transformers replaced it with
        ``restore_callback_states_from_checkpoint=True``)."""
        for callback in self.callback_handler.callbacks:
            if isinstance(callback, RetainDivergenceGuard):
                callback.reduce = self._mean_over_processes
                return callback
        return self._divergence_guard

    def _mean_over_processes(self, value: torch.Tensor) -> float:
        if self.accelerator.num_processes > 1:
            value = self.accelerator.gather(value.reshape(1).to(self.accelerator.device)).mean()
        return float(value)

    def _restore_guard(self, checkpoint: Path) -> None:
        state_file = checkpoint / TRAINER_STATE_NAME
        if not state_file.is_file():
            return
        saved = json.loads(state_file.read_text()).get("stateful_callbacks", {}).get(type(self.divergence_guard).__name__)
        if isinstance(saved, list):
            saved = saved[-1] if saved else None
        if saved:
            self.divergence_guard.reference = saved.get("attributes", {}).get("reference")

    def _warn_on_vanishing_updates(self) -> None:
        fraction = fraction_of_vanishing_updates(self.model, self.args.learning_rate)
        if fraction > 0.5:
            dtype = next((p.dtype for p in self.model.parameters() if p.requires_grad), None)
            warnings.warn(
                f"{fraction:.0%} of the trainable {dtype} weights are so large that an update of "
                f"learning_rate={self.args.learning_rate:g} rounds to zero in {dtype}: most of the model will not "
                "change. Load the model in float32 (mixed precision via bf16=True keeps fp32 master weights) or "
                "raise the learning rate.",
                stacklevel=3,
            )

    # ----- Trainer overrides: saving -----------------------------------------------------------------------------

    def _check_finite_weights(self, what: str) -> None:
        bad = non_finite_parameters(self.model)
        if any_process(bool(bad), self.accelerator):  # agreed, so that every process stops (sharded weights differ)
            bad = bad or ["a weight of another process"]
            last = get_last_checkpoint(self.args.output_dir) if os.path.isdir(self.args.output_dir) else None
            kept = f"the latest good checkpoint is {last}" if last else "no checkpoint was written"
            raise NonFiniteWeightsError(
                f"{len(bad)} trainable weight tensors hold NaN/inf at step {self.state.global_step} (first: "
                f"{bad[0]}); {what} was not written and training stopped ({kept}). Lower the learning rate."
            )

    def _get_output_dir(self, trial):
        if self._staging_dir is not None:
            return str(self._staging_dir)
        return super()._get_output_dir(trial)

    def _save_checkpoint(self, model, trial):
        """Check the weights, then write the checkpoint through :func:`stage_checkpoint`: every process writes its
        files (with several processes: each its RNG state) into one hidden staging folder of the run folder, and
        after all have written, the main process renames it into place, so that ``resume_from_checkpoint=True``
        only ever finds complete checkpoints. The run's fingerprint (:meth:`run_fingerprint`) goes with it."""
        self._check_finite_weights("the checkpoint")
        run_dir = Path(super()._get_output_dir(trial))
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        is_main = self.args.should_save
        staged: list[Path] = []

        def write(staging: Path) -> None:
            self._staging_dir = staging
            staged.append(staging)
            try:
                super(UnlearningTrainer, self)._save_checkpoint(model, trial)
            finally:
                self._staging_dir = None
            if is_main:
                from ...safe_output import atomic_write_text

                text = json.dumps(self.run_fingerprint(), indent=2, sort_keys=True)  # a setting may be inf
                atomic_write_text(staging / name / FINGERPRINT_NAME, text + "\n")

        if is_main:
            run_dir.mkdir(parents=True, exist_ok=True)
        stage_checkpoint(run_dir, name, write, is_main, self.accelerator.wait_for_everyone)
        for attr in ("best_model_checkpoint",):
            value = getattr(self.state, attr, None)
            if staged and isinstance(value, str) and value.startswith(str(staged[0])):
                setattr(self.state, attr, str(run_dir) + value[len(str(staged[0])):])
        if is_main and self.args.save_total_limit is not None:
            from transformers.trainer_utils import rotate_checkpoints

            rotate_checkpoints(
                output_dir=str(run_dir), save_total_limit=self.args.save_total_limit,
                best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=True,
            )

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save the model (weights, config, tokenizer) to ``output_dir`` (default ``args.output_dir``) safely.

        The trainable weights are checked finite first. The model is written in a temporary sibling folder and
        swapped in only when completely written; the run's checkpoints in ``args.output_dir`` are kept. A target
        other than ``args.output_dir`` (or ``args.output_dir`` before :meth:`train` claimed it) is checked like
        the output folder (not the model folder, empty unless ``overwrite=True``). A failed write (full disk,
        read-only folder) raises a one-line :class:`~hf_unlearn.safe_output.OutputWriteError` and leaves the
        previous content as it was. Inside a checkpoint, and under FSDP / DeepSpeed (which write from every
        process), transformers writes in place."""
        if self._staging_dir is not None or self.is_fsdp_enabled or self.is_deepspeed_enabled:
            return super().save_model(output_dir, _internal_call)
        self._check_finite_weights("the model")
        if not self.args.should_save:  # the main process checks and writes; DDP's others write nothing
            return super().save_model(output_dir, _internal_call=True)
        out = Path(output_dir if output_dir is not None else self.args.output_dir)
        run_dir = Path(self.args.output_dir).expanduser().resolve()
        is_run_dir = out.expanduser().resolve() == run_dir
        claimed = is_run_dir and self._run_dir_claimed
        check_output_dir(out, self._input_dirs, overwrite=claimed or bool(getattr(self.args, "overwrite", False)))
        try:
            with atomic_directory(out, overwrite=True, keep=RUN_ENTRIES if is_run_dir else ()) as tmp:
                super().save_model(str(tmp), _internal_call=True)
        except OSError as exc:
            reason = (exc.strerror or str(exc)).replace("\n", " ")
            raise OutputWriteError(
                f"Could not write the model to {out}: {reason}. The previous content of {out} is unchanged."
            ) from exc
        if self.args.push_to_hub and not _internal_call:
            self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)

    def create_model_card(self, model_name: str | None = None, dataset_name: str | None = None,
                          tags: str | list[str] | None = None, report: Any = None, forget_split: str | None = None):
        """Write ``README.md``: the method, its paper and settings, and the evaluator's ``report`` (a dict or JSON
        path, e.g. ``trainer.push_to_hub(report=...)``) as ``model-index`` (:func:`hf_unlearn.hub.trainer_model_card`)."""
        if not self.is_world_process_zero():
            return
        from ...hub import trainer_model_card
        from ...safe_output import atomic_write_text

        card = trainer_model_card(self, model_name, dataset_name, tags, report=report, forget_split=forget_split)
        atomic_write_text(Path(self.args.output_dir) / "README.md", str(card))

    def push_to_hub(self, commit_message: str | None = "End of training", blocking: bool = True,
                    token: str | None = None, revision: str | None = None, private: bool | None = None,
                    **kwargs: Any) -> Any:
        """Save the model, write its card (``kwargs``, e.g. ``report=``, go to :meth:`create_model_card`) and upload
        ``args.output_dir`` (without ``checkpoint-*`` and ``_*`` entries) to ``args.hub_model_id`` in one commit
        with :func:`hf_unlearn.hub.push.push_folder`. The steps and arguments are transformers'
        ``Trainer.push_to_hub``'s; returns the ``CommitInfo`` (a future of it when not ``blocking``)."""
        from ...hub.push import push_folder

        self.callback_handler.on_push_begin(self.args, self.state, self.control)
        model_name = kwargs.pop("model_name", None)
        if model_name is None and self.args.should_save:
            hub_id = self.args.hub_model_id
            model_name = Path(self.args.output_dir).name if hub_id is None else hub_id.split("/")[-1]
        token = token if token is not None else self.args.hub_token
        if self.hub_model_id is None:
            self.init_hf_repo(token=token, private=private)
        self.save_model(_internal_call=True)  # every process (TPU); only args.should_save writes
        if not self.is_world_process_zero():
            return None
        model_tags = getattr(self.model, "model_tags", None)
        if model_tags is not None:
            tags = kwargs.get("tags") or []
            tags = [tags] if isinstance(tags, str) else list(tags)
            kwargs["tags"] = tags + [t for t in model_tags if t not in tags]
        self.create_model_card(model_name=model_name, **kwargs)
        self._finish_current_push()
        return push_folder(
            self.args.output_dir, self.hub_model_id, token=token, private=private,
            revision=revision if revision is not None else self.args.hub_revision,
            commit_message=commit_message or "End of training",
            ignore_patterns=("_*", f"{PREFIX_CHECKPOINT_DIR}-*"), run_as_future=not blocking,
        )

    # ----- end of a run ------------------------------------------------------------------------------------------

    def end_training(self) -> None:
        """Finish a distributed run cleanly: release the DDP wrapper, then destroy the process group.

        Call it once, after `train()` and `save_model()`, at the end of a `torchrun` script (a single-process run
        may call it too; it then only drops the trainer's prepared objects). The order matters: when the process
        group is destroyed first, DDP's reducer is left holding the last reference to the gloo group, and freeing it
        later joins gloo's worker threads while holding the GIL; a worker still finishing the last all-gather needs
        the GIL to free its tensors, and both wait forever (pytorch/pytorch#56297). Releasing the wrapper while the
        group is still registered avoids that. The trainer cannot train again afterwards.
        """
        self.model_wrapped = self.model
        self.accelerator.free_memory()
        gc.collect()
        self.accelerator.end_training()

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "train" if self.model.training else "eval"
        metrics = self._unlearning_metrics[mode]
        if metrics:
            names = sorted(metrics)
            local = torch.stack([torch.stack(metrics[n]).mean() for n in names]).to(self.accelerator.device)
            means = self.accelerator.gather(local).reshape(-1, len(names)).mean(0).tolist()
            prefix = "eval_" if mode == "eval" else ""
            logs.update({prefix + n: round(v, 6) for n, v in zip(names, means)})
            metrics.clear()
        super().log(logs, start_time)
