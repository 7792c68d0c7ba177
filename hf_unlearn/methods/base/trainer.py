"""The base unlearning trainer: a ``trl.SFTTrainer`` whose batches pair each forget example with a retain example.

A method implements :meth:`UnlearningTrainer.compute_unlearning_loss` with the helpers here (:meth:`score`,
:meth:`reference_scores`, :meth:`retain_term`, :meth:`log_metric`). The pure pieces live beside it: the pairing
(:mod:`.pairing`), the loss normalisation (:mod:`.losses`), the input checks (:mod:`.inputs`), the reference model
(:mod:`.reference`), the guards (:mod:`.guards`) and the checkpoint staging and fingerprint (:mod:`.checkpoints`).
"""

from __future__ import annotations

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

from ...data import is_documents
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
from .inputs import check_disjoint, check_output_folder, limit_max_length, model_dirs
from .losses import LossDenominators, ScoredBatch, answer_mask, batch_counts, kl_retain_loss, nll_loss
from .metrics import scalar_on_device
from .pairing import (
    RETAIN_PREFIX,
    PairedCollator,
    PairedForgetRetainDataset,
    PairingEpochCallback,
    as_dataset,
    to_trl_format,
)
from .reference import RELOAD_WITHOUT_DEVICE_MAP, frozen_reference, reload_reference

if TYPE_CHECKING:
    from peft import PeftConfig
    from transformers import BitsAndBytesConfig

#: What a trainer takes as a forget, retain or evaluation set: a ``datasets.Dataset``, a list of row dicts, or
#: (documents) a list of strings or a ``.txt`` / ``.json`` / ``.jsonl`` path.
Rows = Dataset | Sequence[Any] | str | os.PathLike
#: ``Trainer``'s ``optimizers``: an optimizer and a learning-rate scheduler, either ``None`` to build the default
Optimizers = tuple[torch.optim.Optimizer | None, torch.optim.lr_scheduler.LambdaLR | None]


class UnlearningTrainer(SFTTrainer):
    """Base class of the unlearning trainers (a TRL ``SFTTrainer``).

    ``train_dataset`` is the forget set, ``retain_dataset`` the retain set; both go through ``SFTTrainer``'s
    preparation (TOFU ``question``/``answer`` rows tokenized by :func:`to_trl_format` with ``args.prompt_template``,
    TRL prompt/completion or conversational rows: labels on the completion; documents: chunks of ``max_length``
    tokens, labels on every token). Each training example is a forget example paired with a retain example
    (:class:`PairedForgetRetainDataset`): a batch holds ``input_ids``, ``attention_mask``, ``labels`` and the same
    keys prefixed with ``retain_``.

    The base holds no objective: a method overrides :meth:`compute_unlearning_loss` and, as needed,
    :meth:`needs_retain`, :meth:`needs_reference_model` and :meth:`check_hyperparameters`, with a config subclassing
    :class:`~hf_unlearn.methods.base.BaseUnlearningConfig` (``config_class``; ``preset``: the field values that
    define the method).

    Refused before any work: an output folder overlapping the model folder or not empty (unless ``overwrite``; one
    holding checkpoints is left to :meth:`train`), no-op settings (learning rate 0, zero epochs or steps), a forget
    example truncation leaves without answer tokens, hyperparameters the objective cannot use. Training stops on a
    non-finite loss, on non-finite weights before a save, and when the retain NLL diverges
    (:class:`RetainDivergenceGuard`; an objective without a retain term is watched on the retain set when given
    one). :meth:`train` holds the output folder's lock; checkpoints and the final model are written in a temporary
    folder and renamed into place; ``train(resume_from_checkpoint=True)`` continues exactly and refuses a checkpoint
    of another method, settings or data. A frozen reference is reloaded from the model's folder, or copied from a
    model changed in memory; ``ref_model=`` passes one (needed under ZeRO-3 / FSDP for a model without a folder).

    Private ``Trainer`` methods overridden, each because no public hook does the job:

    * ``_set_signature_columns_if_needed``: the ``retain_`` keys must survive ``remove_unused_columns``, which
      keeps only the model's ``forward`` arguments; turning that option off would also keep the raw text columns.
    * ``_save_checkpoint``: transformers writes a checkpoint in place, file by file and process by process; it is
      staged here and renamed into place once every process has written (:func:`stage_checkpoint`).
    * ``_get_output_dir``: where ``Trainer._save_checkpoint`` writes; it names the staging folder while a checkpoint
      is written.
    """

    _tag_names = ["trl", "hf-unlearn", "unlearning"]
    _name = "Unlearning"
    #: the config dataclass ``args`` is resolved to (its defaults are the method's defaults)
    config_class: ClassVar[type[BaseUnlearningConfig]] = UnlearningConfig
    #: config values that define the method: applied when another config is converted, required of a ``config_class``
    preset: ClassVar[dict[str, Any]] = {}
    #: whether the trainer unlearns documents (plain texts, chunked) as well as question/answer rows
    accepts_documents: ClassVar[bool] = True
    # compute_loss divides by the totals of the accumulation step itself (see LossDenominators)
    loss_is_scaled_for_ga = True

    def __init__(
        self,
        model: str | PreTrainedModel,
        args: BaseUnlearningConfig | TrainingArguments | None = None,
        data_collator: Callable | None = None,
        train_dataset: Rows | None = None,
        retain_dataset: Rows | None = None,
        eval_dataset: Rows | dict[str, Rows] | None = None,
        processing_class: PreTrainedTokenizerBase | None = None,
        callbacks: list[TrainerCallback] | None = None,
        optimizers: Optimizers = (None, None),
        optimizer_cls_and_kwargs: tuple[type[torch.optim.Optimizer], dict[str, Any]] | None = None,
        quantization_config: BitsAndBytesConfig | None = None,
        peft_config: PeftConfig | None = None,
        ref_model: PreTrainedModel | None = None,
    ):
        # the model folders, refused as output folders; whether train() holds the output folder; the folder a
        # checkpoint is being staged in; which of the sets are documents (chunks fill max_length by design)
        self._input_dirs: tuple[str, ...] = model_dirs(model)
        self._run_dir_claimed = False
        self._staging_dir: Path | None = None
        self._document_sets: set[str] = set()
        # per-mode logged values since the last log; the loss totals of the current optimizer step
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
        # each forget example paired with a retain example, partners redrawn every epoch
        self.forget_dataset: Dataset = self.train_dataset
        self.retain_dataset: Dataset | None = self._prepare_retain(retain)
        if self.retain_dataset is not None:
            self.train_dataset = PairedForgetRetainDataset(self.forget_dataset, self.retain_dataset, seed=self.args.seed)
            self.add_callback(PairingEpochCallback(self.train_dataset))
        self.data_collator = PairedCollator(self.data_collator)
        self.ref_model = None
        if self.needs_reference_model(self.args) and not is_peft_model(self.model):
            self.ref_model = self._create_reference_model(model if isinstance(model, str) else None, ref_model)

    # ----- inputs, checked before any work ------------------------------------------------------------------------

    def _check_inputs(
        self, model: Any, args: BaseUnlearningConfig, train_dataset: Any, retain_dataset: Any, eval_dataset: Any,
        processing_class: Any,
    ) -> tuple[BaseUnlearningConfig, Any, Dataset, Dataset | None, Any]:
        """The output folder, ``max_length`` within the model's positions, the tokenizer (loaded from the model
        when not given), and the forget, retain and evaluation sets in TRL's format. Returns ``(args,
        processing_class, forget, retain, eval_dataset)``."""
        check_output_folder(args, self._input_dirs)
        model_config = AutoConfig.from_pretrained(model, trust_remote_code=False) if isinstance(model, str) else getattr(model, "config", None)
        args = limit_max_length(args, model_config)  # a warning follows only when an example is truncated
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
        """The retain set in TRL's format: required when the objective uses it, ``None`` (with a warning) when it
        neither uses nor watches it, refused when empty or sharing rows with the forget set."""
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
        check_disjoint(forget, retain, args.allow_overlap, stacklevel=4)
        if is_documents(retain):
            self._document_sets.add("retain")
        return to_trl_format(retain, tokenizer, getattr(args, "prompt_template", None), args.max_length)

    def _check_truncation(self, before: int, prepared: Any, name: str, required: bool, stacklevel: int = 3) -> None:
        """After TRL's preparation: refuse (``required``) or warn about the examples truncation to ``max_length``
        left without an answer token (TRL drops them), and warn about truncated ones."""
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

    def _prepare_retain(self, retain: Dataset | None) -> Dataset | None:
        """The retain set prepared by TRL as the forget set was (truncation checked; refused when none is left)."""
        if retain is None:
            return None
        if not self._skip_prepare_dataset:
            prepared = self._prepare_dataset(retain, self.processing_class, self.args, False, None, "retain")
            self._check_truncation(len(retain), prepared, "retain", required=False, stacklevel=4)
            retain = prepared
        if len(retain) == 0:
            raise ValueError("No retain example is left after tokenization/truncation (check `max_length`).")
        return retain

    def _set_signature_columns_if_needed(self):
        super()._set_signature_columns_if_needed()
        extra = [RETAIN_PREFIX + c for c in self._signature_columns if not c.startswith(RETAIN_PREFIX)]
        self._signature_columns = list(dict.fromkeys([*self._signature_columns, *extra]))

    # ----- configuration -----------------------------------------------------------------------------------------

    @classmethod
    def _resolve_args(cls, args: Any, model: Any) -> BaseUnlearningConfig:
        """``args`` as a ``cls.config_class`` (used as given when it is one; otherwise a default one named after the
        model, or the fields it shares with other training arguments, ``cls.preset`` applied), then checked. A value
        carried from another unlearning config's default that differs from ``config_class``'s default is warned
        about."""
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
        """Whether the objective uses the retain set (default: ``retain_loss != "none"`` with ``retain_weight >
        0``)."""
        return getattr(args, "retain_loss", "nll") != "none" and getattr(args, "retain_weight", 1.0) > 0

    @classmethod
    def needs_reference_model(cls, args: BaseUnlearningConfig) -> bool:
        """Whether the objective needs the frozen reference model (default: for the KL retain term of
        :meth:`retain_term`); a method whose own terms read the reference overrides this."""
        return cls.needs_retain(args) and getattr(args, "retain_loss", None) == "kl"

    @classmethod
    def watches_retain(cls, args: BaseUnlearningConfig) -> bool:
        """Whether a ``retain_dataset`` given to an objective without a retain term is kept to feed the divergence
        guard (default: when the guard is on)."""
        return not cls.needs_retain(args) and getattr(args, "max_retain_loss_ratio", None) is not None

    @classmethod
    def forget_columns(cls, args: BaseUnlearningConfig) -> tuple[str, ...]:
        """Columns of a forget row the trainer reads besides ``question`` and ``answer`` (default: none)."""
        return ()

    def training_outcome(self) -> TrainingOutcome:
        """How the run ended (:class:`~hf_unlearn.result.TrainingOutcome`); a trainer that stops itself overrides
        this to report its step, reason and per-check history."""
        return TrainingOutcome(global_step=self.state.global_step)

    # ----- the frozen reference ----------------------------------------------------------------------------------

    def _create_reference_model(self, model_id: str | None, ref_model: Any = None) -> torch.nn.Module:
        """The frozen initial model (:func:`~hf_unlearn.methods.base.reference.frozen_reference`: ``ref_model``,
        reloaded from ``model_id`` or the model's folder, or copied), prepared by accelerate like the policy."""
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
        """:func:`~hf_unlearn.methods.base.reference.reload_reference` with this run's ``model_init_kwargs``, whole
        on each process under DDP, DeepSpeed and FSDP."""
        whole = self.args.distributed_state.distributed_type in RELOAD_WITHOUT_DEVICE_MAP or self.is_fsdp_enabled
        return reload_reference(path, live, check, self.args.model_init_kwargs, whole)

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
        with the adapter disabled. Without gradients. The adapter-disabled pass goes through the model as the
        Trainer wrapped it (``model_wrapped``: DDP, FSDP, DeepSpeed), so that FSDP gathers its shards for it, as
        TRL's ``null_ref_context`` passes do; in one process that is the model itself."""
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

    def compute_unlearning_loss(
        self, model: Any, inputs: dict[str, Any], denominators: LossDenominators
    ) -> torch.Tensor:
        """Return the scalar loss of this micro-batch: the hook each method implements.

        ``inputs`` holds ``input_ids``, ``attention_mask``, ``labels`` (forget) and ``retain_input_ids``,
        ``retain_attention_mask``, ``retain_labels`` when the objective uses a retain set. Divide summed token-level
        terms by ``denominators.forget_tokens`` / ``retain_tokens`` and summed sequence-level terms by
        ``denominators.forget_sequences`` / ``retain_sequences``; the pure loss functions of the methods take
        these as ``num_tokens`` / ``num_sequences``.

        The base class holds no objective and raises ``NotImplementedError``: a method's trainer overrides this
        (the baselines' objective is :mod:`hf_unlearn.methods.baselines.trainer`'s).
        """
        raise NotImplementedError(
            f"{type(self).__name__} must implement `compute_unlearning_loss`: UnlearningTrainer is the base of the "
            "unlearning trainers and holds no objective. Train a baseline objective with the baselines' trainers "
            "(hf_unlearn.methods.baselines: BaselineTrainer, GradAscentTrainer, GradDiffTrainer, NPOTrainer, "
            "SimNPOTrainer)."
        )

    # ----- logged values ------------------------------------------------------------------------------------------

    def log_metric(self, name: str, value: torch.Tensor | float) -> None:
        """Record a scalar for this step, logged with the loss as ``mean_processes(mean_steps(value))``. A
        ``"retain_nll"`` recorded in a training step also feeds the divergence guard."""
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

    # ----- the training step -------------------------------------------------------------------------------------

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        batch_samples, num_items_in_batch = super().get_batch_samples(epoch_iterator, num_batches, device)
        counts = sum((batch_counts(b) for b in batch_samples), torch.zeros(4, dtype=torch.float64))
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

    @property
    def in_training_step(self) -> bool:
        """Whether a training step (not an evaluation or a direct call) is running."""
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

    # ----- guards -----------------------------------------------------------------------------------------------

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

    def _watch_retain(self, model: Any, inputs: dict[str, Any]) -> None:
        """For an objective without a retain term: the retain NLL of the batch's retain half, scored in eval mode
        without gradient (no dropout, no RNG drawn, no effect on the update) and logged, so fed to the guard."""
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

    # ----- training ----------------------------------------------------------------------------------------------

    def train(self, resume_from_checkpoint: str | bool | None = None, trial: Any = None, **kwargs):
        """:meth:`transformers.Trainer.train` holding the lock of ``output_dir`` (a second run on it is refused).

        Without ``resume_from_checkpoint``, a folder holding an earlier run's checkpoints is refused unless
        ``overwrite=True`` (they are set aside, deleted once this run has finished, put back if it fails before
        writing one). With it (``True``: the latest complete checkpoint), a checkpoint of another method, settings
        (all but the run's length) or forget/retain rows is refused before any work
        (:class:`~hf_unlearn.methods.base.checkpoints.ResumeMismatchError`); otherwise the run continues exactly
        (weights, optimizer, scheduler, RNG, data order, retain pairing, divergence-guard reference). A bf16/fp16
        model whose learning rate rounds away most updates gets a warning."""
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

    # ----- checkpoints ----------------------------------------------------------------------------------------------

    def _get_output_dir(self, trial):
        if self._staging_dir is not None:
            return str(self._staging_dir)
        return super()._get_output_dir(trial)

    def _save_checkpoint(self, model, trial):
        """Check the weights, then write the checkpoint through :func:`stage_checkpoint` (every process into one
        hidden staging folder, renamed into place by the main process once all have written), with the run's
        fingerprint (:meth:`run_fingerprint`)."""
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
        """This run's :func:`~hf_unlearn.methods.base.checkpoints.run_fingerprint` (method, weight-changing settings,
        digests of the prepared forget and retain rows), written into every checkpoint as ``unlearning_run.json``
        and checked on resume."""
        if self._fingerprint is None:
            self._fingerprint = run_fingerprint(type(self), self.args, self.forget_dataset, self.retain_dataset)
        return self._fingerprint

    # ----- the final model -----------------------------------------------------------------------------------------

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save the model (weights, config, tokenizer) to ``output_dir`` (default ``args.output_dir``), its
        trainable weights checked finite, built in a temporary sibling folder and swapped in once complete (the
        run's checkpoints kept). A target other than the run folder claimed by :meth:`train` is checked like the
        output folder. A failed write raises a one-line :class:`~hf_unlearn.safe_output.OutputWriteError` and
        leaves the previous content. Inside a checkpoint, and under FSDP / DeepSpeed (every process writes),
        transformers writes in place."""
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

    def release_training_state(self) -> None:
        """Drop what only training needs, so that what runs after it (the evaluation, the NF4 re-check, the
        attacks) has the memory: the optimizer and its states, the learning-rate scheduler, the frozen reference
        model and accelerate's references to its prepared objects. The trained model and what :meth:`save_model`
        writes stay; the trainer cannot train again afterwards."""
        self.optimizer = self.lr_scheduler = None
        self.callback_handler.optimizer = self.callback_handler.lr_scheduler = None
        self.ref_model = None
        self.model_wrapped = self.model
        self.accelerator.free_memory()
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def end_training(self) -> None:
        """Finish a distributed run cleanly: release the DDP wrapper, then destroy the process group.

        Call it once, after `train()` and `save_model()`, at the end of a `torchrun` script (a single-process run
        may call it too; it then only drops the trainer's prepared objects). The order matters: when the process
        group is destroyed first, DDP's reducer is left holding the last reference to the gloo group, and freeing it
        later joins gloo's worker threads while holding the GIL; a worker still finishing the last all-gather needs
        the GIL to free its tensors, and both wait forever. Releasing the wrapper while the
        group is still registered avoids that. The trainer cannot train again afterwards.
        """
        self.model_wrapped = self.model
        self.accelerator.free_memory()
        gc.collect()
        self.accelerator.end_training()

    # ----- what the run reads after training -----------------------------------------------------------------------

    #: Whether the trainer stops itself by a rule of its own: then that rule is its strength selection and a
    #: criterion is only recorded beside it; otherwise the best checkpoint under the criterion is restored.
    stops_itself: ClassVar[bool] = False

    def method_metrics(self, tokenizer: Any, forget: Any, retain: Any) -> dict[str, float]:
        """Numbers only this method can measure after training, copied into the run's result (default: none)."""
        return {}

    @classmethod
    def check_forget_rows(cls, rows: Any, args: BaseUnlearningConfig) -> None:
        """Raise a ``ValueError`` naming the first forget row that lacks what this trainer reads besides its
        question and answer (default: nothing more is read)."""
