"""Re-check an unlearned model after 4-bit NF4 quantization (merge in full precision, then quantize).

Unlearning that only nudges weights a little can be undone by quantization (the quantized model
recovers the forgotten answers), so results should be re-evaluated on the NF4 model.
bitsandbytes >= 0.45 runs NF4 layers on CPU as well as on CUDA.
"""

from __future__ import annotations

import copy
import tempfile
from typing import Any

import torch


def _is_peft_model(model: Any) -> bool:
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a dependency
        return False
    return isinstance(model, PeftModel)


def quantize_nf4(
    model: Any, compute_dtype: torch.dtype = torch.float32, device: str | torch.device | None = None
) -> Any:
    """A 4-bit NF4 copy of ``model`` (the input is left untouched).

    PEFT adapters are merged into a copy of the full-precision weights first; the merged model is
    saved (safetensors) to a temporary folder and reloaded with
    ``BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4")``, which quantizes every
    linear layer except the output head to blockwise NF4 (64 weights per block, one absmax scale).
    ``device`` defaults to the model's device (CPU works with bitsandbytes >= 0.45).
    """
    try:
        import bitsandbytes  # noqa: F401
    except ImportError as err:  # pragma: no cover - bitsandbytes is a dependency
        raise ImportError("quantize_nf4 needs bitsandbytes (pip install bitsandbytes).") from err
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    if getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False):
        raise ValueError("The model is already quantized; quantize the full-precision (merged) model.")
    if _is_peft_model(model):
        model = copy.deepcopy(model).merge_and_unload()
    if not hasattr(model, "save_pretrained"):
        raise ValueError(f"quantize_nf4 needs a transformers PreTrainedModel, got {type(model).__name__}.")
    if device is None:
        try:
            device = next(model.parameters()).device
        except StopIteration:
            device = torch.device("cpu")
    config = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute_dtype
    )
    with tempfile.TemporaryDirectory(prefix="hf_unlearn_nf4_") as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        quantized = AutoModelForCausalLM.from_pretrained(
            tmp, quantization_config=config, device_map={"": str(device)}, dtype=compute_dtype
        )
    quantized.eval()
    return quantized
