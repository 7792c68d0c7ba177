"""The GPU check: on a machine with one CUDA GPU, in at most 8 minutes, the CUDA tests and every entry point of
``benchmarks/scale.py`` at full depth, with the peak GPU memory, the wall time and any out-of-memory error per
step in one JSON.

It uses the machine's own ``python3`` and torch. Packages the machine lacks (trl, datasets, evaluate,
rouge-score) or holds below this package's pins (transformers) travel as wheels in the git-ignored ``.whl/``
folder (``benchmarks/gpu_wheels.sh`` fills it) and are installed from it, without an index, into ``.whl/site`` on
first use. The TOFU rows come
from the checkout (``benchmarks/data/tofu-scale``); every model is built on the GPU from a config with random
weights (the tiny shape for correctness, SmolLM2-135M's shape, Llama-3.1-8B's full shape in bfloat16), so
nothing is downloaded.

    python3 benchmarks/gpu_check.py                  # on the GPU machine, from the repository root
    python3 benchmarks/gpu_check.py --dry-run        # the same script on the CPU with tiny shapes (the tests run it)

1. ``pytest -m cuda`` (its own time limit);
2. for each shape, each entry point (``scale.STEPS``) in this process, after ``torch.cuda.reset_peak_memory_stats``:
   ``torch.cuda.max_memory_allocated``, the time, the memory plan's estimate, and the error if any. An entry point
   whose plan exceeds the GPU's memory is not run and is recorded as refused by the plan.

The JSON goes to ``--out`` (``benchmarks/results/gpu_check/gpu_check.json``). The exit status is non-zero when the
CUDA tests or a step failed, or the time ran out before every step ran.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ROOT / ".whl"
#: What the machine lacks, installed from ``.whl/`` when an import fails.
MISSING = ("trl", "datasets", "evaluate", "rouge_score")
#: ``(shape, layers)`` per run: ``None`` layers is the shape's full depth.
GPU_SHAPES = (("tiny", None), ("smollm2-135m", None), ("llama-3.1-8b", None))
DRY_SHAPES = (("tiny", None),)


def ensure_packages() -> list[str]:
    """Install every wheel of ``.whl/`` (``benchmarks/gpu_wheels.txt``; no index, ``--no-deps``) into
    ``.whl/site`` when a package of :data:`MISSING` does not import or transformers is below this package's pin;
    ``.whl/site`` is then put first on ``sys.path`` and ``PYTHONPATH``. Returns the wheels installed."""
    site = WHEELS / "site"
    wheels = sorted(str(w) for w in WHEELS.glob("*.whl")) if WHEELS.is_dir() else []
    if wheels and not site.is_dir() and (_missing() or _transformers_below_pin()):
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--upgrade", "--target", str(site), "--no-warn-script-location", *wheels], check=True)
    else:
        wheels = []
    if site.is_dir() and str(site) not in sys.path:
        sys.path.insert(0, str(site))
        os.environ["PYTHONPATH"] = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    return [Path(w).name for w in wheels]


def _missing() -> list[str]:
    import importlib.util

    return [name for name in MISSING if importlib.util.find_spec(name) is None]


def _transformers_below_pin(pin: tuple[int, int] = (5, 19)) -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        major, minor = (int(part) for part in version("transformers").split(".")[:2])
    except PackageNotFoundError:
        return True
    return (major, minor) < pin


def cuda_tests(limit_s: int, out: Path) -> dict[str, Any]:
    """``pytest -m cuda`` under a time limit; its log in ``out/pytest_cuda.log``."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_UNLEARN_TOFU_DIR": str(ROOT / "benchmarks" / "data" / "tofu-scale"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    started = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "cuda", "tests", "-p", "no:cacheprovider"],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit_s)
        code, log = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as err:
        code, log = 124, f"timed out after {limit_s}s\n{err.stdout or ''}"
    (out / "pytest_cuda.log").write_text(log if isinstance(log, str) else log.decode(errors="replace"))
    return {"exit_status": code, "seconds": time.perf_counter() - started}


def run_steps(shapes: tuple, device: str, rows: int, quick: bool, deadline: float,
              capacity: int | None) -> list[dict[str, Any]]:
    """Every entry point of ``scale.STEPS`` for every shape, in this process, until ``deadline``."""
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import scale

    records = []
    for shape, layers in shapes:
        for step in scale.STEPS:
            if time.monotonic() > deadline:
                records.append({"step": step, "shape": shape, "not_run": "the time budget ran out"})
                continue
            gc.collect()
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
            record = scale.run_step(step, shape, layers, device, rows, quick=quick, max_bytes=capacity)
            if not device.startswith("cuda"):  # one process's peak resident memory covers every step before
                record["peak_bytes"] = None
            if record.get("skipped"):
                record["refused_by_plan"] = record.pop("skipped")
            records.append(record)
            print(json.dumps({k: record.get(k) for k in ("shape", "step", "seconds", "peak_bytes", "plan_bytes",
                                                         "refused_by_plan", "error")}, default=str), flush=True)
    return records


def failed(record: dict[str, Any]) -> bool:
    return bool(record.get("error") or record.get("not_run"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="the CPU with tiny shapes, no CUDA tests")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "gpu_check"))
    parser.add_argument("--budget-s", type=float, default=480.0,
                        help="the whole check's time (default 8 minutes; a dry run has no limit)")
    parser.add_argument("--test-limit-s", type=int, default=150, help="the CUDA tests' share of it")
    parser.add_argument("--rows", type=int, default=16, help="forget rows per entry point (and as many retain rows)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    installed = ensure_packages()
    import torch

    record: dict[str, Any] = {"dry_run": args.dry_run, "torch": torch.__version__, "python": sys.version.split()[0],
                              "installed_from_wheels": installed}
    try:
        import transformers

        record["transformers"] = transformers.__version__
    except ImportError:  # pragma: no cover - the machine has it
        pass
    if args.dry_run:
        device, shapes, capacity, rows = "cpu", DRY_SHAPES, None, min(args.rows, 2)
        record["cuda_tests"] = {"skipped": "dry run"}
    else:
        if not torch.cuda.is_available():
            print("gpu_check: torch sees no CUDA GPU here; run with --dry-run to check the script on the CPU.",
                  file=sys.stderr)
            return 2
        device, shapes, rows = "cuda", GPU_SHAPES, args.rows
        capacity = torch.cuda.get_device_properties(0).total_memory
        record.update(device_name=torch.cuda.get_device_name(0), device_memory_bytes=capacity)
        record["cuda_tests"] = cuda_tests(args.test_limit_s, out)
    deadline = float("inf") if args.dry_run else started + args.budget_s
    record["steps"] = run_steps(shapes, device, rows, args.dry_run, deadline, capacity)
    record["seconds"] = time.monotonic() - started
    bad = [f"{r['shape']}/{r['step']}" for r in record["steps"] if failed(r)]
    tests_failed = record["cuda_tests"].get("exit_status", 0) != 0
    record["failed"] = bad + (["cuda tests"] if tests_failed else [])
    (out / "gpu_check.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    if record["failed"]:
        print(f"gpu_check: failed: {', '.join(record['failed'])}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
