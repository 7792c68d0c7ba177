#!/usr/bin/env bash
# The GPU check: on a machine with one CUDA GPU, in at most 10 minutes,
#   1. the CUDA tests (pytest -m cuda),
#   2. `hf-unlearn bench --subject smollm2-135m --layout v2 --select` for grad_diff, masc, grom and t3, one method
#      at a time in one Python process, so that each method's peak GPU memory (torch.cuda.max_memory_allocated)
#      is read beside its wall time (each method's bench files in its own folder);
# and writes the figures to benchmarks/results/gpu_check/: gpu_check.json and gpu_check.md (time per phase, peak
# GPU memory, the bench's rows), pytest_cuda.log, nvidia-smi.txt, and the bench's own result files.
#
#   bash benchmarks/gpu_check.sh            # from the repository root; PYTHON=... to pick the interpreter
#
# The SmolLM2-135M subject must be reachable (the Hugging Face cache, or HF_HUB_OFFLINE=0 with network).
set -uo pipefail

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
OUT="benchmarks/results/gpu_check"
METHODS="${GPU_CHECK_METHODS:-grad_diff masc grom t3}"
TEST_LIMIT_S="${GPU_CHECK_TEST_LIMIT_S:-150}"
BENCH_LIMIT_S="${GPU_CHECK_BENCH_LIMIT_S:-420}"
mkdir -p "$OUT"

if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_check: torch sees no CUDA GPU here; nothing to check." >&2
    exit 2
fi
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true

# 1. the CUDA tests (a timeout, so that a hang ends the phase instead of the whole check)
start=$(date +%s)
timeout "$TEST_LIMIT_S" "$PYTHON" -m pytest -q -m cuda tests -p no:cacheprovider > "$OUT/pytest_cuda.log" 2>&1
test_rc=$?
test_s=$(( $(date +%s) - start ))
tail -n 3 "$OUT/pytest_cuda.log"

# 2. the v2 benchmark with selection, one method after the other, timed and with its peak GPU memory
timeout "$BENCH_LIMIT_S" "$PYTHON" - "$OUT" "$test_rc" "$test_s" $METHODS <<'PY'
import json
import sys
import time
from pathlib import Path

import torch

from hf_unlearn.cli import main

out, test_rc, test_s, methods = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
record = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
          "bf16_supported": torch.cuda.is_bf16_supported(),
          "cuda_tests": {"exit_status": test_rc, "seconds": test_s}, "bench": []}


def save() -> None:
    (out / "gpu_check.json").write_text(json.dumps(record, indent=2, default=str) + "\n")


for method in methods:
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    try:
        status = main(["bench", "--subject", "smollm2-135m", "--layout", "v2", "--select", "--methods", method,
                       "--output-dir", str(out / method)])
    except SystemExit as exc:  # a refusal prints its line and exits
        status = exc.code
    except Exception as exc:  # recorded, and the next method still runs
        status = f"{type(exc).__name__}: {exc}"
    seconds = time.perf_counter() - start
    entry = {"method": method, "exit_status": status, "wall_s": round(seconds, 1),
             "peak_gpu_memory_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1)}
    record["bench"].append(entry)
    print(f"gpu_check: {method}: status {status}, {seconds:.1f} s, peak {entry['peak_gpu_memory_mb']} MB", flush=True)
    save()

# the bench's own rows (per method: phases timed, the metrics): every JSON result it wrote, per method folder
rows = {}
for path in sorted(out.glob("*/*.json")):
    try:
        rows[f"{path.parent.name}/{path.name}"] = json.loads(path.read_text())
    except ValueError:
        continue
record["bench_results"] = rows
save()

lines = ["# GPU check", "", f"{record['device']}, torch {record['torch']}, bf16 supported: {record['bf16_supported']}",
         "", f"CUDA tests: exit status {test_rc} in {test_s} s (log: pytest_cuda.log)", "",
         "| method | exit status | wall s | peak GPU memory MB |", "|---|---|---|---|"]
lines += [f"| {e['method']} | {e['exit_status']} | {e['wall_s']} | {e['peak_gpu_memory_mb']} |" for e in record["bench"]]
tables = sorted(out.glob("*/*.md"))
lines += ["", "The bench's rows (time per phase and the metrics) are in: " +
          ", ".join(f"{p.parent.name}/{p.name}" for p in tables),
          "", "The first method's wall time includes building (fine-tuning) the subject pair when it is not cached."]
(out / "gpu_check.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
bench_rc=$?
echo "gpu_check: CUDA tests exit status $test_rc, bench exit status $bench_rc; figures in $OUT/"
[ "$test_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
