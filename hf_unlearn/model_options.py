"""TRL's model options for every method (:class:`ModelOptions`: the fields of ``trl.ModelConfig`` that apply, with
TRL's names and defaults). With ``use_peft`` a trainer trains a LoRA adapter and its frozen reference is the base
with the adapter disabled."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DTYPE_CHOICES", "ModelOptions", "model_options_dataclass", "parse_model_options"]

#: ``--dtype`` values (``trl.ModelConfig.dtype``'s choices).
DTYPE_CHOICES = ("auto", "bfloat16", "float16", "float32")


@dataclass
class ModelOptions:
    """The fields of ``trl.ModelConfig`` that set how the model loads and trains."""

    dtype: str | None = field(default="float32", metadata={
        "help": "Override the default `torch.dtype` and load the model under this dtype. It defaults to "
                "`'float32'`.", "choices": list(DTYPE_CHOICES)})
    use_peft: bool = field(default=False, metadata={"help": "Whether to use PEFT for training."})
    lora_r: int = field(default=16, metadata={"help": "LoRA R value."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha."})
    lora_dropout: float = field(default=0.05, metadata={"help": "LoRA dropout."})
    lora_target_modules: list[str] | None = field(default=None, metadata={"help": "LoRA target modules."})
    lora_modules_to_save: list[str] | None = field(default=None, metadata={
        "help": "Model layers to unfreeze & train."})
    use_rslora: bool = field(default=False, metadata={
        "help": "Whether to use Rank-Stabilized LoRA, which sets the adapter scaling factor to `lora_alpha/√r`, "
                "instead of the original default value of `lora_alpha/r`."})
    use_dora: bool = field(default=False, metadata={
        "help": "Enable Weight-Decomposed Low-Rank Adaptation (DoRA). This technique decomposes the updates of the "
                "weights into two parts, magnitude and direction. Direction is handled by normal LoRA, whereas the "
                "magnitude is handled by a separate learnable parameter. This can improve the performance of LoRA, "
                "especially at low ranks. Right now, DoRA only supports linear and Conv2D layers. DoRA introduces a "
                "bigger overhead than pure LoRA, so it is recommended to merge weights for inference."})

    def __post_init__(self) -> None:
        if self.dtype is not None and self.dtype not in DTYPE_CHOICES:
            raise ValueError(f"--dtype must be one of {', '.join(DTYPE_CHOICES)}, got {self.dtype!r}.")
        if self.use_peft and not self.lora_r >= 1:
            raise ValueError(f"--lora_r must be >= 1, got {self.lora_r}.")

    def torch_dtype(self) -> Any:
        """The ``dtype`` for ``from_pretrained``: ``"auto"``, else the ``torch`` dtype named."""
        import torch

        return "auto" if self.dtype in (None, "auto") else getattr(torch, self.dtype)

    def trl_model_config(self) -> Any:
        from trl import ModelConfig

        return ModelConfig(**dataclasses.asdict(self))

    def peft_config(self) -> Any:
        """The ``peft.LoraConfig`` of these options, ``None`` without ``use_peft``."""
        from trl import get_peft_config

        return get_peft_config(self.trl_model_config())


def model_options_dataclass(exclude: frozenset[str] | set[str] = frozenset()) -> type:
    """:class:`ModelOptions` without the fields named in ``exclude`` (those the method's config has)."""
    if not exclude:
        return ModelOptions
    kept = [(f.name, f.type, dataclasses.field(default=f.default, metadata=f.metadata))
            for f in dataclasses.fields(ModelOptions) if f.name not in exclude]
    return dataclasses.make_dataclass("ModelOptionsOf", kept)


def parse_model_options(argv: list[str], exclude: frozenset[str] | set[str] = frozenset()
                        ) -> tuple[ModelOptions, list[str]]:
    """``(options, rest)``: the :class:`ModelOptions` given in ``argv`` and the arguments left for the
    method's options; a bad value raises :class:`~hf_unlearn.options.UserError`."""
    from transformers import HfArgumentParser

    from .options import UserError

    class _Parser(HfArgumentParser):
        def error(self, message: str):
            raise UserError(f"model options: {message}")

    parser = _Parser(model_options_dataclass(exclude), allow_abbrev=False, add_help=False)
    try:
        parsed, rest = parser.parse_args_into_dataclasses(args=list(argv), return_remaining_strings=True)
        options = ModelOptions(**dataclasses.asdict(parsed))
    except ValueError as err:
        raise UserError(str(err)) from None
    return options, rest
