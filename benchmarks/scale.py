"""Peak memory and time of each entry point at real width, with the memory plan's estimate beside the measured peak.

Models are built from configs with random weights (nothing is downloaded): Llama-3.1-8B's and Llama-2-7B's exact
shapes (hidden size, MLP width, heads, key/value heads, vocabulary) with a few decoder layers, in bfloat16, on TOFU
forget10 authors 1-4 (the rows in ``benchmarks/data/tofu-scale``, tokenized by a small BPE tokenizer trained on
them). ``--dtype auto`` (the default) builds them in bfloat16 on a GPU or on a CPU that computes bfloat16 natively,
and in float32 on any other CPU, where bfloat16 matrix products run orders of magnitude slower; the plan is made
for the dtype measured. Each entry point (a trainer step with and without PEFT and a reference, GROM's run and save, T3's run and
generation, the selection criterion, ``evaluate_tofu``, the NF4 copy) runs in its own process, so that peaks
are separable: on the CPU the peak resident memory above the process's memory before the model is built, on a
GPU ``torch.cuda.max_memory_allocated``. An entry point whose plan exceeds ``--max-gib`` is not run; the JSON
says so and gives the plan. The extrapolation to 32 layers adds the plan's difference between 32 layers and the
measured depth to the measured peak, and compares it with an 80 GB GPU.

    python benchmarks/scale.py --out benchmarks/results/scale            # CPU, 2 layers, both shapes
    python benchmarks/scale.py --shapes llama-3.1-8b --steps nf4,grom      # a subset
    python benchmarks/scale.py --resume                                    # run only what the JSON lacks
    python benchmarks/scale.py --fits-table                                # fits_80gb.md from the plan and the JSON

``benchmarks/gpu_check.py`` runs the same entry points on a GPU at full depth (:func:`run_step`).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ROWS_DIR = ROOT / "benchmarks" / "data" / "tofu-scale"
GIB = 2**30
GPU_80GB = 80 * 10**9

#: Model shapes (``LlamaConfig`` numbers). ``tiny`` is for dry runs.
SHAPES: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False, rope_theta=500000.0),
    "llama-2-7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=32, vocab_size=32000, tie_word_embeddings=False),
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=1024, tie_word_embeddings=False),
}

#: The trainer steps: ``(method, settings, LoRA rank or None)``; one optimizer step each.
TRAINER_STEPS = {
    "npo_full": ("npo", {}, None),
    "npo_lora": ("npo", {}, 16),
    "grad_ascent_lora": ("grad_ascent", {}, 16),
}
STEPS = (*TRAINER_STEPS, "grom", "t3", "criterion", "evaluate_tofu", "nf4")


def load_rows(n: int) -> dict[str, list[dict[str, Any]]]:
    """The first ``n`` forget10 rows (authors 1-4 hold rows 0-79), as many retain90 rows and ``n // 2`` holdout10
    rows."""
    def read(name: str, k: int) -> list[dict[str, Any]]:
        lines = (ROWS_DIR / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines[:k]]

    return {"forget": read("forget10", min(n, 80)), "retain": read("retain90", n),
            "holdout": read("holdout10", max(2, n // 2))}


def build_tokenizer(rows: dict[str, list[dict[str, Any]]]) -> Any:
    """A 512-token BPE tokenizer trained on the rows (the tiny subjects' tokenizer; ids fit every shape)."""
    from hf_unlearn.demo.tofu_tiny import train_bpe_tokenizer

    texts = [f"{r['question']} {r['answer']}" for part in rows.values() for r in part]
    return train_bpe_tokenizer(texts, vocab_size=512)


def replan(records: list[dict[str, Any]], rows: int) -> None:
    """Recompute each record's plan (and what derives from it) from a model built on the meta device: the plan
    reads the config and the dtype only."""
    import torch

    data = load_rows(rows)
    tokenizer = build_tokenizer(data)
    for record in records:
        if "seconds" not in record and "skipped" not in record:
            continue
        model = build_model(record["shape"], record["layers"], "meta", getattr(torch, record["dtype"]))
        step = record["step"]
        plan = step_plan(step, model, tokenizer, data, trainer_settings(step) if step in TRAINER_STEPS else {})
        record["plan_bytes"] = plan.total if plan is not None else None
        record["plan"] = dict(plan.parts) if plan is not None else None
        _derive(record, tokenizer, data)


def _derive(record: dict[str, Any], tokenizer: Any, data: dict[str, list]) -> None:
    if record.get("plan_bytes") and record.get("peak_bytes") and "seconds" in record:
        record["plan_over_measured"] = record["plan_bytes"] / max(1, record["peak_bytes"])
    record["extrapolated"] = extrapolate(record, tokenizer, data)


def build_model(shape: str, layers: int | None, device: str, dtype: Any) -> Any:
    """A Llama model of ``shape`` with ``layers`` decoder layers (``None``: the shape's own), random weights in
    ``dtype``, built on ``device``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    numbers = dict(SHAPES[shape])
    if layers is not None:
        numbers["num_hidden_layers"] = layers
    config = LlamaConfig(**numbers, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM._from_config(config, dtype=dtype)
    model.config.use_cache = False
    return model.eval()


def step_plan(step: str, model: Any, tokenizer: Any, rows: dict[str, list], settings: dict[str, Any]) -> Any:
    """The memory plan (:mod:`hf_unlearn.memory_plan`) of a method's run (trainer steps, GROM, T3), or of one
    forward pass over a batch for the other entry points; ``None`` for the NF4 copy."""
    from hf_unlearn.memory_plan import (
        MethodNeeds,
        ModelShape,
        Settings,
        method_needs,
        plan_memory,
        run_settings,
    )
    from hf_unlearn.model_options import ModelOptions
    from hf_unlearn.options import validate_settings

    shape = ModelShape.from_config(model.config)
    weight_bytes = model.dtype.itemsize
    texts = [f"{r['question']} {r['answer']}" for r in rows["forget"] + rows["retain"]]
    seq_len = max(len(ids) for ids in tokenizer(texts)["input_ids"]) + 32
    if step == "nf4":
        return None
    method = TRAINER_STEPS[step][0] if step in TRAINER_STEPS else step if step in ("grom", "t3") else None
    if method is None:  # the criterion scores 16 rows a batch, evaluate_tofu 4; either at most the rows it has
        batch = min(16 if step == "criterion" else 4, len(rows["forget"]))
        return plan_memory(shape, MethodNeeds(trains=False, retain_pairing=False),
                           Settings(weight_bytes=weight_bytes, batch=batch, seq_len=seq_len))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = validate_settings(method, settings, tempfile.gettempdir())
    lora = TRAINER_STEPS.get(step, (None, None, None))[2]
    options = ModelOptions(use_peft=lora is not None, lora_r=lora or 16)
    needs = method_needs(method, config, shape, weight_bytes)
    return plan_memory(shape, needs, run_settings(config, options, weight_bytes, seq_len))


def trainer_settings(step: str) -> dict[str, Any]:
    return {**TRAINER_STEPS[step][1], "max_steps": 1, "per_device_train_batch_size": 4, "learning_rate": 1e-5,
            "gradient_checkpointing": False, "logging_steps": 1, "save_strategy": "no"}


def run_entry_point(step: str, model: Any, tokenizer: Any, rows: dict[str, list], work: Path,
                    quick: bool) -> dict[str, Any]:
    """Run one entry point; returns what it reports beside its time and peak."""
    from hf_unlearn.run import TrainOptions, fit_or_train, prepare_inputs

    forget, retain = rows["forget"], rows["retain"]
    if step in TRAINER_STEPS:
        from peft import LoraConfig

        method, _, lora = TRAINER_STEPS[step]
        peft = LoraConfig(r=lora, lora_alpha=2 * lora, target_modules=["q_proj", "v_proj"]) if lora else None
        inputs = prepare_inputs(method, model, tokenizer, forget, retain, work / step, trainer_settings(step))
        result = fit_or_train(inputs, TrainOptions(peft_config=peft))
        return {"global_step": result.info.get("global_step"), "trainable_params": result.trainable_params}
    if step in ("grom", "t3"):
        result = fit_or_train(prepare_inputs(step, model, tokenizer, forget, retain, work / step))
        saved = time.perf_counter()
        result.save_pretrained(work / step / "saved")
        out = {"run_seconds": result.seconds, "save_seconds": time.perf_counter() - saved}
        if step == "t3":
            from hf_unlearn.evaluation import generate_answers

            started = time.perf_counter()
            generate_answers(result.model, tokenizer, [r["question"] for r in forget[:2]], batch_size=2,
                             max_new_tokens=4 if quick else 16, generation_kwargs=result.generation_kwargs)
            out["generate_seconds"] = time.perf_counter() - started
        return out
    if step == "criterion":
        from hf_unlearn.selection import SelectionCriterion

        criterion = SelectionCriterion(forget, rows["holdout"], retain[: max(2, len(retain) // 4)])
        return {"measurement": {k: v for k, v in criterion.measure(model, tokenizer).items()
                                if isinstance(v, (int, float)) or v is None}}
    if step == "evaluate_tofu":
        from hf_unlearn.evaluation import evaluate_tofu

        report = evaluate_tofu(model, tokenizer, source=str(ROWS_DIR), max_examples=2 if quick else 4,
                               max_new_tokens=4 if quick else 16, progress=False, batch_size=4)
        return {"forget_rouge_l": report.splits["forget"].get("rouge_l_recall")}
    if step == "nf4":
        from hf_unlearn.evaluation import quantize_nf4

        quantized = quantize_nf4(model)
        return {"dtype": str(next(quantized.parameters()).dtype)}
    raise ValueError(f"unknown step {step!r}")


def _import_libraries() -> None:
    import peft  # noqa: F401
    import trl  # noqa: F401

    import hf_unlearn.evaluation  # noqa: F401
    import hf_unlearn.run  # noqa: F401
    import hf_unlearn.selection  # noqa: F401


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def resolve_dtype(name: str, device: str) -> str:
    """``"auto"``: ``"bfloat16"`` on CUDA or a CPU with native bfloat16, else ``"float32"``; other names as given."""
    if name != "auto":
        return name
    if device.startswith("cuda"):
        return "bfloat16"
    from unlearn_bench.subjects import cpu_has_native_bf16

    return "bfloat16" if cpu_has_native_bf16() else "float32"


def run_step(step: str, shape: str, layers: int | None, device: str, rows: int, quick: bool = False,
             max_bytes: float | None = None, dtype: str = "bfloat16") -> dict[str, Any]:
    """Build the model and run ``step`` in this process: ``{seconds, peak_bytes, plan_bytes, plan, ...}``, with
    ``error`` (and ``out_of_memory``) when it failed, ``skipped`` when its plan exceeds ``max_bytes``."""
    import torch

    torch.manual_seed(0)
    data = load_rows(rows)
    tokenizer = build_tokenizer(data)
    cuda = device.startswith("cuda")
    _import_libraries()  # their memory is not the entry point's
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    baseline = _rss_bytes()
    record: dict[str, Any] = {"step": step, "shape": shape, "layers": layers or SHAPES[shape]["num_hidden_layers"],
                              "device": device, "dtype": dtype}
    started = time.perf_counter()
    try:
        model = build_model(shape, layers, device, getattr(torch, dtype))
        record["build_seconds"] = time.perf_counter() - started
        settings = trainer_settings(step) if step in TRAINER_STEPS else {}
        plan = step_plan(step, model, tokenizer, data, settings)
        record["plan_bytes"] = plan.total if plan is not None else None
        record["plan"] = dict(plan.parts) if plan is not None else None
        if max_bytes is not None and plan is not None and plan.total > max_bytes:
            record["skipped"] = f"plan {plan.total / GIB:.1f} GiB exceeds the {max_bytes / GIB:.1f} GiB limit"
            return record
        with tempfile.TemporaryDirectory(prefix="scale-") as tmp:
            started = time.perf_counter()
            record["result"] = run_entry_point(step, model, tokenizer, data, Path(tmp), quick)
            record["seconds"] = time.perf_counter() - started
    except Exception as err:  # noqa: BLE001 - a failed step is recorded, the others still run
        record["error"] = f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"
        record["out_of_memory"] = isinstance(err, torch.OutOfMemoryError)
    finally:
        if cuda:
            record["peak_bytes"] = torch.cuda.max_memory_allocated()
        else:
            record["peak_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - baseline
    return record


def extrapolate(record: dict[str, Any], tokenizer: Any, data: dict[str, list], depth: int = 32
                ) -> dict[str, Any] | None:
    """The measured peak carried to ``depth`` layers in bfloat16 (what a GPU run holds):
    ``plan(depth, bfloat16) * measured / plan(measured depth, measured dtype)``, with whether it fits an 80 GB
    GPU; the plans of models built on the meta device."""
    if not record.get("plan_bytes") or record.get("peak_bytes") is None or "seconds" not in record:
        return None
    import torch

    step = record["step"]
    model = build_model(record["shape"], depth, "meta", torch.bfloat16)
    plan = step_plan(step, model, tokenizer, data, trainer_settings(step) if step in TRAINER_STEPS else {})
    estimate = int(plan.total * record["peak_bytes"] / record["plan_bytes"])
    return {"layers": depth, "dtype": "bfloat16", "peak_bytes": estimate, "plan_bytes": plan.total,
            "fits_80gb": estimate <= GPU_80GB}


def _shape_numbers(shape: str, layers: int) -> dict[str, Any]:
    n = SHAPES[shape]
    return dict(hidden_size=n["hidden_size"], intermediate_size=n["intermediate_size"], num_layers=layers,
                num_heads=n["num_attention_heads"], num_kv_heads=n["num_key_value_heads"], vocab_size=n["vocab_size"],
                tie_word_embeddings=n["tie_word_embeddings"])


#: The settings of the fits table: bfloat16 weights, 4 rows a step of 256 tokens (a TOFU question and answer in
#: Llama's tokenizer are about 100-200 tokens), each trainer's own gradient checkpointing default.
FITS_BATCH, FITS_SEQ_LEN = 4, 256
#: Settings a method requires (no default); they change no memory.
FITS_REQUIRED = {"pdu": {"retain_loss_eps": 1.0}}


def fits_table(records: list[dict[str, Any]], depth: int = 32) -> str:
    """For every registered method at both shapes with ``depth`` layers in bfloat16: the plan's peak with full
    fine-tuning and with LoRA (r 16), and whether it fits an 80 GB GPU (74.5 GiB). The plan is scaled by the
    largest measured ``peak / plan`` of the ``records`` of its kind (a trainer step, GROM, T3: the plan's error at
    real width) when that exceeds 1."""
    from hf_unlearn.memory_plan import ModelShape, method_needs, plan_memory, run_settings
    from hf_unlearn.model_options import ModelOptions
    from hf_unlearn.options import validate_settings
    from hf_unlearn.registry import get_method, method_names

    factors: dict[str, float] = {}
    for r in records:
        if r.get("plan_bytes") and r.get("peak_bytes") and "seconds" in r:
            kind = "trainer" if r["step"] in TRAINER_STEPS else r["step"]
            factors[kind] = max(factors.get(kind, 1.0), r["peak_bytes"] / r["plan_bytes"])
    lines = ["| method | reference | Llama-2-7B full | Llama-2-7B LoRA | Llama-3.1-8B full | Llama-3.1-8B LoRA |",
             "|---|---|---|---|---|---|"]
    for method in method_names():
        trains = get_method(method).is_trainer
        factor = factors.get("trainer" if trains else method, 1.0)
        settings = {**FITS_REQUIRED.get(method, {}), **({"per_device_train_batch_size": FITS_BATCH} if trains else {})}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = validate_settings(method, settings, tempfile.gettempdir())
        cells, reference = [], "no"
        for shape_name in ("llama-2-7b", "llama-3.1-8b"):
            shape = ModelShape(**_shape_numbers(shape_name, depth))
            needs = method_needs(method, config, shape, 2)
            reference = "yes" if needs.reference else reference
            for use_peft in (False, True):
                if use_peft and not trains:
                    cells.append("—")
                    continue
                plan = plan_memory(shape, needs, run_settings(config, ModelOptions(use_peft=use_peft, lora_r=16), 2,
                                                              FITS_SEQ_LEN))
                peak = plan.total * factor
                cells.append(f"{peak / GIB:.0f} GiB" + ("" if peak <= 74.5 * GIB else " ✗"))
        lines.append(f"| {method} | {reference} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _child(args: argparse.Namespace) -> int:
    record = run_step(args.step, args.shape, args.layers, args.device, args.rows, quick=args.quick,
                      max_bytes=args.max_gib * GIB, dtype=args.dtype)
    print("SCALE-RECORD " + json.dumps(record, default=str), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="llama-3.1-8b,llama-2-7b")
    parser.add_argument("--steps", default=",".join(STEPS))
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rows", type=int, default=16, help="forget rows (and as many retain rows)")
    parser.add_argument("--max-gib", type=float, default=8.0, help="skip an entry point whose plan exceeds this")
    parser.add_argument("--quick", action="store_true", help="shorter generation (dry runs)")
    parser.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float32"),
                        help="weights' dtype (auto: bfloat16 where it is native, else float32)")
    parser.add_argument("--resume", action="store_true", help="keep the JSON's finished records; run the rest")
    parser.add_argument("--replan", action="store_true", help="recompute the JSON's plans (meta-device models)")
    parser.add_argument("--fits-table", action="store_true", help="write fits_80gb.md (every method, 32 layers)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "scale"))
    parser.add_argument("--step", help=argparse.SUPPRESS)
    parser.add_argument("--shape", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.dtype = resolve_dtype(args.dtype, args.device)
    if args.replan:
        stored = json.loads(_json_path(args).read_text())
        replan(stored["records"], args.rows)
        stored["plans_recomputed_by"] = "python benchmarks/scale.py --replan"
        _write_json(_json_path(args), stored)
        return 0
    if args.fits_table:
        from hf_unlearn.safe_output import atomic_write_text

        records = json.loads(_json_path(args).read_text())["records"] if _json_path(args).is_file() else []
        atomic_write_text(Path(args.out) / "fits_80gb.md", fits_table(records))
        return 0
    if args.step:
        return _child(args)
    records = _finished_records(args) if args.resume else []
    data = load_rows(args.rows)
    tokenizer = build_tokenizer(data)
    done_keys = {(r["shape"], r["step"]) for r in records}
    for shape in args.shapes.split(","):
        for step in args.steps.split(","):
            if (shape, step) in done_keys:
                continue
            command = [sys.executable, __file__, "--step", step, "--shape", shape, "--layers", str(args.layers),
                       "--device", args.device, "--rows", str(args.rows), "--max-gib", str(args.max_gib),
                       "--dtype", args.dtype]
            command += ["--quick"] if args.quick else []
            done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
            lines = [line for line in done.stdout.splitlines() if line.startswith("SCALE-RECORD ")]
            record = json.loads(lines[-1].removeprefix("SCALE-RECORD ")) if lines else {
                "step": step, "shape": shape, "error": f"exit {done.returncode}: {done.stderr[-300:]}"}
            _derive(record, tokenizer, data)
            records.append(record)
            _write(args, argv, records)
            print(json.dumps({k: record.get(k) for k in ("shape", "step", "seconds", "peak_bytes", "plan_bytes",
                                                         "skipped", "error")}, default=str), flush=True)
    return 0


def _json_path(args: argparse.Namespace) -> Path:
    return Path(args.out) / f"scale_{args.device.split(':')[0]}.json"


def _finished_records(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The records of an earlier run with the same layers and dtype that finished or were skipped by their plan."""
    path = _json_path(args)
    if not path.is_file():
        return []
    return [r for r in json.loads(path.read_text())["records"]
            if r.get("layers") == args.layers and r.get("dtype") == args.dtype
            and ("seconds" in r or "skipped" in r) and "error" not in r]


def _write(args: argparse.Namespace, argv: list[str] | None, records: list[dict[str, Any]]) -> None:
    """The records so far, as ``<out>/scale_<device>.json`` (rewritten after each entry point)."""
    _write_json(_json_path(args),
                {"command": " ".join(["python", "benchmarks/scale.py", *(argv if argv is not None else sys.argv[1:])]),
                 "records": records})


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    """``obj`` as indented JSON through the package's write gate (atomic, never through a link)."""
    from hf_unlearn.safe_output import atomic_write_text

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(obj, indent=2, default=str) + "\n")


if __name__ == "__main__":
    sys.exit(main())
