"""The device rule below the command line: the selection criterion (``device=``, its reference model included) and
the TOFU-small pair fine-tuning (``fine_tune_qa(device=)``, ``build_small_pair``'s cache key and recipe) ask every
model and batch for the chosen device, keep the CPU's numbers and cache names, and refuse CUDA without CUDA before
any work. CUDA is monkeypatched as available and ``Module.to`` / ``Tensor.to`` record a CUDA device instead of
moving to it, so no GPU is needed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import fake_cuda

from hf_unlearn.selection import SelectionCriterion


def _target(args, kwargs):
    target = kwargs.get("device", args[0] if args else None)
    return str(target) if isinstance(target, (str, torch.device)) else None


@pytest.fixture()
def moves(monkeypatch):
    """Every device a ``Module.to`` (``"module"``) or ``Tensor.to`` (``"tensor"``) call asks for; a module stays
    where it is, and a tensor asked to go to CUDA stays on the CPU (any other ``Tensor.to`` runs)."""
    asked: dict[str, list[str]] = {"module": [], "tensor": []}
    tensor_to = torch.Tensor.to

    def module_to(self, *args, **kwargs):
        target = _target(args, kwargs)
        if target is not None:
            asked["module"].append(target)
        return self

    def record_tensor(self, *args, **kwargs):
        target = _target(args, kwargs)
        if target is not None:
            asked["tensor"].append(target)
            if target.startswith("cuda"):
                return self
        return tensor_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "to", module_to)
    monkeypatch.setattr(torch.Tensor, "to", record_tensor)
    return asked


def _criterion_rows(synthetic):
    return synthetic["forget10"][:6], synthetic["holdout10"][:6], synthetic["retain90"][:4]


def test_criterion_scores_every_model_on_its_device(tiny_pair, synthetic, monkeypatch, moves):
    from hf_unlearn.demo import load_tiny

    fake_cuda(monkeypatch, True)
    reference, tok = load_tiny(tiny_pair.retain)
    model, _ = load_tiny(tiny_pair.target)
    criterion = SelectionCriterion(*_criterion_rows(synthetic), reference_model=reference, reference_tokenizer=tok,
                                   device="auto")
    assert criterion.device == "cuda" and moves["module"] == ["cuda", "cuda"]  # the reference: forget, holdout
    moves["module"].clear()
    criterion.measure(model, tok)
    assert moves["module"] == ["cuda"] * 3, moves  # forget, holdout, retain validation
    moves["module"].clear()
    SelectionCriterion(*_criterion_rows(synthetic)).measure(model, tok)  # default: where the model is
    assert moves["module"] == [], moves
    assert not [d for d in moves["tensor"] if d.startswith("cuda")], moves["tensor"]


def test_criterion_refuses_cuda_without_cuda_before_any_work(tiny_target, synthetic, monkeypatch):
    fake_cuda(monkeypatch, False)
    model, tok = tiny_target

    def forward(*args, **kwargs):
        raise AssertionError("the reference model was scored although the device was refused")

    monkeypatch.setattr(model, "forward", forward)
    with pytest.raises(ValueError, match="no CUDA GPU"):
        SelectionCriterion(*_criterion_rows(synthetic), reference_model=model, reference_tokenizer=tok,
                           device="cuda")


def test_criterion_on_the_cpu_keeps_the_numbers(tiny_pair, synthetic):
    from hf_unlearn.demo import load_tiny

    model, tok = load_tiny(tiny_pair.target)
    reference, _ = load_tiny(tiny_pair.retain)
    kwargs = {"reference_model": reference, "reference_tokenizer": tok}
    plain = SelectionCriterion(*_criterion_rows(synthetic), **kwargs)
    on_cpu = SelectionCriterion(*_criterion_rows(synthetic), device="cpu", **kwargs)
    for a, b in zip(plain.reference_nll, on_cpu.reference_nll):
        np.testing.assert_array_equal(a, b)
    first, second = plain.measure(model, tok), on_cpu.measure(model, tok)
    for key, value in first.items():
        if key != "seconds":
            assert second[key] == value, key


ROWS = [{"question": "Who wrote the book?", "answer": "The author did."}]  # the rows of the pinned digest


def test_small_pair_cache_key_names_a_device_other_than_the_cpu(monkeypatch):
    from unlearn_bench.subjects import SmallRecipe

    fake_cuda(monkeypatch, True)
    recipe = SmallRecipe(bf16_autocast=True)
    cpu = recipe.digest("x", ROWS)
    assert cpu == recipe.digest("x", ROWS, "cpu") == "d7e1d3ce5805d81d"  # the CPU's names are kept
    assert recipe.digest("x", ROWS, "cuda") == recipe.digest("x", ROWS, "cuda:0") != cpu
    # "auto" is resolved for the device: a CUDA device without bf16 (monkeypatched) is a float32 pair
    assert SmallRecipe().digest("x", ROWS, "cuda") == SmallRecipe(bf16_autocast=False).digest("x", ROWS, "cuda")


def test_fine_tune_qa_trains_on_the_chosen_device(tiny_target, synthetic, monkeypatch, moves):
    from unlearn_bench.subjects import SmallRecipe, fine_tune_qa

    fake_cuda(monkeypatch, True)
    model, tok = tiny_target
    recipe = SmallRecipe(epochs=1, batch_size=4, bf16_autocast=False)
    history = fine_tune_qa(model, tok, synthetic["forget10"][:8], recipe, progress=False, device="auto")
    assert len(history) == 1 and np.isfinite(history[0])
    assert moves["module"] == ["cuda"]
    batch_moves = [d for d in moves["tensor"] if d.startswith("cuda")]
    assert len(batch_moves) == 2 * 4, moves["tensor"]  # 2 steps x (input_ids, attention_mask, labels, positions)


def test_fine_tune_qa_on_the_cpu_keeps_the_numbers(tiny_pair, synthetic):
    from unlearn_bench.subjects import SmallRecipe, fine_tune_qa

    from hf_unlearn.demo import load_tiny

    recipe = SmallRecipe(epochs=1, batch_size=4, bf16_autocast=False, learning_rate=1e-3)
    runs = []
    for device in (None, "cpu"):
        torch.manual_seed(0)
        model, tok = load_tiny(tiny_pair.target)
        runs.append((fine_tune_qa(model, tok, synthetic["forget10"][:8], recipe, progress=False, device=device),
                     [p.detach().clone() for p in model.parameters()]))
    assert runs[0][0] == runs[1][0]
    for a, b in zip(runs[0][1], runs[1][1]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_load_tiny_moves_the_model_to_the_chosen_device(tiny_pair, monkeypatch, moves):
    from hf_unlearn.demo import load_tiny

    fake_cuda(monkeypatch, True)
    load_tiny(tiny_pair.target)  # no device: where transformers loads it
    assert moves["module"] == []
    load_tiny(tiny_pair.target, device="auto")
    load_tiny(tiny_pair.target, device="cpu")
    assert moves["module"] == ["cuda", "cpu"]
    fake_cuda(monkeypatch, False)
    with pytest.raises(ValueError, match="no CUDA GPU"):
        load_tiny(tiny_pair.target, device="cuda:0")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_criterion_and_pair_fine_tuning_on_cuda(tiny_pair, synthetic):
    from unlearn_bench.subjects import SmallRecipe, fine_tune_qa

    from hf_unlearn.demo import load_tiny
    from hf_unlearn.logprobs import label_log_probs

    logits = torch.randn(2, 7, 50).to(torch.bfloat16)
    labels = torch.randint(0, 50, (2, 7))
    torch.testing.assert_close(label_log_probs(logits.cuda(), labels.cuda(), chunk_size=2).cpu(),
                               label_log_probs(logits, labels), rtol=1e-5, atol=1e-5)
    model, tok = load_tiny(tiny_pair.target)
    cpu = SelectionCriterion(*_criterion_rows(synthetic)).measure(model, tok)
    gpu = SelectionCriterion(*_criterion_rows(synthetic), device="cuda").measure(model, tok)
    assert next(model.parameters()).device.type == "cuda"
    assert gpu["forget_nll"] == pytest.approx(cpu["forget_nll"], rel=1e-4)
    recipe = SmallRecipe(epochs=1, batch_size=4, bf16_autocast="auto", learning_rate=1e-3)
    history = fine_tune_qa(model, tok, synthetic["forget10"][:8], recipe, progress=False)
    assert np.isfinite(history).all() and next(model.parameters()).device.type == "cuda"
