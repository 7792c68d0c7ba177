"""Native-bfloat16 detection and TOFU-small's ``bf16_autocast="auto"``: the override, the CPU-flag detection, the
resolution of ``"auto"``, and the cache key of a float32 pair against a bf16 pair."""

from __future__ import annotations

import pytest
from unlearn_bench.subjects import CPU_BF16_ENV, SmallRecipe, cpu_has_native_bf16, resolve_bf16_autocast
from unlearn_bench.subjects.precision import cpuinfo_flags, detect_native_bf16

ROWS = [{"question": "Who wrote the book?", "answer": "The author did."}]


def _cpuinfo(tmp_path, *flag_lines: str):
    path = tmp_path / "cpuinfo"
    blocks = [f"processor\t: {i}\nmodel name\t: Test CPU\nflags\t\t: {flags}\n" for i, flags in enumerate(flag_lines)]
    path.write_text("\n".join(blocks))
    return path


@pytest.mark.parametrize("value, expected", [("1", True), ("true", True), ("ON", True), ("0", False),
                                             ("false", False), (" no ", False)])
def test_override_decides_both_ways(monkeypatch, value, expected):
    monkeypatch.setenv(CPU_BF16_ENV, value)
    assert cpu_has_native_bf16() is expected


def test_override_refuses_an_unknown_value(monkeypatch):
    monkeypatch.setenv(CPU_BF16_ENV, "maybe")
    with pytest.raises(ValueError, match=CPU_BF16_ENV):
        cpu_has_native_bf16()


def test_without_override_the_cpu_flags_decide(monkeypatch):
    monkeypatch.delenv(CPU_BF16_ENV, raising=False)
    assert cpu_has_native_bf16() is detect_native_bf16()


def test_detection_reads_the_bf16_flags(tmp_path):
    avx2 = _cpuinfo(tmp_path, "fpu sse2 avx avx2 fma", "fpu sse2 avx avx2 fma")
    assert cpuinfo_flags(avx2) == {"fpu", "sse2", "avx", "avx2", "fma"}
    assert detect_native_bf16(avx2) is False
    # avx512f alone is not bfloat16
    assert detect_native_bf16(_cpuinfo(tmp_path, "avx2 avx512f avx512bw avx512_vnni")) is False
    assert detect_native_bf16(_cpuinfo(tmp_path, "avx2 avx512f avx512_bf16")) is True
    assert detect_native_bf16(_cpuinfo(tmp_path, "avx2 amx_tile amx_bf16 amx_int8")) is True


def test_cpuinfo_without_flags_is_unknown(tmp_path):
    assert cpuinfo_flags(tmp_path / "absent") is None
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd bf16\n")
    assert cpuinfo_flags(arm) is None


def test_resolve_bf16_autocast(monkeypatch):
    for env in ("0", "1"):
        monkeypatch.setenv(CPU_BF16_ENV, env)
        assert resolve_bf16_autocast(True) is True and resolve_bf16_autocast(False) is False  # explicit wins
        assert resolve_bf16_autocast("auto") is (env == "1")
        assert resolve_bf16_autocast("auto", "cpu") is (env == "1")
        assert resolve_bf16_autocast("auto", "meta") is False
    with pytest.raises(ValueError, match="True, False or 'auto'"):
        resolve_bf16_autocast("bf16")


def test_small_recipe_auto_is_the_default_and_resolves(monkeypatch):
    assert SmallRecipe().bf16_autocast == "auto" and SmallRecipe.v2().bf16_autocast == "auto"
    monkeypatch.setenv(CPU_BF16_ENV, "0")
    assert SmallRecipe().resolved().bf16_autocast is False
    assert SmallRecipe(bf16_autocast=True).resolved().bf16_autocast is True  # an explicit choice stays
    monkeypatch.setenv(CPU_BF16_ENV, "1")
    assert SmallRecipe().resolved().bf16_autocast is True
    assert SmallRecipe(bf16_autocast=False).resolved().bf16_autocast is False
    with pytest.raises(ValueError, match="bf16_autocast"):
        SmallRecipe(bf16_autocast="yes")
    with pytest.raises(ValueError, match="bf16_autocast"):
        SmallRecipe(bf16_autocast=1)


@pytest.mark.parametrize("make", [SmallRecipe, SmallRecipe.v2])
def test_digest_uses_the_resolved_value(monkeypatch, make):
    float32, bf16 = make(bf16_autocast=False).digest("x", ROWS), make(bf16_autocast=True).digest("x", ROWS)
    assert float32 != bf16
    monkeypatch.setenv(CPU_BF16_ENV, "0")
    assert make().digest("x", ROWS) == float32
    monkeypatch.setenv(CPU_BF16_ENV, "1")
    assert make().digest("x", ROWS) == bf16


def test_bf16_digest_keeps_the_cache_names_of_bf16_pairs(monkeypatch):
    """A bf16 recipe (explicit, or "auto" on a native-bf16 CPU) hashes to the name the pair had when bf16 autocast
    was the fixed default (the digests below were computed by that code), so cached bf16 pairs are found again."""
    assert SmallRecipe(bf16_autocast=True).digest("x", ROWS) == "d7e1d3ce5805d81d"
    assert SmallRecipe.v2(bf16_autocast=True).digest("x", ROWS) == "c88caac5b569e3be"
    monkeypatch.setenv(CPU_BF16_ENV, "1")
    assert SmallRecipe().digest("x", ROWS) == "d7e1d3ce5805d81d"
