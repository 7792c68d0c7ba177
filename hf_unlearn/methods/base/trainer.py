"""The base unlearning trainer: a ``trl.SFTTrainer`` whose batches pair each forget example with a retain example.
A method implements :meth:`UnlearningTrainer.compute_unlearning_loss` with the helpers :meth:`score`,
:meth:`reference_scores`, :meth:`retain_term` and :meth:`log_metric`."""

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
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from accelerate.utils import is_peft_model
from datasets import Dataset
from transformers import (
    AutoConfig,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    TrainerCallback,
    TrainingArguments,
)
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint
from trl import SFTTrainer
from trl.trainer.utils import get_config_model_id

from ...data import is_documents, model_max_positions, overlapping_examples
from ...logprobs import label_log_probs
from ...result import TrainingOutcome
from ...safe_output import (
    OutputDirError,
    OutputWriteError,
    atomic_directory,
    atomic_write_text,
    check_output_dir,
    gated_path,
    output_lock,
)
from .checkpoints import (
    FINGERPRINT_NAME,
    RUN_ENTRIES,
    RUN_REQUEST_NAME,
    _checkpoint_dirs,
    check_resume,
    run_fingerprint,
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
    saved_guard_state,
)
from .losses import (
    LossDenominators,
    ScoredBatch,
    answer_mask,
    batch_counts,
    kl_retain_loss,
    nll_loss,
    scalar_on_device,
)
from .pairing import (
    RETAIN_PREFIX,
    PairedCollator,
    PairedForgetRetainDataset,
    PairingEpochCallback,
    _identity_keys,
    as_dataset,
    to_trl_format,
)
from .reference import RELOAD_WITHOUT_DEVICE_MAP, _local_dir, frozen_reference, reload_reference

if TYPE_CHECKING:
    from peft import PeftConfig
    from transformers import BitsAndBytesConfig

#: A forget, retain or evaluation set: a ``datasets.Dataset``, a list of row dicts, or documents (strings, a path).
Rows = Dataset | Sequence[Any] | str | os.PathLike
#: ``Trainer``'s ``optimizers``: an optimizer and a learning-rate scheduler, either ``None`` to build the default
Optimizers = tuple[torch.optim.Optimizer | None, torch.optim.lr_scheduler.LambdaLR | None]


def check_output_folder(args: Any, input_dirs: tuple[str, ...]) -> None:
    """Refuse an output folder overlapping a model folder, non-empty without ``overwrite`` (checkpoints or only
    ``logs/run_request.json`` count as empty), or not writable."""
    out = Path(args.output_dir)
    try:
        request_only = ([p.name for p in out.iterdir()] == ["logs"] and not (out / "logs").is_symlink()
                        and [p.name for p in (out / "logs").iterdir()] == [RUN_REQUEST_NAME])
    except OSError:
        request_only = False
    overwrite = bool(getattr(args, "overwrite", False)) or bool(_checkpoint_dirs(out)) or request_only
    check_output_dir(out, input_dirs, overwrite=overwrite)


class UnlearningTrainer(SFTTrainer):
    """Base class of the unlearning trainers (a TRL ``SFTTrainer``).

    ``train_dataset`` is the forget set, ``retain_dataset`` the retain set; both go through ``SFTTrainer``'s
    preparation (TOFU rows via :func:`to_trl_format`; documents as chunks of ``max_length`` tokens). A batch holds
    ``input_ids``, ``attention_mask``, ``labels`` and the same keys prefixed with ``retain_``
    (:class:`PairedForgetRetainDataset`). A method overrides :meth:`compute_unlearning_loss` and, as needed,
    :meth:`needs_retain`, :meth:`needs_reference_model` and :meth:`check_hyperparameters`, with its
    ``config_class`` (``preset``: the field values that define the method).

    Refused before any work: an output folder overlapping the model folder or not empty (unless ``overwrite``),
    a forget example left without answer tokens, hyperparameters the objective cannot use. Training stops on a
    non-finite loss or weights and when the retain NLL diverges (:class:`RetainDivergenceGuard`). ``ref_model=``
    passes the frozen reference (needed under ZeRO-3 / FSDP for a model without a folder).

    Private ``Trainer`` methods overridden, each because no public hook does the job:

    * ``_set_signature_columns_if_needed``: the ``retain_`` keys (``_batch_prefixes``) must survive
      ``remove_unused_columns``.
    * ``_save_checkpoint``: the checkpoint is staged and renamed into place once every process has written.
    * ``_get_output_dir``: names the staging folder while a checkpoint is written.
    """

    _tag_names = ["trl", "hf-unlearn", "unlearning"]
    _name = "Unlearning"
    #: the config dataclass ``args`` is resolved to (its defaults are the method's defaults)
    config_class: ClassVar[type[BaseUnlearningConfig]] = UnlearningConfig
    #: config values that define the method: applied when another config is converted, required of a ``config_class``
    preset: ClassVar[dict[str, Any]] = {}
    #: whether the trainer unlearns documents (plain texts, chunked) as well as question/answer rows
    accepts_documents: ClassVar[bool] = True
    #: prefixes of the batch keys besides the forget half's, kept by ``remove_unused_columns``
    _batch_prefixes: ClassVar[tuple[str, ...]] = (RETAIN_PREFIX,)
    # compute_loss divides by the totals of the accumulation step itself (see LossDenominators)
    loss_is_scaled_for_ga = True

    def __init__(
        self, model: str | PreTrainedModel, args: BaseUnlearningConfig | TrainingArguments | None = None,
        data_collator: Callable | None = None, train_dataset: Rows | None = None,
        retain_dataset: Rows | None = None, eval_dataset: Rows | dict[str, Rows] | None = None,
        processing_class: PreTrainedTokenizerBase | None = None,
        callbacks: list[TrainerCallback] | None = None, optimizers: Optimizers = (None, None),
        optimizer_cls_and_kwargs: tuple[type[torch.optim.Optimizer], dict[str, Any]] | None = None,
        quantization_config: BitsAndBytesConfig | None = None, peft_config: PeftConfig | None = None,
        ref_model: PreTrainedModel | None = None,
    ):
        # the model's local folders, refused as output folders
        candidates = [model] if isinstance(model, (str, os.PathLike)) else [
            getattr(model, "name_or_path", None), getattr(getattr(model, "config", None), "_name_or_path", None)
        ]
        self._input_dirs = tuple(dict.fromkeys(d for d in map(_local_dir, candidates) if d is not None))
        self._run_dir_claimed = False
        self._staging_dir: Path | None = None
        self._document_sets: set[str] = set()  # their chunks fill max_length by design
        self._unlearning_metrics: dict[str, dict[str, list[torch.Tensor]]] = {
            "train": defaultdict(list), "eval": defaultdict(list)
        }
        self._step_denominators: LossDenominators | None = None
        self._in_training_step = False
        self._retain_nll_seen = False
        self._fingerprint: dict[str, Any] | None = None

        args = self._resolve_args(args, model)
        if train_dataset is None:
            raise ValueError("`train_dataset` (the forget set) is required.")
        args, processing_class, forget, retain, eval_dataset = self._check_inputs(
            model, args, train_dataset, retain_dataset, eval_dataset, processing_class
        )
        self._divergence_guard = RetainDivergenceGuard(args.max_retain_loss_ratio, args.min_retain_loss_reference)
        super().__init__(
            model=model, args=args, data_collator=data_collator, train_dataset=forget, eval_dataset=eval_dataset,
            processing_class=processing_class, callbacks=[*(callbacks or []), self._divergence_guard],
            optimizers=optimizers, optimizer_cls_and_kwargs=optimizer_cls_and_kwargs,
            quantization_config=quantization_config, peft_config=peft_config,
        )
        self._check_truncation(len(forget), self.train_dataset, "forget", required=True)
        # each forget example paired with a retain example, partners redrawn every epoch
        self.forget_dataset: Dataset = self.train_dataset
        if retain is not None and not self._skip_prepare_dataset:
            prepared = self._prepare_dataset(retain, self.processing_class, self.args, False, None, "retain")
            self._check_truncation(len(retain), prepared, "retain", required=False, stacklevel=3)
            retain = prepared
        if retain is not None and len(retain) == 0:
            raise ValueError("No retain example is left after tokenization/truncation (check `max_length`).")
        self.retain_dataset: Dataset | None = retain
        if self.retain_dataset is not None:
            self.train_dataset = PairedForgetRetainDataset(self.forget_dataset, self.retain_dataset, seed=self.args.seed)
            self.add_callback(PairingEpochCallback(self.train_dataset))
        self.data_collator = PairedCollator(self.data_collator)
        self.ref_model = None
        if self.needs_reference_model(self.args) and not is_peft_model(self.model):
            self.ref_model = self._create_reference_model(model if isinstance(model, str) else None, ref_model)
        self._finish_init()

    def _finish_init(self) -> None:
        """What a method sets up once the model and data are prepared (default: nothing)."""

    def _check_inputs(
        self, model: Any, args: BaseUnlearningConfig, train_dataset: Any, retain_dataset: Any, eval_dataset: Any,
        processing_class: Any,
    ) -> tuple[BaseUnlearningConfig, Any, Dataset, Dataset | None, Any]:
        """Check the output folder and ``max_length``; return ``(args, processing_class, forget, retain,
        eval_dataset)``, the sets in TRL's format."""
        check_output_folder(args, self._input_dirs)
        model_config = AutoConfig.from_pretrained(model, trust_remote_code=False) if isinstance(model, str) else getattr(model, "config", None)
        limit = model_max_positions(model_config) if model_config is not None else None
        if limit is not None and (args.max_length is None or args.max_length > limit):
            args = copy.copy(args)  # a warning follows only when an example is truncated
            args.max_length = limit
        if processing_class is None:
            model_id = model if isinstance(model, str) else get_config_model_id(model.config)
            processing_class = AutoTokenizer.from_pretrained(model_id, trust_remote_code=False)
        template = getattr(args, "prompt_template", None)
        raw_forget = as_dataset(train_dataset)
        if len(raw_forget) == 0:
            raise ValueError("The forget set (`train_dataset`) is empty: nothing to unlearn.")
        if is_documents(raw_forget):
            self._document_sets.add("forget")
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
        return args, processing_class, forget, retain, eval_dataset

    def _check_retain(self, retain_dataset: Any, forget: Dataset, args: BaseUnlearningConfig, tokenizer: Any):
        """The retain set in TRL's format; ``None`` (with a warning) when unused, refused when empty or sharing
        rows with the forget set."""
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
            warnings.warn(f"{type(self).__name__} does not use a retain set here; `retain_dataset` is ignored.", stacklevel=4)
            return None
        retain = as_dataset(retain_dataset)
        if len(retain) == 0:
            raise ValueError("The retain set (`retain_dataset`) is empty: a retain example is needed per forget example.")
        keys = _identity_keys(forget)
        shared = overlapping_examples(forget, retain, keys=keys) if keys and keys == _identity_keys(retain) else 0
        if shared and not args.allow_overlap:
            raise ValueError(
                f"{shared} of the {len(forget)} forget examples also occur in the retain set: the objective "
                "would push their likelihood down and up at once. Remove them, or set `allow_overlap=True`."
            )
        if shared:
            warnings.warn(f"{shared} forget examples also occur in the retain set (allow_overlap=True).", stacklevel=4)
        if is_documents(retain):
            self._document_sets.add("retain")
        return to_trl_format(retain, tokenizer, getattr(args, "prompt_template", None), args.max_length)

    def _check_truncation(self, before: int, prepared: Any, name: str, required: bool, stacklevel: int = 3) -> None:
        """Refuse (``required``) or warn about examples truncation left without an answer token (TRL drops
        them); warn about truncated ones."""
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
            warnings.warn(message + " They are left out.", stacklevel=stacklevel)
        if name in self._document_sets:
            return
        if limit is not None and isinstance(prepared, Dataset) and "input_ids" in prepared.column_names:
            full = sum(len(ids) >= limit for ids in prepared["input_ids"])
            if full:
                warnings.warn(f"{full} {name} examples were truncated to max_length={limit} tokens.", stacklevel=stacklevel)

    def _set_signature_columns_if_needed(self):
        super()._set_signature_columns_if_needed()
        own = [c for c in self._signature_columns if not c.startswith(self._batch_prefixes)]
        extra = [prefix + c for prefix in self._batch_prefixes for c in own]
        self._signature_columns = list(dict.fromkeys([*self._signature_columns, *extra]))

    @classmethod
    def _resolve_args(cls, args: Any, model: Any) -> BaseUnlearningConfig:
        """``args`` as a ``cls.config_class`` (another config's shared fields with ``cls.preset`` applied), then
        checked; warns about a value carried from another config's default."""
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
        cls.check_hyperparameters(args)
        return args

    @classmethod
    def check_hyperparameters(cls, args: BaseUnlearningConfig) -> None:
        """Raise a ``ValueError`` for hyperparameters this objective cannot use (override to add checks)."""

    @classmethod
    def needs_retain(cls, args: BaseUnlearningConfig) -> bool:
        """Whether the objective uses the retain set (default: ``retain_loss != "none"``, ``retain_weight > 0``)."""
        return getattr(args, "retain_loss", "nll") != "none" and getattr(args, "retain_weight", 1.0) > 0

    @classmethod
    def needs_reference_model(cls, args: BaseUnlearningConfig) -> bool:
        """Whether the objective needs the frozen reference model (default: for the KL retain term)."""
        return cls.needs_retain(args) and getattr(args, "retain_loss", None) == "kl"

    @classmethod
    def watches_retain(cls, args: BaseUnlearningConfig) -> bool:
        """Whether a retain set unused by the objective is kept to feed the divergence guard."""
        return not cls.needs_retain(args) and getattr(args, "max_retain_loss_ratio", None) is not None

    @classmethod
    def forget_columns(cls, args: BaseUnlearningConfig) -> tuple[str, ...]:
        """Columns of a forget row the trainer reads besides ``question`` and ``answer`` (default: none)."""
        return ()

    def training_outcome(self) -> TrainingOutcome:
        """How the run ended (:class:`~hf_unlearn.result.TrainingOutcome`)."""
        return TrainingOutcome(global_step=self.state.global_step)

    def _create_reference_model(self, model_id: str | None, ref_model: Any = None) -> torch.nn.Module:
        """The frozen initial model (:func:`.reference.frozen_reference`), prepared by accelerate."""
        live = self.accelerator.unwrap_model(self.model)
        ref = frozen_reference(live, model_id, ref_model, self._reload_reference, type(self).__name__)
        if self.is_deepspeed_enabled:
            from trl.models import prepare_deepspeed

            return prepare_deepspeed(ref, self.accelerator)
        if self.is_fsdp_enabled:
            from trl.models import prepare_fsdp

            return prepare_fsdp(ref, self.accelerator)
        return self.accelerator.prepare_model(ref, evaluation_mode=True)

    def _reload_reference(self, path: str, live: Any, check: bool) -> torch.nn.Module | None:
        whole = self.args.distributed_state.distributed_type in RELOAD_WITHOUT_DEVICE_MAP or self.is_fsdp_enabled
        return reload_reference(path, live, check, self.args.model_init_kwargs, whole)

    def score(self, model: Any, inputs: dict[str, Any], prefix: str = "", **forward_kwargs) -> ScoredBatch:
        """Forward ``model`` on the ``prefix`` part of the batch (``""`` forget, ``"retain_"`` retain) and score
        its labels; extra keyword arguments go to the forward."""
        labels = inputs[prefix + "labels"]
        outputs = model(
            input_ids=inputs[prefix + "input_ids"], attention_mask=inputs.get(prefix + "attention_mask"),
            use_cache=False, **forward_kwargs,
        )
        return ScoredBatch(outputs.logits, labels, label_log_probs(outputs.logits, labels), answer_mask(labels), outputs)

    @torch.no_grad()
    def reference_scores(self, inputs: dict[str, Any], prefix: str = "", **forward_kwargs) -> ScoredBatch:
        """:meth:`score` under the frozen reference, without gradients: the reference model, or the PEFT model
        with its adapter disabled (through ``model_wrapped``, so that FSDP gathers its shards)."""
        if self.ref_model is not None:
            return self.score(self.ref_model, inputs, prefix, **forward_kwargs)
        unwrapped = self.accelerator.unwrap_model(self.model)
        if is_peft_model(unwrapped):
            wrapped = getattr(self, "model_wrapped", None) or self.model
            with unwrapped.disable_adapter():
                return self.score(wrapped, inputs, prefix, **forward_kwargs)
        raise RuntimeError(
            f"{type(self).__name__} has no reference model: override `needs_reference_model` to return True."
        )

    def retain_term(self, model: Any, inputs: dict[str, Any], denominators: LossDenominators) -> torch.Tensor:
        """The unweighted retain loss (``retain_loss``: :func:`nll_loss` or :func:`kl_retain_loss`); zero when
        the batch carries no retain examples."""
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

    def compute_unlearning_loss(
        self, model: Any, inputs: dict[str, Any], denominators: LossDenominators
    ) -> torch.Tensor:
        """The scalar loss of this micro-batch, the hook each method implements. Divide summed token-level terms
        by ``denominators.forget_tokens`` / ``retain_tokens`` and sequence-level ones by ``forget_sequences`` /
        ``retain_sequences``."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement `compute_unlearning_loss`: UnlearningTrainer is the base of the "
            "unlearning trainers and holds no objective. Train a baseline objective with the baselines' trainers "
            "(hf_unlearn.methods.baselines: BaselineTrainer, GradAscentTrainer, GradDiffTrainer, NPOTrainer, "
            "SimNPOTrainer)."
        )

    def log_metric(self, name: str, value: torch.Tensor | float) -> None:
        """Record a scalar, logged as ``mean_processes(mean_steps(value))``; a ``"retain_nll"`` recorded in a
        training step also feeds the divergence guard."""
        mode = "train" if self.model.training else "eval"
        value = scalar_on_device(value, self.accelerator.device)
        self._unlearning_metrics[mode][name].append(value)
        if name == "retain_nll" and self._in_training_step:
            self._retain_nll_seen = True
            self.divergence_guard.observe(value)

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

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        batch_samples, num_items_in_batch = super().get_batch_samples(epoch_iterator, num_batches, device)
        counts = sum((batch_counts(b) for b in batch_samples), torch.zeros(4, dtype=torch.float64))
        self._step_denominators = LossDenominators(*self._step_totals(counts).to(device).unbind())
        return batch_samples, num_items_in_batch

    def _step_totals(self, counts: torch.Tensor) -> torch.Tensor:
        """A step's ``[n]`` float64 counts, summed over processes and divided by their number under
        ``average_tokens_across_devices`` (DDP averages gradients), floored at ``1 / processes``; float32."""
        scale = 1.0
        if self.args.average_tokens_across_devices and self.accelerator.num_processes > 1:
            gathered = self.accelerator.gather(counts.to(self.accelerator.device, torch.float32))
            counts = gathered.reshape(-1, counts.numel()).sum(0).double().cpu()
            scale = float(self.accelerator.num_processes)
        return (counts / scale).clamp(min=1.0 / scale).float()

    def training_step(self, *args, **kwargs):
        self._in_training_step = True
        try:
            return super().training_step(*args, **kwargs)
        finally:
            self._in_training_step = False

    @property
    def in_training_step(self) -> bool:
        return self._in_training_step

    def _denominators(self, inputs: dict[str, Any]) -> LossDenominators:
        if self._in_training_step and self._step_denominators is not None:
            return self._step_denominators
        device = inputs["input_ids"].device
        return LossDenominators(*batch_counts(inputs).clamp(min=1.0).float().to(device).unbind())

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

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs)
        return loss.detach(), None, None

    @property
    def divergence_guard(self) -> RetainDivergenceGuard:
        """This run's :class:`RetainDivergenceGuard` (the restored one after a resume)."""
        for callback in self.callback_handler.callbacks:
            if isinstance(callback, RetainDivergenceGuard):
                callback.reduce = self._mean_over_processes
                return callback
        return self._divergence_guard

    def _restore_callback(self, callback: Any) -> Any:
        """The callback of ``callback``'s class that a resume restored (else ``callback``, added), its saved state
        loaded whatever ``restore_callback_states_from_checkpoint`` says."""
        kind = type(callback)
        current = next((cb for cb in self.callback_handler.callbacks if isinstance(cb, kind)), None)
        if current is None:
            self.add_callback(callback)
            current = callback
        stored = self.state.stateful_callbacks.get(kind.__name__)
        if isinstance(stored, list):
            stored = stored[-1] if stored else None
        if stored:
            current.load_state(stored)
        return current

    def _mean_over_processes(self, value: torch.Tensor) -> float:
        if self.accelerator.num_processes > 1:
            value = self.accelerator.gather(value.reshape(1).to(self.accelerator.device)).mean()
        return float(value)

    def _watch_retain(self, model: Any, inputs: dict[str, Any]) -> None:
        """Log the retain NLL (fed to the guard) for an objective without a retain term: eval mode, no
        gradient, so no dropout RNG is drawn and the update is unchanged."""
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

    def train(self, resume_from_checkpoint: str | bool | None = None, trial: Any = None, **kwargs):
        """:meth:`transformers.Trainer.train` holding the lock of ``output_dir``. Earlier checkpoints are refused
        unless resumed or ``overwrite=True``; a resume refuses a checkpoint of another method, settings or rows
        (:class:`~hf_unlearn.methods.base.checkpoints.ResumeMismatchError`) and otherwise continues exactly."""
        out = Path(self.args.output_dir)
        with output_lock(out, enabled=self.accelerator.is_main_process and self.args.should_save):
            if not self._run_dir_claimed and self.args.should_save:  # it may have changed since __init__ checked it
                check_output_folder(self.args, self._input_dirs)
            self._warn_on_vanishing_updates()
            stale: Path | None = None
            if resume_from_checkpoint not in (None, False):
                checkpoint = get_last_checkpoint(out) if resume_from_checkpoint is True and out.is_dir() else (
                    None if resume_from_checkpoint is True else resume_from_checkpoint)
                if checkpoint is not None:
                    check_resume(Path(checkpoint), self.run_fingerprint())
                    saved = saved_guard_state(Path(checkpoint))
                    if saved:
                        self.divergence_guard.reference = saved.get("attributes", {}).get("reference")
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

    def _get_output_dir(self, trial):
        if self._staging_dir is not None:
            return str(self._staging_dir)
        return super()._get_output_dir(trial)

    def _save_checkpoint(self, model, trial):
        """Check the weights, then write the checkpoint with its :meth:`run_fingerprint` through
        :func:`stage_checkpoint`."""
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
                text = json.dumps(self.run_fingerprint(), indent=2, sort_keys=True)  # a setting may be inf
                atomic_write_text(staging / name / FINGERPRINT_NAME, text + "\n")

        if is_main:
            gated_path(run_dir).mkdir(parents=True, exist_ok=True)
        stage_checkpoint(run_dir, name, write, is_main, self.accelerator.wait_for_everyone)
        best = self.state.best_model_checkpoint
        if staged and isinstance(best, str) and best.startswith(str(staged[0])):
            self.state.best_model_checkpoint = str(run_dir) + best[len(str(staged[0])):]
        if is_main and self.args.save_total_limit is not None:
            from transformers.trainer_utils import rotate_checkpoints

            rotate_checkpoints(
                output_dir=str(run_dir), save_total_limit=self.args.save_total_limit,
                best_model_checkpoint=self.state.best_model_checkpoint, use_mtime=True,
            )

    def run_fingerprint(self) -> dict[str, Any]:
        """This run's :func:`.checkpoints.run_fingerprint`, written into every checkpoint and checked on resume."""
        if self._fingerprint is None:
            self._fingerprint = run_fingerprint(type(self), self.args, self.forget_dataset, self.retain_dataset)
        return self._fingerprint

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save the model, weights checked finite, built in a temporary folder and swapped in once complete; a
        failed write raises :class:`~hf_unlearn.safe_output.OutputWriteError` and leaves the previous content."""
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
        """Write ``README.md`` (:func:`hf_unlearn.hub.trainer_model_card`; ``report``: the evaluator's, a dict
        or JSON path, as ``model-index``)."""
        if not self.is_world_process_zero():
            return
        from ...hub import trainer_model_card

        card = trainer_model_card(self, model_name, dataset_name, tags, report=report, forget_split=forget_split)
        section = self.card_section()
        if section:
            card.text = card.text.rstrip("\n") + "\n\n" + section + "\n"
        atomic_write_text(Path(self.args.output_dir) / "README.md", str(card))

    def card_section(self) -> str:
        """Markdown the method appends to its model card (default: none)."""
        return ""

    def push_to_hub(self, commit_message: str | None = "End of training", blocking: bool = True,
                    token: str | None = None, revision: str | None = None, private: bool | None = None,
                    **kwargs: Any) -> Any:
        """``Trainer.push_to_hub``'s steps, the card written by :meth:`create_model_card` (``kwargs``), the folder
        uploaded without ``checkpoint-*`` and ``_*`` entries in one commit; returns the ``CommitInfo``."""
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

    def release_training_state(self) -> None:
        """Free what only training needs (optimizer, scheduler, reference model, accelerate's references); the
        trainer cannot train again afterwards."""
        self.optimizer = self.lr_scheduler = None
        self.callback_handler.optimizer = self.callback_handler.lr_scheduler = None
        self.ref_model = None
        self.model_wrapped = self.model
        self.accelerator.free_memory()
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def end_training(self) -> None:
        """Release the DDP wrapper, then destroy the process group (call once at the end of a ``torchrun``
        script). In the other order DDP's reducer holds the last reference to the gloo group and freeing it can
        deadlock on the GIL. The trainer cannot train again afterwards."""
        self.model_wrapped = self.model
        self.accelerator.free_memory()
        gc.collect()
        self.accelerator.end_training()

    #: Whether the trainer stops itself by a rule of its own (its strength selection).
    stops_itself: ClassVar[bool] = False

    def method_metrics(self, tokenizer: Any, forget: Any, retain: Any) -> dict[str, float]:
        """Numbers only this method can measure after training, copied into the run's result (default: none)."""
        return {}

    @classmethod
    def check_forget_rows(cls, rows: Any, args: BaseUnlearningConfig) -> None:
        """Raise a ``ValueError`` naming the first forget row lacking what this trainer reads beyond
        question and answer."""
