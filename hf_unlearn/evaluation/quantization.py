"""4-bit NF4 and 8-bit LLM.int8() copies of a model (merged in full precision, then quantized), to re-check an
unlearned model: edits smaller than half a quantization step are rounded away.

``method="roundtrip"`` (default) quantizes and dequantizes, through bitsandbytes' functions, every weight
``BitsAndBytesConfig`` would quantize and evaluates in full precision; ``method="bnb"`` loads real bitsandbytes
layers (on CPU, NF4 layers the AVX512-BF16 kernel refuses take the round trip)."""

from __future__ import annotations

import copy
import tempfile
from typing import Any, Literal

import torch
from accelerate.utils import is_peft_model
from torch import nn

from ..logprobs import model_device
from ..model_copy import independent_copy

NF4_BLOCKSIZE = 64
"""Block size of ``BitsAndBytesConfig``'s 4-bit quantization (one absmax scale per 64 weights)."""

CPU_PACKED_BLOCK_N = 32
"""Output-feature block of bitsandbytes' AVX512-BF16 CPU kernel (``_convert_weight_packed_for_cpu``)."""

NF4_CODE = (
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
)
"""The 16 NF4 code values (quantiles of N(0, 1) normalised to [-1, 1]; QLoRA, Dettmers et al. 2023)."""


def _require_bitsandbytes() -> Any:
    try:
        import bitsandbytes.functional as bnb_functional
    except ImportError as err:  # pragma: no cover - bitsandbytes is an optional extra
        raise ImportError("The NF4 re-check needs bitsandbytes: pip install 'hf-unlearn[quantization]'.") from err
    return bnb_functional


def nf4_roundtrip(weight: torch.Tensor, blocksize: int = NF4_BLOCKSIZE, double_quant: bool = False) -> torch.Tensor:
    """NF4 quantize-dequantize ``weight`` (``[out, in]``) as bitsandbytes stores it: over the row-major flattening,
    block ``b`` of ``blocksize`` weights has ``s_b = max_i |W_i|`` and ``W_hat_i = s_b * c[argmin_j |W_i / s_b - c_j|]``
    with ``c`` = :data:`NF4_CODE` (``double_quant``: the scales quantized too). Returned in ``weight``'s dtype."""
    functional = _require_bitsandbytes()
    source = weight.detach().float().contiguous()
    packed, state = functional.quantize_4bit(
        source, blocksize=blocksize, compress_statistics=double_quant, quant_type="nf4"
    )
    return dequantize_nf4_flat(packed, state).reshape(weight.shape).to(weight.dtype)


def dequantize_nf4_flat(packed: torch.Tensor, state: Any) -> torch.Tensor:
    """Dequantize bitsandbytes NF4 bytes over the row-major flattening of the weight (bitsandbytes' CPU
    ``dequantize_4bit`` mis-assigns the scales of rows that are not whole blocks); a tensor of ``state.shape``."""
    functional = _require_bitsandbytes()
    flat = copy.copy(state)
    flat.shape = torch.Size([int(torch.Size(state.shape).numel())])
    return functional.dequantize_4bit(packed.reshape(-1, 1), flat).reshape(state.shape)


def cpu_packed_kernel_accepts(out_features: int, in_features: int, blocksize: int = NF4_BLOCKSIZE) -> bool:
    """Whether bitsandbytes' AVX512-BF16 CPU kernel can repack an NF4 weight of this shape:
    ``out_features % 32 == 0`` and ``in_features % blocksize == 0``."""
    return out_features % CPU_PACKED_BLOCK_N == 0 and in_features % blocksize == 0


def _modules_to_quantize(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules ``BitsAndBytesConfig(load_in_4bit=True)`` replaces: ``nn.Linear`` and GPT-2 ``Conv1D``, minus the
    output head, tied weights and the last module (transformers' ``get_keys_to_not_convert``)."""
    from transformers.pytorch_utils import Conv1D
    from transformers.quantizers.base import get_keys_to_not_convert

    try:
        skip = get_keys_to_not_convert(model)
    except Exception:  # noqa: BLE001 - non-standard models: skip only the output head
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        skip = [name for name, module in model.named_modules() if head is not None and module is head]

    def skipped(name: str) -> bool:
        return any(name == key or name.endswith("." + key) or name.startswith(key + ".") for key in skip)

    return [
        (name, module)
        for name, module in model.named_modules()
        if (type(module) is nn.Linear or isinstance(module, Conv1D)) and not skipped(name)
    ]


def merged_copy(model: Any) -> Any:
    """An independent full-precision copy of ``model`` with any PEFT adapter merged in (``model`` is untouched);
    refuses an already quantized model or one that is not a transformers ``PreTrainedModel``."""
    if getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False):
        raise ValueError("The model is already quantized; quantize the full-precision (merged) model.")
    # independent_copy: a plain deep copy of a model trained by SFTTrainer would run the original's weights
    if is_peft_model(model):
        return independent_copy(model).merge_and_unload()
    if not hasattr(model, "save_pretrained"):
        raise ValueError(f"Quantizing needs a transformers PreTrainedModel, got {type(model).__name__}.")
    return independent_copy(model)


def _roundtrip_model(model: Any, compute_dtype: torch.dtype, device: torch.device,
                     roundtrip: Any = None) -> Any:
    """A merged copy of ``model`` whose quantizable weights went through ``roundtrip`` (default: NF4)."""
    from transformers.pytorch_utils import Conv1D

    roundtrip = roundtrip or nf4_roundtrip
    quantized = merged_copy(model).to(device=device, dtype=compute_dtype)
    with torch.no_grad():
        for _, module in _modules_to_quantize(quantized):
            if isinstance(module, Conv1D):  # weight is [in, out]; bitsandbytes quantizes its [out, in] transpose
                module.weight.copy_(roundtrip(module.weight.t()).t())
            else:
                module.weight.copy_(roundtrip(module.weight))
    return quantized.eval()


def _load_bnb_copy(model: Any, quantization_config: Any, compute_dtype: torch.dtype, device: torch.device) -> Any:
    """A merged copy of ``model`` saved to a temporary folder and loaded back with ``quantization_config``."""
    from transformers import AutoModelForCausalLM

    merged = merged_copy(model)
    with tempfile.TemporaryDirectory(prefix="hf_unlearn_quantized_") as tmp:
        merged.save_pretrained(tmp, safe_serialization=True)
        return AutoModelForCausalLM.from_pretrained(
            tmp, quantization_config=quantization_config, device_map={"": str(device)}, dtype=compute_dtype,
            trust_remote_code=False,
        )


def _fallback_unpackable_layers(model: nn.Module, compute_dtype: torch.dtype) -> list[str]:
    """Replace every CPU ``Linear4bit`` whose shape the AVX512-BF16 kernel refuses by a full-precision
    ``nn.Linear`` holding that layer's own dequantized NF4 weight (the round trip). Returns the replaced names."""
    import bitsandbytes as bnb

    replaced = []
    for name, module in list(model.named_modules()):
        if not isinstance(module, bnb.nn.Linear4bit):
            continue
        if cpu_packed_kernel_accepts(module.out_features, module.in_features, module.weight.quant_state.blocksize):
            continue
        weight = dequantize_nf4_flat(module.weight.data, module.weight.quant_state)
        linear = nn.Linear(module.in_features, module.out_features, bias=module.bias is not None)
        with torch.no_grad():
            linear.weight.copy_(weight.reshape(module.out_features, module.in_features))
            if module.bias is not None:
                linear.bias.copy_(module.bias)
        linear.to(device=weight.device, dtype=compute_dtype).requires_grad_(False)
        model.set_submodule(name, linear)
        replaced.append(name)
    return replaced


def quantize_nf4(
    model: Any, compute_dtype: torch.dtype | None = None, device: str | torch.device | None = None,
    method: Literal["roundtrip", "bnb"] = "roundtrip",
) -> Any:
    """A 4-bit NF4 copy of ``model`` (untouched; PEFT adapters merged into the copy): every linear layer except
    the output layer quantized as ``BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4")`` does, by
    ``method`` (module docstring). ``compute_dtype`` defaults to the model's dtype, ``device`` to its device."""
    _require_bitsandbytes()
    if method not in ("roundtrip", "bnb"):
        raise ValueError(f"method must be 'roundtrip' or 'bnb', got {method!r}.")
    device = torch.device(device) if device is not None else model_device(model)
    if compute_dtype is None:
        compute_dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    if method == "roundtrip":
        return _roundtrip_model(model, compute_dtype, device)
    from transformers import BitsAndBytesConfig

    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute_dtype)
    quantized = _load_bnb_copy(model, config, compute_dtype, device)
    if device.type == "cpu":
        _fallback_unpackable_layers(quantized, compute_dtype)
    return quantized.eval()


INT8_MAX = 127
"""LLM.int8()'s code range: weights are stored as ``round(127 W / s_r)`` in ``[-127, 127]``."""


def int8_roundtrip(weight: torch.Tensor) -> torch.Tensor:
    """LLM.int8() quantize-dequantize of ``weight`` (``[out, in]``), as ``Linear8bitLt`` stores it: with
    ``V = fp16(W)``, ``s_r = max_j |V_rj|``, ``Q_rj = round(127 V_rj / s_r)`` and ``W_hat_rj = Q_rj s_r / 127`` (a row
    of zeros stays zero); by bitsandbytes when installed, else in torch. Returned in ``weight``'s dtype."""
    half = weight.detach().to(torch.float16).contiguous()
    try:
        functional = _require_bitsandbytes()
    except ImportError:  # pragma: no cover - bitsandbytes is an optional extra
        functional = None
    if functional is not None:
        quantized, scales, _ = functional.int8_vectorwise_quant(half)
        out = functional.int8_vectorwise_dequant(quantized, scales).float()
    else:  # pragma: no cover - exercised only without bitsandbytes
        scales = half.abs().amax(dim=1).float()
        quantized = torch.round(half.float() * (INT8_MAX / scales.unsqueeze(-1))).to(torch.int8)
        out = quantized.float() * scales.unsqueeze(-1) / INT8_MAX
    out = torch.where(scales.unsqueeze(-1) > 0, out, torch.zeros_like(out))
    return out.to(weight.dtype)


def quantize_int8(
    model: Any, compute_dtype: torch.dtype = torch.float32, device: str | torch.device | None = None,
    method: Literal["roundtrip", "bnb"] = "roundtrip",
) -> Any:
    """An 8-bit LLM.int8() copy of ``model`` (untouched; PEFT adapters merged into the copy): the layers
    ``BitsAndBytesConfig(load_in_8bit=True)`` converts get :func:`int8_roundtrip` weights, by ``method`` (``"bnb"``
    also quantizes activations at run time). ``device`` defaults to the model's device."""
    if method not in ("roundtrip", "bnb"):
        raise ValueError(f"method must be 'roundtrip' or 'bnb', got {method!r}.")
    if method == "bnb":
        _require_bitsandbytes()
    device = torch.device(device) if device is not None else model_device(model)
    if method == "roundtrip":
        return _roundtrip_model(model, compute_dtype, device, roundtrip=int8_roundtrip)
    from transformers import BitsAndBytesConfig

    return _load_bnb_copy(model, BitsAndBytesConfig(load_in_8bit=True), compute_dtype, device).eval()
