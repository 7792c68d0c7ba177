"""Every method side by side on TOFU-tiny: the same as `unlearn-bench run` (all its flags apply).

    python benchmarks/tofu_tiny.py --data TOFU_DIR                 # forget10, the grid
    python benchmarks/tofu_tiny.py --data TOFU_DIR --split forget05
    python benchmarks/tofu_tiny.py --model <target> --retain-model <retain-only> --data locuslab/TOFU

Writes benchmarks/results/tofu_tiny_<split>.{json,md,png}.
"""

import sys

from unlearn_bench.cli import main

if __name__ == "__main__":
    sys.exit(main(["run", *sys.argv[1:]]))
