"""Shared fixtures: the TOFU copy beside the checkout, the synthetic set, tiny cached models; and the ``lab`` mark
on the test modules of the benchmark lab (``benchmarks/unlearn_bench``), which the default run leaves out and CI
runs in its own pass (``pytest -m lab tests``)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
TOFU_DIR = Path(os.environ.get("HF_UNLEARN_TOFU_DIR", REPO_ROOT.parent / "shared" / "data" / "tofu"))
CACHE_DIR = Path(os.environ.get("HF_UNLEARN_TEST_CACHE", REPO_ROOT / ".cache" / "tests"))
MUSE_DIR = Path(os.environ.get("HF_UNLEARN_MUSE_DIR", REPO_ROOT.parent / "shared" / "data" / "muse-news"))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")

#: The test modules of the benchmark lab: every test in them is marked ``lab``.
LAB_TEST_MODULES = frozenset({
    "test_bench", "test_bench_bar", "test_bench_selection", "test_measure", "test_muse_bench",
    "test_small_pair_validation", "test_subjects", "test_subjects_precision", "test_subjects_v2",
    "test_gpu_check", "test_reported_run", "test_sweep_resume", "test_tuning_protocol",
})


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.module is not None and item.module.__name__ in LAB_TEST_MODULES:
            item.add_marker(pytest.mark.lab)


@pytest.fixture(scope="session")
def tofu_dir() -> Path:
    if not (TOFU_DIR / "full.jsonl").is_file():
        pytest.fail(f"The TOFU copy is missing at {TOFU_DIR} (set HF_UNLEARN_TOFU_DIR).")
    return TOFU_DIR


@pytest.fixture(scope="session")
def synthetic():
    from hf_unlearn.data import synthetic_tofu

    return synthetic_tofu()


@pytest.fixture(scope="session")
def tiny_pair():
    """Cached target (memorizes all synthetic authors) and retain reference (retain90 only)."""
    from hf_unlearn.demo import tiny_models

    return tiny_models(cache_dir=CACHE_DIR)


@pytest.fixture()
def tiny_target(tiny_pair):
    """A fresh (model, tokenizer) copy of the tiny target: tests may modify it freely."""
    from hf_unlearn.demo import load_tiny

    return load_tiny(tiny_pair.target)


@pytest.fixture()
def tiny_retain(tiny_pair):
    from hf_unlearn.demo import load_tiny

    return load_tiny(tiny_pair.retain)


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():
    """Tiny models run faster on one thread than on two contended ones. ``HF_UNLEARN_TEST_THREADS=N`` runs torch on
    ``N`` threads instead (CI's second pass over the numerics-sensitive modules: another reduction order)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("HF_UNLEARN_TEST_THREADS", "1")))
    yield
    torch.set_num_threads(previous)


@pytest.fixture()
def hub(tmp_path, monkeypatch):
    """A local Hub-compatible server (tests/hub_server.py) that every huggingface_hub call in the test talks to; no
    other host can be reached, and the test fails if the client used an endpoint the server does not implement."""
    from hub_server import LocalHub, use_local_hub

    with LocalHub(tmp_path / "hub-server") as server:
        foreign = use_local_hub(monkeypatch, server, tmp_path / "hf-home")
        yield server
        assert not server.unhandled, f"client used unimplemented Hub endpoints: {server.unhandled}"
        assert not foreign, f"a test tried to reach another host: {foreign}"


@pytest.fixture(scope="session")
def muse_dir() -> Path:
    """The local MUSE-News copy (required: a missing copy fails, it is not skipped)."""
    if not (MUSE_DIR / "verbmem" / "forget.json").is_file():
        pytest.fail(f"The MUSE-News copy is missing at {MUSE_DIR} (set HF_UNLEARN_MUSE_DIR).")
    return MUSE_DIR


def fake_cuda(monkeypatch, available: bool, count: int = 1) -> None:
    """``torch.cuda`` reports ``available`` (with ``count`` GPUs) and no bf16, outside any launch."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count if available else 0)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)  # a trainer config asks
    # the memory plan reads the device's size: an 80 GiB GPU
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device=None: SimpleNamespace(total_memory=80 * 2**30, name="fake GPU"))
    monkeypatch.delenv("LOCAL_RANK", raising=False)


@pytest.fixture()
def moves(monkeypatch):
    """Every device any ``Module.to`` call asks for (the module stays where it is)."""
    import torch

    asked: list[str] = []

    def record(self, *args, **kwargs):
        target = kwargs.get("device", args[0] if args else None)
        if isinstance(target, (str, torch.device)):
            asked.append(str(target))
        return self

    monkeypatch.setattr(torch.nn.Module, "to", record)
    return asked

