"""The base unlearning trainer: a `trl.SFTTrainer` whose batches pair each forget example with a retain example.

Subclasses implement one hook, :meth:`UnlearningTrainer.compute_unlearning_loss`, and use the helpers here to score
batches (:meth:`~UnlearningTrainer.score`), query the frozen reference (:meth:`~UnlearningTrainer.reference_scores`),
compute the configured retain term (:meth:`~UnlearningTrainer.retain_term`) and log scalars
(:meth:`~UnlearningTrainer.log_metric`). The base holds no objective: the baselines' trainer
(:mod:`hf_unlearn.methods.baselines.trainer`) subclasses it and supplies
``forget_weight * forget_term + retain_weight * retain_term``. Data preparation, the fused-LM-head patch, PEFT
wrapping and the distributed setup are TRL's and transformers'; this module adds the pairing
(:mod:`~hf_unlearn.methods.base.pairing`), the reference model (:mod:`~hf_unlearn.methods.base.reference`), loss
normalisation that is exact under gradient accumulation and data parallelism (:mod:`~hf_unlearn.methods.base.losses`),
the logged metrics (:mod:`~hf_unlearn.methods.base.metrics`) and the safety rails every method shares (the checks
before work in :mod:`~hf_unlearn.methods.base.inputs`, the guards in :mod:`~hf_unlearn.methods.base.guards`, the
checkpoint staging in :mod:`~hf_unlearn.methods.base.checkpoints`, the final save in
:mod:`~hf_unlearn.methods.base.saving`):

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

import dataclasses
import gc
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from accelerate.utils import is_peft_model
from datasets import Dataset
from transformers import PreTrainedModel, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint
from trl import SFTTrainer
from trl.trainer.utils import get_config_model_id

from ...logprobs import label_log_probs
from ...result import TrainingOutcome
from ...safe_output import OutputDirError, output_lock
from .checkpoints import CheckpointMixin, _checkpoint_dirs
from .config import BaseUnlearningConfig, UnlearningConfig
from .guards import GuardsMixin, NonFiniteLossError, RetainDivergenceGuard, any_process
from .inputs import InputChecksMixin
from .losses import LossDenominators, ScoredBatch, answer_mask, batch_counts, kl_retain_loss, nll_loss
from .metrics import MetricsMixin
from .pairing import RETAIN_PREFIX, PairedCollator, PairedForgetRetainDataset, PairingEpochCallback
from .reference import ReferenceModelMixin
from .saving import SavingMixin


class UnlearningTrainer(
    InputChecksMixin, ReferenceModelMixin, MetricsMixin, GuardsMixin, CheckpointMixin, SavingMixin, SFTTrainer
):
    """Base class of the unlearning trainers (TRL ``SFTTrainer`` subclass).

    ``train_dataset`` is the forget set, ``retain_dataset`` the retain set. Both go through ``SFTTrainer``'s dataset
    preparation: TOFU rows (``question``/``answer``, tokenized by :func:`to_trl_format` with
    ``args.prompt_template``), TRL prompt/completion rows and conversational rows all work, with labels on the
    completion tokens only; documents (a ``text`` column, a list of strings or a ``.txt``/``.json``/``.jsonl`` path,
    :func:`as_dataset`) are cut into chunks of ``max_length`` tokens with labels on every token. Each training
    example is a forget example paired with a retain example
    (:class:`PairedForgetRetainDataset`), and a batch holds ``input_ids``, ``attention_mask``, ``labels`` for the
    forget examples and the same keys prefixed with ``retain_``.

    The base holds no objective: each method's trainer overrides :meth:`compute_unlearning_loss` and, when it
    needs them, :meth:`needs_retain` and :meth:`needs_reference_model`, with a config subclassing
    :class:`~hf_unlearn.methods.base.BaseUnlearningConfig`. The baselines' trainer
    (:mod:`hf_unlearn.methods.baselines.trainer`) trains the objective an
    :class:`~hf_unlearn.methods.base.UnlearningConfig` names, ``forget_weight * forget_term + retain_weight *
    retain_term`` (forget term by ``forget_loss``, retain term by ``retain_loss``); its presets set
    ``config_class`` (their defaults) and ``preset`` (the field values that define the method).

    Before any work the trainer refuses an output folder that overlaps the input model folder or is not empty
    (unless ``overwrite=True``; a folder holding checkpoints is left to :meth:`train`, which resumes it or refuses
    it), no-op settings (learning rate 0, zero epochs or steps), a forget example left without answer tokens by
    truncation, and hyperparameters the objective cannot use. While training it stops on a non-finite loss, on
    non-finite weights before a checkpoint, and when the retain NLL diverges (:class:`RetainDivergenceGuard`; an
    objective without a retain term given a ``retain_dataset`` is watched on it). :meth:`train` holds the output folder's lock, so a second run on the same
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
    # whether the trainer unlearns documents (plain texts, chunked) as well as question/answer rows
    accepts_documents: ClassVar[bool] = True
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
        args, processing_class, forget, retain, eval_dataset = self._check_inputs(
            model, args, train_dataset, retain_dataset, eval_dataset, processing_class
        )
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
        self._pair_with_retain(retain)

        # Frozen reference model, created only when the objective needs one
        self.ref_model = None
        if self.needs_reference_model(self.args) and not is_peft_model(self.model):
            self.ref_model = self._create_reference_model(model if isinstance(model, str) else None, ref_model)

        self._init_metrics()
        self._step_denominators: LossDenominators | None = None
        self._in_training_step = False
        self._retain_nll_seen = False
        self._fingerprint: dict[str, Any] | None = None

    def _pair_with_retain(self, retain: Dataset | None) -> None:
        """Pair the prepared forget set with the retain set (prepared here by TRL, as the forget set was):
        ``train_dataset`` becomes a :class:`PairedForgetRetainDataset` whose partners are redrawn every epoch
        (:class:`PairingEpochCallback`), and the collator a :class:`PairedCollator`."""
        self.forget_dataset = self.train_dataset
        self.retain_dataset = None
        if retain is not None:
            if not self._skip_prepare_dataset:
                prepared = self._prepare_dataset(retain, self.processing_class, self.args, False, None, "retain")
                self._check_truncation(len(retain), prepared, "retain", required=False, stacklevel=4)
                retain = prepared
            if len(retain) == 0:
                raise ValueError("No retain example is left after tokenization/truncation (check `max_length`).")
            self.retain_dataset = retain
            self.train_dataset = PairedForgetRetainDataset(self.forget_dataset, retain, seed=self.args.seed)
            self.add_callback(PairingEpochCallback(self.train_dataset))
        self.data_collator = PairedCollator(self.data_collator)

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

    @classmethod
    def forget_columns(cls, args: BaseUnlearningConfig) -> tuple[str, ...]:
        """Columns of a forget row the trainer reads besides ``question`` and ``answer`` (default: none)."""
        return ()

    def training_outcome(self) -> TrainingOutcome:
        """How the run ended (:class:`~hf_unlearn.result.TrainingOutcome`); a trainer that stops itself overrides
        this to report its step, reason and per-check history."""
        return TrainingOutcome(global_step=self.state.global_step)

    # ----- TRL's dataset columns ---------------------------------------------------------------------------------

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

        The base class holds no objective and raises ``NotImplementedError``: a method's trainer overrides this
        (the baselines' objective is :mod:`hf_unlearn.methods.baselines.trainer`'s).
        """
        raise NotImplementedError(
            f"{type(self).__name__} must implement `compute_unlearning_loss`: UnlearningTrainer is the base of the "
            "unlearning trainers and holds no objective. Train a baseline objective with the baselines' trainers "
            "(hf_unlearn.methods.baselines: BaselineTrainer, GradAscentTrainer, GradDiffTrainer, NPOTrainer, "
            "SimNPOTrainer)."
        )

    # ----- Trainer overrides: training -----------------------------------------------------------------------------

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
