#!/usr/bin/env bash
# Fill the git-ignored .whl/ folder with what the GPU machine lacks (benchmarks/gpu_wheels.txt), for its
# Python 3.12 on x86_64, and check that the checkout with it stays under the 64 MiB that travels there.
# Run from the repository root on a machine that reaches the package index.
set -euo pipefail
python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl -r benchmarks/gpu_wheels.txt
python -m pip wheel -q --no-deps -w .whl "rouge-score==0.1.2"   # it ships only a source archive
wheels=$(du -sb .whl | cut -f1)
tree=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
echo "wheels $((wheels / 1048576)) MiB + checkout $((tree / 1048576)) MiB (limit 64 MiB)"
test $((wheels + tree)) -lt $((64 * 1048576))
