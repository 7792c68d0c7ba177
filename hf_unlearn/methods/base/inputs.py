"""What :class:`~hf_unlearn.methods.base.trainer.UnlearningTrainer` checks before any work: the output folder (not
the model folder, empty unless ``overwrite``), ``max_length`` within the model's positions, the forget, retain and
evaluation sets (tokenized for TRL by :func:`~hf_unlearn.methods.base.pairing.to_trl_format`; forget and retain
disjoint unless ``allow_overlap``), and after TRL's preparation the examples truncation left without an answer.
"""

from __future__ import annotations

import copy
import os
import warnings
from pathlib import Path
from typing import Any

from datasets import Dataset
from transformers import AutoConfig, AutoTokenizer, TrainingArguments
from trl.trainer.utils import get_config_model_id

from ...data import is_documents, model_max_positions, overlapping_examples
from ...safe_output import check_output_dir
from .checkpoints import RUN_REQUEST_NAME, _checkpoint_dirs
from .config import BaseUnlearningConfig
from .pairing import _identity_keys, as_dataset, to_trl_format
from .reference import _local_dir

__all__ = ["InputChecksMixin"]


def _holds_request_only(folder: Path) -> bool:
    """Whether ``folder`` holds nothing but ``logs/run_request.json`` (written there just before the run)."""
    logs = folder / "logs"
    try:
        return ([p.name for p in folder.iterdir()] == ["logs"] and not logs.is_symlink()
                and [p.name for p in logs.iterdir()] == [RUN_REQUEST_NAME])
    except OSError:
        return False


class InputChecksMixin:
    """The checks before any work of :class:`~hf_unlearn.methods.base.trainer.UnlearningTrainer` (a ``Trainer``;
    :meth:`_check_inputs` runs before ``SFTTrainer.__init__``, :meth:`_check_truncation` after it)."""

    def _check_inputs(
        self, model: Any, args: BaseUnlearningConfig, train_dataset: Any, retain_dataset: Any, eval_dataset: Any,
        processing_class: Any,
    ) -> tuple[BaseUnlearningConfig, Any, Dataset, Dataset | None, Any]:
        """Everything ``__init__`` checks and tokenizes before ``SFTTrainer.__init__``: the output folder, the
        ``max_length`` limit, the tokenizer (loaded from the model when not given), the forget set (non-empty),
        the retain set (:meth:`_check_retain`) and the evaluation sets, in TRL's format. Returns ``(args,
        processing_class, forget, retain, eval_dataset)``."""
        self._input_dirs = self._model_dirs(model)
        self._check_output_dir_before_work(args)
        model_config = AutoConfig.from_pretrained(model, trust_remote_code=False) if isinstance(model, str) else getattr(model, "config", None)
        args = self._limit_max_length(args, model_config)
        if processing_class is None:
            model_id = model if isinstance(model, str) else get_config_model_id(model.config)
            processing_class = AutoTokenizer.from_pretrained(model_id, trust_remote_code=False)
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
        return args, processing_class, forget, retain, eval_dataset

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
            warnings.warn(f"{type(self).__name__} does not use a retain set here; `retain_dataset` is ignored.", stacklevel=4)
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
                warnings.warn(f"{shared} forget examples also occur in the retain set (allow_overlap=True).", stacklevel=4)
        if is_documents(retain):
            self._document_sets = {*getattr(self, "_document_sets", ()), "retain"}
        return to_trl_format(retain, tokenizer, getattr(args, "prompt_template", None), args.max_length)

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
        refuses it unless it resumes or ``overwrite=True``. A folder holding only the command line's
        ``logs/run_request.json`` (what it asked this run to do) counts as empty."""
        out = Path(args.output_dir)
        overwrite = bool(getattr(args, "overwrite", False)) or bool(_checkpoint_dirs(out)) or _holds_request_only(out)
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

    def _check_truncation(self, before: int, prepared: Any, name: str, required: bool, stacklevel: int = 3) -> None:
        """After TRL's preparation: refuse (forget) or warn about (retain) examples that truncation to
        ``max_length`` left without any answer token (TRL drops them), and warn about truncated ones
        (``stacklevel`` of the warnings: the frame of the trainer's caller)."""
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
        if name in getattr(self, "_document_sets", ()):
            return
        if limit is not None and isinstance(prepared, Dataset) and "input_ids" in prepared.column_names:
            full = sum(len(ids) >= limit for ids in prepared["input_ids"])
            if full:
                warnings.warn(f"{full} {name} examples were truncated to max_length={limit} tokens.", stacklevel=stacklevel)
