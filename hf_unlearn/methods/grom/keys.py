"""Key collection: a key is the input ``x`` of an edited ``nn.Linear`` at a position ``t`` with
``labels[t + 1] != -100``. Retain and general keys are folded into float64 second moments ``X X^T``; forget keys are
kept with the gold token, its margin and the margin gradient the targets need.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from tqdm.auto import tqdm

from ...data.prompts import IGNORE_INDEX
from .attribution import TargetModule, direct_contributions
from .targets import logit_lens_rows, margin_and_competitors, margin_gradient_logits, margin_gradient_residual


def _dist() -> tuple[bool, int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return True, torch.distributed.get_rank(), torch.distributed.get_world_size()
    return False, 0, 1


def _all_gather_rows(t: torch.Tensor) -> torch.Tensor:
    """Concatenate each process's ``[n_p, ...]`` tensor in rank order (sizes may differ)."""
    world = torch.distributed.get_world_size()
    n = torch.tensor([t.shape[0]], device=t.device)
    sizes = [torch.zeros_like(n) for _ in range(world)]
    torch.distributed.all_gather(sizes, n)
    width = int(max(s.item() for s in sizes))
    padded = t.new_zeros((width, *t.shape[1:]))
    padded[: t.shape[0]] = t
    chunks = [torch.zeros_like(padded) for _ in range(world)]
    torch.distributed.all_gather(chunks, padded.contiguous())
    return torch.cat([c[: int(s.item())] for c, s in zip(chunks, sizes)])


class KeyCollector:
    """Hooks the modules and the final norm and accumulates GROM statistics: keys of ``key_modules``, and the
    direct gold-logit contributions of ``attribution_modules``; ``suppression``: record the margin gradients."""

    def __init__(
        self, model: Any, key_modules: list[TargetModule], attribution_modules: list[TargetModule], *,
        suppression: bool, gram_device: str | torch.device | None = None,
    ) -> None:
        self.model, self.key_modules, self.attribution_modules = model, key_modules, attribution_modules
        self.gram_device = None if gram_device is None else torch.device(gram_device)
        self.suppression = suppression
        self.norm = _final_norm(model)
        self.unembed = model.get_output_embeddings().weight
        self.need_lm = any(t.is_lm_head for t in key_modules)
        self.need_resid = any(not t.is_lm_head for t in key_modules)
        self._at: tuple[torch.Tensor, torch.Tensor] | None = None  # (rows, columns) of the batch's key positions
        self._cache: dict[str, Any] = {}
        self.retain_moment = {t.name: None for t in key_modules}
        self.num_retain = 0
        self.generic_moment = {t.name: None for t in key_modules}
        self.num_generic = 0
        self.forget_keys: dict[str, list[torch.Tensor]] = {t.name: [] for t in key_modules}
        self.out_norm_sum: dict[str, Any] = {t.name: 0.0 for t in key_modules}  # float64 sums on the device
        self.records: dict[str, list[torch.Tensor]] = {k: [] for k in ("example", "position", "gold", "margin", "w_resid", "w_logit")}
        self.attr: dict[str, dict[int, Any]] = {"forget": {t.layer: 0.0 for t in attribution_modules},
                                                "retain": {t.layer: 0.0 for t in attribution_modules}}
        self.counts = {"forget": 0, "retain": 0}

    def _hook(self, name: str, want_out: bool):
        def hook(module, args, output):
            if self._at is None:  # calls outside the model's forward (e.g. the norm's VJP)
                return
            x = args[0]
            self._cache[name] = (x[self._at], output[self._at] if want_out else None)

        return hook

    def _norm_hook(self, module, args, output):
        if self._at is None:
            return
        self._cache["__final__"] = args[0][self._at]

    def __enter__(self) -> KeyCollector:
        self._handles = []
        attr_names = {t.name for t in self.attribution_modules}
        for t in {t.name: t for t in self.key_modules + self.attribution_modules}.values():
            # outputs are needed for attribution, and (their norms) for representation corruption
            want_out = t.name in attr_names or not self.suppression
            self._handles.append(t.module.register_forward_hook(self._hook(t.name, want_out)))
        self._handles.append(self.norm.register_forward_hook(self._norm_hook))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._cache = {}

    @torch.no_grad()
    def run(self, batches: Iterable[dict[str, Any]], role: str, progress: bool = True, total: int | None = None) -> None:
        """Forward every batch and accumulate ``role`` (``forget``, ``retain`` or ``generic``) statistics."""
        if role not in ("forget", "retain", "generic"):
            raise ValueError(f"role must be 'forget', 'retain' or 'generic', got {role!r}")
        device = self.unembed.device
        for batch in tqdm(batches, desc=f"GROM keys ({role})", disable=not progress, total=total, leave=False):
            labels = batch["labels"]  # on the host: no wait for the device
            rows, cols = (labels[:, 1:] != IGNORE_INDEX).nonzero(as_tuple=True)  # row-major, as boolean indexing
            n_keys = len(rows)
            if n_keys == 0:
                continue
            self._at = (rows.to(device), cols.to(device))
            out = self.model(
                input_ids=batch["input_ids"].to(device),
                attention_mask=batch["attention_mask"].to(device),
                position_ids=batch["position_ids"].to(device),
            )
            at, self._at = self._at, None
            gold = labels[rows, cols + 1].to(device)
            hidden = self._cache["__final__"]
            if role == "generic":
                self.num_generic += n_keys
                for t in self.key_modules:
                    self._add_moment(self.generic_moment, t.name, self._cache[t.name][0])
                self._cache = {}
                continue
            self.counts[role] += n_keys
            if self.attribution_modules:
                lens = logit_lens_rows(self.norm, hidden, self.unembed, gold)
                for t in self.attribution_modules:
                    total_t = direct_contributions(self._cache[t.name][1], lens).double().sum()
                    self.attr[role][t.layer] = self.attr[role][t.layer] + total_t
            if role == "retain":
                self.num_retain += n_keys
                for t in self.key_modules:
                    self._add_moment(self.retain_moment, t.name, self._cache[t.name][0])
                continue
            examples = torch.as_tensor(batch["example_ids"], dtype=torch.long)
            self.records["example"].append(examples[rows].to(device))
            self.records["position"].append(cols.to(device))
            self.records["gold"].append(gold)
            for t in self.key_modules:
                x, o = self._cache[t.name]
                self.forget_keys[t.name].append(x.float())
                if o is not None:
                    self.out_norm_sum[t.name] = self.out_norm_sum[t.name] + o.float().norm(dim=-1).double().sum()
            if self.suppression:
                margin, q = margin_and_competitors(out.logits[at], gold)
                self.records["margin"].append(margin)
                if self.need_resid:
                    self.records["w_resid"].append(margin_gradient_residual(self.norm, hidden, self.unembed, gold, q))
                if self.need_lm:
                    self.records["w_logit"].append(margin_gradient_logits(gold, q))
            self._cache = {}

    def _add_moment(self, moments: dict[str, Any], name: str, x: torch.Tensor) -> None:
        """``moments[name] += x^T x`` in float64 on :attr:`gram_device`."""
        target = self.gram_device or x.device
        dtype = _gram_block_dtype(x.device)
        m, xb = moments[name], x.to(dtype)
        if dtype == torch.float64 and target == x.device:
            moments[name] = xb.T @ xb if m is None else m.addmm_(xb.T, xb)
            return
        block = (xb.T @ xb).to(device=target, dtype=torch.float64)
        moments[name] = block if m is None else m.add_(block)

    def finalize(self) -> dict[str, Any]:
        """Concatenate, reduce across processes, and order forget records by (example, position)."""
        distributed, _, _ = _dist()
        d_in = {t.name: t.module.in_features for t in self.key_modules}
        device = self.unembed.device
        gram = self.gram_device or device
        def or_zero(found: dict[str, Any]) -> dict[str, torch.Tensor]:
            return {n: m if m is not None else torch.zeros(d_in[n], d_in[n], dtype=torch.float64, device=gram)
                    for n, m in found.items()}

        moments, generic = or_zero(self.retain_moment), or_zero(self.generic_moment)
        forget_keys = {n: torch.cat(v) if v else torch.zeros(0, d_in[n], device=device)
                       for n, v in self.forget_keys.items()}
        (vocab, hidden), none = self.unembed.shape, torch.zeros(0, dtype=torch.long, device=device)
        empty = {"example": none, "position": none, "gold": none, "margin": torch.zeros(0, device=device),
                 "w_resid": torch.zeros(0, hidden, device=device), "w_logit": torch.zeros(0, vocab, device=device)}
        needed = {"example", "position", "gold"}
        if self.suppression:
            needed |= {"margin"} | ({"w_resid"} if self.need_resid else set()) | ({"w_logit"} if self.need_lm else set())
        records = {k: torch.cat(self.records[k]) if self.records[k] else empty[k] for k in sorted(needed)}
        counts = torch.tensor(
            [self.num_retain, self.counts["forget"], self.counts["retain"], self.num_generic],
            dtype=torch.float64, device=device,
        )
        layers = sorted(self.attr["forget"])
        attr = _stack([self.attr["forget"][i] for i in layers] + [self.attr["retain"][i] for i in layers], device)
        norms = _stack([self.out_norm_sum[t.name] for t in self.key_modules], device)
        if distributed:
            for m in [*moments.values(), *generic.values()]:
                _all_reduce_on(m, device)
            for x in (counts, attr, norms):
                torch.distributed.all_reduce(x)
            forget_keys = {n: _all_gather_rows(v.contiguous()) for n, v in forget_keys.items()}
            records = {k: _all_gather_rows(v.contiguous()) for k, v in records.items()}
        if records["example"].numel():
            order = torch.argsort(records["example"] * 1_000_000 + records["position"], stable=True)
            records = {k: v[order] for k, v in records.items()}
            forget_keys = {n: v[order] for n, v in forget_keys.items()}
        n_layers = len(layers)
        return {
            "retain_moment": moments,
            "num_retain": int(counts[0]),
            "generic_moment": generic,
            "num_generic": int(counts[3]),
            "forget_keys": forget_keys,
            "records": records,
            "out_norm_sum": {t.name: float(norms[i]) for i, t in enumerate(self.key_modules)},
            "attribution": {
                "forget": {layer: float(attr[i]) for i, layer in enumerate(layers)},
                "retain": {layer: float(attr[n_layers + i]) for i, layer in enumerate(layers)},
                "forget_count": int(counts[1]),
                "retain_count": int(counts[2]),
            },
        }


def _gram_block_dtype(device: torch.device) -> torch.dtype:
    """float32 on CUDA (float64 products are many times slower there), float64 elsewhere."""
    return torch.float32 if device.type == "cuda" else torch.float64


def _stack(values: list[Any], device: torch.device) -> torch.Tensor:
    """The float64 vector of ``values`` (Python floats or 0-dim tensors) on ``device``."""
    if not values:
        return torch.zeros(0, dtype=torch.float64, device=device)
    return torch.stack([torch.as_tensor(v, dtype=torch.float64).to(device) for v in values])


def _all_reduce_on(m: torch.Tensor, device: torch.device) -> None:
    """All-reduce ``m`` in place through ``device`` (a moment on the host travels to the model's device and back)."""
    if m.device == device:
        torch.distributed.all_reduce(m)
        return
    moved = m.to(device)
    torch.distributed.all_reduce(moved)
    m.copy_(moved)


def _final_norm(model: Any) -> torch.nn.Module:
    """The norm applied to the last residual stream before the LM head."""
    base = getattr(model, "base_model", None) or getattr(model, "model", None)
    for attr in ("norm", "final_layernorm", "ln_f", "final_layer_norm"):
        for owner in (base, getattr(base, "model", None), getattr(model, "transformer", None)):
            mod = getattr(owner, attr, None) if owner is not None else None
            if isinstance(mod, torch.nn.Module):
                return mod
    raise ValueError(
        f"Cannot find the final norm of {type(model).__name__} (looked for .norm / .final_layernorm / .ln_f); "
        "GROM reads targets through it (logit lens)."
    )
