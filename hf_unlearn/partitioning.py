"""Models whose weights are partitioned across processes (DeepSpeed ZeRO-3, FSDP, FSDP2)."""

from __future__ import annotations

from typing import Any

__all__ = ["is_partitioned", "vocab_size"]


def _is_sharded_dtensor(tensor: Any) -> bool:
    """Whether ``tensor`` is an FSDP2 ``DTensor`` with a ``Shard`` placement."""
    try:
        from torch.distributed.tensor import DTensor, Shard
    except ImportError:  # pragma: no cover - a torch without torch.distributed
        return False
    return isinstance(tensor, DTensor) and any(isinstance(p, Shard) for p in tensor.placements)


def _is_partitioned_tensor(tensor: Any) -> bool:
    return hasattr(tensor, "ds_shape") or _is_sharded_dtensor(tensor) or (
        getattr(tensor, "numel", None) is not None and tensor.numel() == 0 and tensor.dim() == 1)


def is_partitioned(model: Any) -> bool:
    """Whether some parameter is a ZeRO-3 placeholder, a sharded FSDP2 ``DTensor`` or an empty FSDP1 flat
    shard: its values are not all on this process."""
    return any(_is_partitioned_tensor(p) for p in model.parameters())


def vocab_size(model: Any) -> int:
    """The rows ``V`` of ``model``'s LM head: the weight's when held whole here, else the config's, else
    ZeRO-3's ``ds_shape[0]``; ``ValueError`` when none says."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        raise ValueError(f"{type(model).__name__} has no output embeddings (LM head): a causal LM is needed.")
    weight = head.weight
    if not _is_partitioned_tensor(weight):
        return int(weight.shape[0])
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if found := getattr(text, "vocab_size", None):
        return int(found)
    if getattr(weight, "ds_shape", None):
        return int(weight.ds_shape[0])
    raise ValueError(f"The LM head of {type(model).__name__} is partitioned across processes and its config "
                     "has no vocab_size: the vocabulary size cannot be read.")
