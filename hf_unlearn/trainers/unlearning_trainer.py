"""The base unlearning trainer: a `trl.SFTTrainer` whose batches pair each forget example with a retain example.

Subclasses implement one hook, :meth:`UnlearningTrainer.compute_unlearning_loss`, and use the helpers here to score
batches (:meth:`~UnlearningTrainer.score`), query the frozen reference (:meth:`~UnlearningTrainer.reference_scores`),
compute the configured retain term (:meth:`~UnlearningTrainer.retain_term`) and log scalars
(:meth:`~UnlearningTrainer.log_metric`). Data preparation, the fused-LM-head patch, PEFT wrapping and the
distributed setup are TRL's and transformers'; this module adds the pairing, the reference model and loss
normalisation that is exact under gradient accumulation and data parallelism.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import warnings
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from accelerate.utils import is_peft_model
from datasets import Dataset
from transformers import AutoTokenizer, PreTrainedModel, TrainingArguments
from trl import SFTTrainer
from trl.trainer.utils import create_model_from_path, get_config_model_id

from ..data import format_qa, has_chat_template, overlapping_examples, retain_partner_indices
from ..logprobs import label_log_probs
from ..losses import answer_mask, kl_retain_loss, nll_loss, sequence_log_probs
from .unlearning_config import UnlearningConfig

RETAIN_PREFIX = "retain_"
MODEL_COLUMNS = ("input_ids", "labels")


class NonFiniteLossError(ValueError):
    """The unlearning loss became NaN or infinite; training stops at that step."""


# ---------------------------------------------------------------------------------------------------------------
# Data: conversion of TOFU rows, forget/retain pairing, collation
# ---------------------------------------------------------------------------------------------------------------


def to_trl_format(dataset: Dataset | Sequence[dict[str, Any]], tokenizer: Any) -> Dataset:
    """TOFU-shaped rows (``question``/``answer``) as TRL prompt/completion rows; other formats pass through.

    Without a chat template the prompt and completion texts come from :func:`hf_unlearn.data.format_qa` (TRL then
    appends the EOS token to the completion, as :func:`~hf_unlearn.data.tokenize_qa` does). With a chat template
    the rows become *conversational* prompt/completion (``[user: question]`` / ``[assistant: answer]``), so TRL
    renders them with the same template ``format_qa`` uses without adding a second BOS token. Either way the
    tokens match what the evaluator scores, with loss on the answer tokens only.
    """
    if not isinstance(dataset, Dataset):
        dataset = Dataset.from_list(list(dataset))
    columns = set(dataset.column_names)
    if not {"question", "answer"} <= columns or columns & {"prompt", "messages", "text", "input_ids"}:
        return dataset
    rows = []
    for row in dataset:
        if has_chat_template(tokenizer):
            rows.append({
                "prompt": [{"role": "user", "content": row["question"]}],
                "completion": [{"role": "assistant", "content": row["answer"]}],
            })
        else:
            prompt, completion = format_qa(tokenizer, row["question"], row["answer"])
            rows.append({"prompt": prompt, "completion": completion})
    return Dataset.from_list(rows)


def _identity_keys(dataset: Dataset) -> tuple[str, ...] | None:
    columns = set(dataset.column_names)
    for keys in (("question", "answer"), ("prompt", "completion"), ("messages",), ("text",), ("input_ids",)):
        if set(keys) <= columns:
            return keys
    return None


class PairedForgetRetainDataset(torch.utils.data.Dataset):
    """Forget example ``i`` together with its retain partner for the current epoch.

    Item ``i`` holds the forget fields (``input_ids``, ``labels``) and the partner's fields prefixed with
    ``retain_``. Partners come from :func:`hf_unlearn.data.retain_partner_indices` (seeded, redrawn each epoch
    through :meth:`set_epoch`, which the Trainer's dataloader calls), so a forget example meets the same retain
    example in every process and every run with the same seed.
    """

    def __init__(self, forget: Dataset, retain: Dataset, seed: int = 0, columns: Sequence[str] = MODEL_COLUMNS):
        self.forget = forget
        self.retain = retain
        self.seed = seed
        self.columns = tuple(columns)
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        self.partners = retain_partner_indices(len(self.forget), len(self.retain), self.seed, self.epoch)

    def __len__(self) -> int:
        return len(self.forget)

    def __getitem__(self, index: int) -> dict[str, Any]:
        forget = self.forget[int(index)]
        retain = self.retain[self.partners[int(index)]]
        item = {key: forget[key] for key in self.columns}
        item.update({RETAIN_PREFIX + key: retain[key] for key in self.columns})
        return item


@dataclass
class PairedCollator:
    """Collates forget fields with ``base`` and ``retain_``-prefixed fields separately with ``base`` again."""

    base: Callable[[list[dict[str, Any]]], dict[str, Any]]

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        forget = [{k: v for k, v in f.items() if not k.startswith(RETAIN_PREFIX)} for f in features]
        batch = dict(self.base(forget))
        if any(k.startswith(RETAIN_PREFIX) for k in features[0]):
            retain = [{k[len(RETAIN_PREFIX):]: v for k, v in f.items() if k.startswith(RETAIN_PREFIX)} for f in features]
            batch.update({RETAIN_PREFIX + k: v for k, v in self.base(retain).items()})
        return batch


# ---------------------------------------------------------------------------------------------------------------
# Scores and loss denominators handed to the loss hook
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class ScoredBatch:
    """One forward pass over a (forget or retain) batch.

    ``token_log_probs[b, t] = log p(labels[b, t] | < t)`` on answer tokens (0 elsewhere), computed from ``logits``
    by :func:`hf_unlearn.logprobs.label_log_probs`; ``mask`` marks the scored positions; ``outputs`` is the raw model
    output (hidden states are there when the forward was asked for them).
    """

    logits: torch.Tensor
    labels: torch.Tensor
    token_log_probs: torch.Tensor
    mask: torch.Tensor
    outputs: Any = None

    @property
    def sequence_log_probs(self) -> torch.Tensor:
        """``[B]`` answer log-likelihoods ``log p(y | x)``."""
        return sequence_log_probs(self.token_log_probs, self.mask)

    @property
    def lengths(self) -> torch.Tensor:
        """``[B]`` number of scored answer tokens ``|y|``."""
        return self.mask.sum(-1)

    @property
    def mean_nll(self) -> torch.Tensor:
        """Average per-token NLL over the batch (for logging)."""
        return -(self.token_log_probs * self.mask).sum() / self.mask.sum().clamp(min=1)


@dataclass
class LossDenominators:
    """What to divide summed losses by so that micro-batches add up to the loss of the whole optimizer step.

    During training these are the totals over every micro-batch of the gradient-accumulation step (and over every
    process when ``average_tokens_across_devices``, divided by the number of processes since DDP averages
    gradients): ``sum(local) / denominator`` summed over micro-batches and averaged over processes equals the
    loss of one big batch. Outside training (evaluation, direct calls) they are the counts of the batch itself.
    """

    forget_tokens: torch.Tensor
    forget_sequences: torch.Tensor
    retain_tokens: torch.Tensor
    retain_sequences: torch.Tensor


def _batch_counts(batch: dict[str, Any]) -> torch.Tensor:
    counts = []
    for prefix in ("", RETAIN_PREFIX):
        labels = batch.get(prefix + "labels")
        if labels is None:
            counts += [0.0, 0.0]
        else:
            counts += [float(answer_mask(labels).sum()), float(labels.shape[0])]
    return torch.tensor(counts, dtype=torch.float64)


# ---------------------------------------------------------------------------------------------------------------
# The trainer
# ---------------------------------------------------------------------------------------------------------------


class UnlearningTrainer(SFTTrainer):
    """Base class of the unlearning trainers (TRL ``SFTTrainer`` subclass).

    ``train_dataset`` is the forget set, ``retain_dataset`` the retain set. Both go through ``SFTTrainer``'s dataset
    preparation: TOFU rows (``question``/``answer``, converted by :func:`to_trl_format`), TRL prompt/completion rows
    and conversational rows all work, with labels on the completion tokens only. Each training example is a forget
    example paired with a retain example (:class:`PairedForgetRetainDataset`), and a batch holds ``input_ids``,
    ``attention_mask``, ``labels`` for the forget examples and the same keys prefixed with ``retain_``.

    Subclasses override :meth:`compute_unlearning_loss` and, when they need them, :meth:`needs_retain` and
    :meth:`needs_reference_model`; per-method defaults of ``beta``/``gamma``/``alpha`` go in
    ``default_hyperparameters``.
    """

    _tag_names = ["trl", "hf-unlearn", "unlearning"]
    _name = "Unlearning"
    # the config dataclass this trainer resolves its arguments to (subclasses with their own config set it)
    config_class: ClassVar[type[UnlearningConfig]] = UnlearningConfig
    # compute_loss divides by the totals of the accumulation step itself (see LossDenominators)
    loss_is_scaled_for_ga = True
    # defaults for UnlearningConfig fields left at None, e.g. {"beta": 0.1}
    default_hyperparameters: ClassVar[dict[str, float]] = {"gamma": 1.0, "alpha": 1.0}

    def __init__(
        self,
        model: str | PreTrainedModel,
        args: UnlearningConfig | TrainingArguments | None = None,
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
    ):
        args = self._resolve_args(args, model)
        if train_dataset is None:
            raise ValueError("`train_dataset` (the forget set) is required.")
        if processing_class is None:
            model_id = model if isinstance(model, str) else get_config_model_id(model.config)
            processing_class = AutoTokenizer.from_pretrained(model_id)
        forget = to_trl_format(train_dataset, processing_class)
        if len(forget) == 0:
            raise ValueError("The forget set (`train_dataset`) is empty: nothing to unlearn.")
        retain = self._check_retain(retain_dataset, forget, args, processing_class)
        if args.packing or args.padding_free:
            raise ValueError(
                "`packing` and `padding_free` are not supported by unlearning trainers: the losses are per answer "
                "and each forget example is paired with one retain example."
            )
        if isinstance(eval_dataset, dict):
            eval_dataset = {k: to_trl_format(v, processing_class) for k, v in eval_dataset.items()}
        elif eval_dataset is not None:
            eval_dataset = to_trl_format(eval_dataset, processing_class)

        super().__init__(
            model=model,
            args=args,
            data_collator=data_collator,
            train_dataset=forget,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            callbacks=callbacks,
            optimizers=optimizers,
            optimizer_cls_and_kwargs=optimizer_cls_and_kwargs,
            quantization_config=quantization_config,
            peft_config=peft_config,
        )

        # Pair the prepared forget set with the prepared retain set
        self.forget_dataset = self.train_dataset
        self.retain_dataset = None
        if retain is not None:
            if not self._skip_prepare_dataset:
                retain = self._prepare_dataset(retain, self.processing_class, self.args, False, None, "retain")
            if len(retain) == 0:
                raise ValueError("No retain example is left after tokenization/truncation (check `max_length`).")
            self.retain_dataset = retain
            self.train_dataset = PairedForgetRetainDataset(self.forget_dataset, retain, seed=self.args.seed)
        self.data_collator = PairedCollator(self.data_collator)

        # Frozen reference model, created only when the objective needs one
        self.ref_model = None
        if self.needs_reference_model(self.args) and not is_peft_model(self.model):
            self.ref_model = self._create_reference_model(model if isinstance(model, str) else None)

        self._unlearning_metrics: dict[str, dict[str, list[torch.Tensor]]] = {
            "train": defaultdict(list), "eval": defaultdict(list)
        }
        self._step_denominators: LossDenominators | None = None
        self._in_training_step = False

    # ----- configuration -----------------------------------------------------------------------------------------

    @classmethod
    def _resolve_args(cls, args: Any, model: Any) -> UnlearningConfig:
        """``args`` as a ``cls.config_class``: a default one named after the model, or other training arguments
        converted (their fields the config class has), then per-method defaults filled and checked."""
        config_class = cls.config_class
        if args is None:
            name = model if isinstance(model, str) else (get_config_model_id(model.config) or "model")
            args = config_class(f"{str(name).rstrip('/').split('/')[-1]}-{cls._name}")
        elif not isinstance(args, config_class):
            names = {f.name for f in dataclasses.fields(config_class) if f.init}
            values = {k: v for k, v in args.to_dict().items() if k in names}
            values["hub_token"] = args.hub_token
            args = config_class(**values)
        missing = {k: v for k, v in cls.default_hyperparameters.items() if getattr(args, k) is None}
        if missing:
            args = copy.copy(args)  # do not change the caller's config: another trainer may resolve it differently
            for key, value in missing.items():
                setattr(args, key, value)
        for key in ("gamma", "alpha"):
            if getattr(args, key) is None:
                setattr(args, key, 1.0)
        cls.check_hyperparameters(args)
        return args

    @classmethod
    def check_hyperparameters(cls, args: UnlearningConfig) -> None:
        """Raise a ``ValueError`` for hyperparameters this objective cannot use (override to add checks)."""

    @classmethod
    def needs_retain(cls, args: UnlearningConfig) -> bool:
        """Whether the objective uses the retain set (default: when the retain weight ``alpha`` is positive).
        Works on a config whose ``alpha`` is still ``None`` (the trainer's default then applies)."""
        alpha = cls.default_hyperparameters.get("alpha", 1.0) if args.alpha is None else args.alpha
        return alpha > 0

    @classmethod
    def needs_reference_model(cls, args: UnlearningConfig) -> bool:
        """Whether the objective needs the frozen reference model (default: only for the KL retain term)."""
        return cls.needs_retain(args) and args.retain_loss == "kl"

    def _check_retain(self, retain_dataset: Any, forget: Dataset, args: UnlearningConfig, tokenizer: Any):
        needed = self.needs_retain(args)
        if retain_dataset is None:
            if needed:
                raise ValueError(
                    f"{type(self).__name__} needs a `retain_dataset` (its retain weight alpha={args.alpha}); pass "
                    "one, or set `alpha=0` to unlearn without a retain term."
                )
            return None
        if not needed:
            warnings.warn(
                f"{type(self).__name__} does not use a retain set (alpha={args.alpha}); `retain_dataset` is ignored.",
                stacklevel=3,
            )
            return None
        retain = to_trl_format(retain_dataset, tokenizer)
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
        return retain

    def _create_reference_model(self, model_id: str | None) -> torch.nn.Module:
        """Frozen eval-mode copy of the initial model, prepared by accelerate like the policy."""
        if model_id is not None:
            kwargs = dict(self.args.model_init_kwargs or {})
            kwargs.setdefault("dtype", self.model.dtype)
            if self.args.distributed_state.distributed_type in ["MULTI_GPU", "DEEPSPEED"]:
                kwargs["device_map"] = None
            ref = create_model_from_path(model_id, **kwargs)
        else:
            ref = copy.deepcopy(self.accelerator.unwrap_model(self.model))
            # SFTTrainer patched `forward` on the instance (fused LM head); the patch's closure calls the forward
            # bound to the *original* model, so a copy must fall back to its class's forward.
            ref.__dict__.pop("forward", None)
        ref.eval()
        ref.requires_grad_(False)
        if self.is_deepspeed_enabled:
            from trl.models import prepare_deepspeed

            return prepare_deepspeed(ref, self.accelerator)
        if self.is_fsdp_enabled:
            from trl.models import prepare_fsdp

            return prepare_fsdp(ref, self.accelerator)
        return self.accelerator.prepare_model(ref, evaluation_mode=True)

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
        (:func:`~hf_unlearn.losses.nll_loss`) or per-token ``KL(pi_ref || pi_theta)``
        (:func:`~hf_unlearn.losses.kl_retain_loss`). Zero when the batch carries no retain examples."""
        if RETAIN_PREFIX + "input_ids" not in inputs:
            return torch.zeros((), device=inputs["input_ids"].device)
        retain = self.score(model, inputs, RETAIN_PREFIX)
        self.log_metric("retain_nll", retain.mean_nll)
        if self.args.retain_loss == "kl":
            ref = self.reference_scores(inputs, RETAIN_PREFIX)
            loss = kl_retain_loss(retain.logits, ref.logits, retain.labels, denominators.retain_tokens)
        else:
            loss = nll_loss(retain.token_log_probs, retain.mask, denominators.retain_tokens)
        self.log_metric("retain_loss", loss)
        return loss

    def log_metric(self, name: str, value: torch.Tensor | float) -> None:
        """Record a scalar for this step; it is averaged over steps and processes and logged with the loss."""
        mode = "train" if self.model.training else "eval"
        value = value.detach().float().reshape(()) if torch.is_tensor(value) else torch.tensor(float(value))
        self._unlearning_metrics[mode][name].append(value)

    # ----- the loss hook -----------------------------------------------------------------------------------------

    def compute_unlearning_loss(
        self, model: Any, inputs: dict[str, Any], denominators: LossDenominators
    ) -> torch.Tensor:
        """Return the scalar loss of this micro-batch. Override in subclasses.

        ``inputs`` holds ``input_ids``, ``attention_mask``, ``labels`` (forget) and ``retain_input_ids``,
        ``retain_attention_mask``, ``retain_labels`` when the objective uses a retain set. Divide summed token-level
        terms by ``denominators.forget_tokens`` / ``retain_tokens`` and summed sequence-level terms by
        ``denominators.forget_sequences`` / ``retain_sequences``; the pure functions of :mod:`hf_unlearn.losses`
        take these as ``num_tokens`` / ``num_sequences``.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement `compute_unlearning_loss`.")

    # ----- Trainer overrides -------------------------------------------------------------------------------------

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
        loss = self.compute_unlearning_loss(model, inputs, self._denominators(inputs))
        if not torch.isfinite(loss.detach()).item():
            step = self.state.global_step + (1 if self._in_training_step else 0)
            raise NonFiniteLossError(
                f"The unlearning loss of {type(self).__name__} is {loss.item()} at step {step}; training stopped. "
                "Lower the learning rate, check the data, or (NPO/SimNPO) check `beta`."
            )
        return (loss, None) if return_outputs else loss

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs)
        return loss.detach(), None, None

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
