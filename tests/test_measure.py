"""The benchmark's memory figure: what a block adds on top of what the process already holds."""

from __future__ import annotations

import torch
from unlearn_bench.measure import PeakMemory


def test_added_memory_counts_the_block_and_not_what_the_process_already_held():
    held = torch.ones(64 * 2**20 // 4)  # 64 MB the process holds before the block (touched: resident)
    with PeakMemory() as mem:
        block = torch.ones(128 * 2**20 // 4)  # 128 MB allocated and touched inside the block
    # RSS is page-granular and the interpreter allocates a little on the side: a few MB of slack either way
    assert 120 <= mem.added_mb <= 160, mem.added_mb
    assert mem.entry_mb >= 64 and mem.peak_mb >= mem.entry_mb + 120
    del held, block
