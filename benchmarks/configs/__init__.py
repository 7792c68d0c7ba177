"""Benchmark subject configurations (TOML data, one file per subject).

Installed as ``hf_unlearn.bench.configs`` so that an installed ``hf-unlearn bench`` finds them; this
module holds no code.
"""
