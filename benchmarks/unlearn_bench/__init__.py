"""unlearn_bench: the benchmark lab of hf-unlearn, a separate package that compares every registered method.

It holds the benchmark subjects (TOFU-small on pretrained models, MUSE-News-small), the comparison runners and
their selection rule, the methods' presets and grids (``benchmarks/configs/<subject>.toml``), the reports and the
speed measurements, and the ``unlearn-bench`` command. It uses :mod:`hf_unlearn` only through its public names;
the library never imports it.
"""
