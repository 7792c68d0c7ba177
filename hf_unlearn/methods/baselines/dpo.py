"""DPO and IdkDPO: a preferred answer per forget row, the forget answer rejected. The preferred answers are
tokenized with the forget rows' questions and carried beside the forget half of each batch under the
``alternate_`` prefix; they enter the run's fingerprint.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar

import torch
from datasets import Dataset

from ..base.checkpoints import _rows_digest
from ..base.losses import LossDenominators
from ..base.pairing import MODEL_COLUMNS, RETAIN_PREFIX, as_dataset, to_trl_format
from ..base.trainer import UnlearningTrainer
from .config import IdkDPOConfig, PreferenceConfig, UnlearnDPOConfig
from .loss import dpo_loss
from .token_trainer import ForgetRetainTrainer

ALTERNATE_PREFIX = "alternate_"
IDK_ANSWERS_FILE = "idk_answers.txt"


def load_idk_answers(path: str | Path | None = None) -> list[str]:
    """The refusal answers of ``path`` (one per line, blank lines ignored; default: the list shipped with the
    package). ``ValueError`` when there is none."""
    if path is None:
        text = resources.files("hf_unlearn.data").joinpath(IDK_ANSWERS_FILE).read_text(encoding="utf-8")
    else:
        file = Path(path).expanduser()
        if not file.is_file():
            raise ValueError(f"idk_answers_file {path} does not exist.")
        text = file.read_text(encoding="utf-8")
    answers = [line.strip() for line in text.splitlines() if line.strip()]
    if not answers:
        raise ValueError(f"idk_answers_file {path} holds no answer (one per line).")
    return answers


def draw_per_row(choices: Sequence[Sequence[str]], seed: int) -> list[str]:
    """One entry of each row's ``choices``, drawn with a generator seeded by ``seed``."""
    generator = torch.Generator().manual_seed(int(seed))
    return [list(options)[int(torch.randint(len(options), (1,), generator=generator))] for options in choices]


class _WithAlternates(torch.utils.data.Dataset):
    """Item ``i`` of ``base`` with the tokens of preferred answer ``i`` under the ``alternate_`` prefix."""

    def __init__(self, base: Any, alternates: Dataset):
        self.base = base
        self.alternates = alternates

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> dict[str, Any]:
        item = self.base[int(index)]
        out = {k: v for k, v in item.items() if k in MODEL_COLUMNS or k.startswith(RETAIN_PREFIX)}
        alternate = self.alternates[int(index)]
        out.update({ALTERNATE_PREFIX + key: alternate[key] for key in MODEL_COLUMNS})
        return out

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.base, "set_epoch"):
            self.base.set_epoch(epoch)


class _AlternateCollator:
    """Collates the ``alternate_`` fields with ``base`` and the rest with ``inner`` (the paired collator)."""

    def __init__(self, inner: Any, base: Any):
        self.inner = inner
        self.base = base

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        rest = [{k: v for k, v in f.items() if not k.startswith(ALTERNATE_PREFIX)} for f in features]
        alternates = [{k[len(ALTERNATE_PREFIX):]: v for k, v in f.items() if k.startswith(ALTERNATE_PREFIX)}
                      for f in features]
        batch = dict(self.inner(rest))
        batch.update({ALTERNATE_PREFIX + k: v for k, v in self.base(alternates).items()})
        return batch


class PreferenceTrainer(ForgetRetainTrainer):
    """The DPO objective ``forget_weight * L_DPO + retain_weight * retain_term``
    (:func:`~hf_unlearn.methods.baselines.loss.dpo_loss`) with a preferred answer per TOFU-shaped forget row, from
    :meth:`preferred_answers`. Logs ``alternate_nll``, ``forget_log_ratio`` and ``alternate_log_ratio``."""

    config_class: ClassVar[type[PreferenceConfig]] = PreferenceConfig
    accepts_documents: ClassVar[bool] = False  # a preferred answer needs a question to answer
    _batch_prefixes = (RETAIN_PREFIX, ALTERNATE_PREFIX)

    def _check_inputs(self, model: Any, args: Any, train_dataset: Any, *rest: Any) -> tuple:
        """The preferred answers, checked before the base's input checks."""
        forget = as_dataset(train_dataset)
        self._preferred = self.preferred_answers(forget, args) if len(forget) else []
        self._questions = forget["question"] if len(forget) else []
        return super()._check_inputs(model, args, forget, *rest)

    def _finish_init(self) -> None:
        rows = [{"question": q, "answer": a} for q, a in zip(self._questions, self._preferred)]
        alternates = to_trl_format(rows, self.processing_class, getattr(self.args, "prompt_template", None))
        if not self._skip_prepare_dataset:
            alternates = self._prepare_dataset(alternates, self.processing_class, self.args, False, None, "alternate")
        if len(alternates) != len(self.forget_dataset):
            raise ValueError(
                f"{len(self.forget_dataset) - len(alternates)} preferred answers have no token within "
                f"max_length={self.args.max_length}; shorten the questions or raise max_length."
            )
        self.alternate_dataset = alternates
        self.train_dataset = _WithAlternates(self.train_dataset, alternates)
        self.data_collator = _AlternateCollator(self.data_collator, self.data_collator.base)

    @classmethod
    def preferred_answers(cls, forget: Dataset, args: PreferenceConfig) -> list[str]:
        """The preferred answer of each forget row (checked before any work)."""
        raise NotImplementedError(f"{cls.__name__} must implement `preferred_answers`.")

    @classmethod
    def check_forget_rows(cls, rows: Any, args: PreferenceConfig) -> None:
        """Refuse (``ValueError``) forget rows without a usable preferred answer."""
        cls.preferred_answers(as_dataset(rows), args)

    @classmethod
    def _check_tofu_rows(cls, forget: Dataset) -> None:
        if not {"question", "answer"} <= set(forget.column_names):
            raise ValueError(
                f"{cls.__name__} needs TOFU-shaped forget rows (`question`, `answer`) to pair each with its preferred "
                f"answer; the forget set has columns {sorted(forget.column_names)}."
            )

    @classmethod
    def needs_reference_model(cls, args: Any) -> bool:
        return True

    def run_fingerprint(self) -> dict[str, Any]:
        """The base fingerprint with the preferred answers' tokens folded into the forget rows' digest."""
        if self._fingerprint is None:
            fingerprint = super().run_fingerprint()
            forget = fingerprint["data"]["forget"]
            joined = hashlib.sha256(f"{forget}|{_rows_digest(self.alternate_dataset)}".encode()).hexdigest()
            fingerprint["data"]["forget"] = f"{forget.split(':')[0]}:{joined}"
        return self._fingerprint

    def forget_term(self, model: Any, forget: Any, inputs: dict[str, Any], denominators: LossDenominators
                    ) -> torch.Tensor:
        alternate = self.score(model, inputs, ALTERNATE_PREFIX)
        ref_forget = self.reference_scores(inputs).sequence_log_probs
        ref_alternate = self.reference_scores(inputs, ALTERNATE_PREFIX).sequence_log_probs
        self.log_metric("alternate_nll", alternate.mean_nll)
        self.log_metric("forget_log_ratio", (forget.sequence_log_probs - ref_forget).mean())
        self.log_metric("alternate_log_ratio", (alternate.sequence_log_probs - ref_alternate).mean())
        return dpo_loss(alternate.sequence_log_probs, ref_alternate, forget.sequence_log_probs, ref_forget,
                        self.args.beta, denominators.forget_sequences)


class UnlearnDPOTrainer(PreferenceTrainer):
    """DPO for unlearning: each forget row's ``alternate_column`` answer preferred over its answer."""

    _name = "DPO"
    _method = "dpo"
    _title = "DPO (Direct Preference Optimization, given alternate answers)"
    _paper: ClassVar[dict[str, str]] = {
        "title": "Direct Preference Optimization: Your Language Model is Secretly a Reward Model", "id": "2305.18290"}
    _cli_help = "DPO preferring each forget row's alternate answer (column alternate_answer) over its answer"
    _tag_names = [*UnlearningTrainer._tag_names, "dpo"]
    config_class = UnlearnDPOConfig

    @classmethod
    def forget_columns(cls, args: UnlearnDPOConfig) -> tuple[str, ...]:
        return (args.alternate_column,)

    @classmethod
    def preferred_answers(cls, forget: Dataset, args: UnlearnDPOConfig) -> list[str]:
        cls._check_tofu_rows(forget)
        column = args.alternate_column
        if column not in forget.column_names:
            raise ValueError(
                f"DPO needs the preferred answer of each forget row in column {column!r} (alternate_column); the "
                f"forget rows have {sorted(forget.column_names)}. Add it (a string, or a list of strings), name "
                "another column with alternate_column, or use IdkDPO (method 'idk_dpo') to prefer a refusal answer."
            )
        choices = []
        for i, value in enumerate(forget[column]):
            options = [value] if isinstance(value, str) else value
            if not isinstance(options, (list, tuple)) or not options or not all(
                    isinstance(o, str) and o.strip() for o in options):
                raise ValueError(f"Forget row {i}: column {column!r} must hold a non-empty string or a list of them, "
                                 f"got {value!r}.")
            choices.append(options)
        return draw_per_row(choices, args.seed)


class IdkDPOTrainer(PreferenceTrainer):
    """IdkDPO (TOFU's baseline): a refusal answer of :func:`load_idk_answers`, drawn per forget row with ``seed``,
    preferred over the forget answer."""

    _name = "IdkDPO"
    _method = "idk_dpo"
    _title = "IdkDPO (DPO towards \"I don't know\")"
    _paper: ClassVar[dict[str, str]] = {"title": "TOFU: A Task of Fictitious Unlearning for LLMs", "id": "2401.06121"}
    _cli_help = "DPO preferring an \"I don't know\" answer over each forget answer"
    _tag_names = [*UnlearningTrainer._tag_names, "idk-dpo"]
    config_class = IdkDPOConfig

    @classmethod
    def preferred_answers(cls, forget: Dataset, args: IdkDPOConfig) -> list[str]:
        cls._check_tofu_rows(forget)
        answers = load_idk_answers(args.idk_answers_file)
        return draw_per_row([answers] * len(forget), args.seed)
