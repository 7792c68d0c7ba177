"""Provenance of a T3 head: a fingerprint of the base weights it was fitted on.

A T3 head reads one layer's hidden states of one base model and tilts that model's next-token distribution;
attached to another model of the same shapes it would be silently meaningless. The fingerprint covers every
parameter of the base (each shared parameter once), in the order of ``named_parameters``, through GROM's
per-weight digests (:func:`hf_unlearn.methods.grom.provenance.weight_fingerprint`: SHA-256 of the float32 bytes and of
the bfloat16-rounded bytes)::

    sha256      = SHA-256( "name:shape:sha256(float32 bytes)\\n" for every parameter )
    sha256_bf16 = SHA-256( "name:shape:sha256(bfloat16 bytes)\\n" for every parameter )

:func:`check_base_weights` accepts a model that matches either digest (the same weights in float32, or held in
bfloat16 / float16) whatever path or name it was loaded from, and refuses every other one. A verified model is
remembered by the identity, storage and version counter of its parameters, so the evaluator's per-batch
scoring does not hash the weights again; an in-place change of a parameter bumps its version and is checked
anew (a change made through ``param.data`` bypasses the version counter and is not seen).
"""

from __future__ import annotations

import hashlib
import weakref
from typing import Any

from ..grom.provenance import BaseModelMismatchError, weight_fingerprint

FINGERPRINT_VERSION = 1

__all__ = ["BaseModelMismatchError", "base_weights_fingerprint", "check_base_weights"]


def _plain(model: Any) -> Any:
    """The transformers model under a ``PeftModel`` (whose names carry a ``base_model.model.`` prefix)."""
    if hasattr(model, "peft_config") and hasattr(model, "get_base_model"):
        return model.get_base_model()
    return model


def base_weights_fingerprint(model: Any) -> dict[str, Any]:
    """``{"version", "algorithm", "parameters", "sha256", "sha256_bf16"}`` of every parameter of ``model``."""
    full, bf16 = hashlib.sha256(), hashlib.sha256()
    count = 0
    for name, param in _plain(model).named_parameters():
        digest = weight_fingerprint(param)
        shape = "x".join(str(s) for s in param.shape)
        full.update(f"{name}:{shape}:{digest['sha256']}\n".encode())
        bf16.update(f"{name}:{shape}:{digest['sha256_bf16']}\n".encode())
        count += 1
    return {
        "version": FINGERPRINT_VERSION,
        "algorithm": "sha256 over (name, shape, sha256 of the float32 / bfloat16-rounded bytes) of every parameter",
        "parameters": count,
        "sha256": full.hexdigest(),
        "sha256_bf16": bf16.hexdigest(),
    }


# model -> (fingerprint digest it matched, state of its parameters when it did)
_VERIFIED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _state(model: Any) -> tuple:
    return tuple((name, p.data_ptr(), p._version, tuple(p.shape), p.dtype)
                 for name, p in _plain(model).named_parameters())


def check_base_weights(fingerprint: dict[str, Any] | None, model: Any, what: str = "This T3 head") -> None:
    """Refuse (:class:`BaseModelMismatchError`, a ``ValueError``) a ``model`` whose weights are not the
    fingerprinted ones; ``fingerprint=None`` (a head saved without one) is refused too."""
    if not fingerprint or "sha256" not in fingerprint:
        raise BaseModelMismatchError(
            f"{what} records no fingerprint of its base model's weights, so hf-unlearn cannot check that it belongs "
            "to this model; refit it with fit_t3 on this model and save it again."
        )
    state = _state(model)
    try:
        cached = _VERIFIED.get(model)
    except TypeError:  # not weak-referenceable
        cached = None
    if cached is not None and cached == (fingerprint["sha256"], state):
        return
    got = base_weights_fingerprint(model)
    if got["sha256"] != fingerprint["sha256"] and got["sha256_bf16"] != fingerprint.get("sha256_bf16"):
        raise BaseModelMismatchError(
            f"{what} was fitted on another base model: the weights differ (sha256 {got['sha256'][:12]} over "
            f"{got['parameters']} parameters != {str(fingerprint['sha256'])[:12]} over "
            f"{fingerprint.get('parameters')}). A T3 head only fits the model whose hidden states it was trained "
            "on; attach it to that model, or refit it with fit_t3 on this one."
        )
    try:
        _VERIFIED[model] = (fingerprint["sha256"], state)
    except TypeError:
        pass
