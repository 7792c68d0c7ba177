"""The answer scorer and per-token statistics against a slow one-example-at-a-time loop (no padding), left and
right padding, and truncation at the model's maximum positions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hf_unlearn.data import tokenize_qa
from hf_unlearn.logprobs import (
    answer_log_likelihoods,
    answer_nll,
    answer_token_statistics,
    causal_lm_scorer,
    label_log_probs,
    mean_answer_nll,
    multi_answer_nll,
)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # Tiny models are overhead-bound; one thread avoids OpenMP oversubscription on shared CPUs.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def slow_answer_log_likelihood(model, tokenizer, question, answer, temperature=1.0, max_length=None):
    """One example, no padding, no attention mask: sum of log p(answer token | prefix) and the count."""
    feats = tokenize_qa(tokenizer, question, answer, max_length=max_length)
    ids = torch.tensor([feats["input_ids"]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double() / temperature
    log_probs = torch.log_softmax(logits, dim=-1)
    total, count = 0.0, 0
    for t in range(feats["prompt_length"], len(feats["input_ids"])):
        total += log_probs[t - 1, feats["input_ids"][t]].item()
        count += 1
    return total, count


@pytest.fixture(scope="module")
def examples(synthetic):
    rows = synthetic["forget10_perturbed"][:6] + synthetic["real_authors_perturbed"][:5]
    questions = [r["question"] for r in rows]
    answers = [r["answer"] if i % 2 else r["perturbed_answer"][0] for i, r in enumerate(rows)]
    return questions, answers  # different lengths, so batches are padded


@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("batch_size", [1, 3, 7])
def test_batched_scores_match_slow_loop(tiny_target, examples, padding_side, batch_size):
    model, tokenizer = tiny_target
    questions, answers = examples
    expected = [slow_answer_log_likelihood(model, tokenizer, q, a) for q, a in zip(questions, answers)]
    got = answer_log_likelihoods(
        model, tokenizer, questions, answers, batch_size=batch_size, padding_side=padding_side
    )
    np.testing.assert_array_equal(got.num_tokens, [c for _, c in expected])
    np.testing.assert_allclose(got.sum_log_prob, [s for s, _ in expected], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got.avg_nll, [-s / c for s, c in expected], rtol=1e-4, atol=1e-5)
    # the tiny target memorised the synthetic authors: correct answers are likely, perturbed ones not
    assert got.avg_nll[1::2].mean() < 0.5 < got.avg_nll[0:6:2].mean()


def test_model_mode_is_restored(tiny_target, examples):
    model, tokenizer = tiny_target
    model.train()
    answer_nll(model, tokenizer, *examples, batch_size=4)
    assert model.training


def test_custom_scorer_plugs_in(tiny_target, examples):
    """A tempered scorer (T = 2) through the same path equals the slow loop at T = 2."""
    model, tokenizer = tiny_target
    questions, answers = examples

    def tempered(input_ids, attention_mask, position_ids, labels):
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
        return label_log_probs(logits / 2.0, labels)

    expected = [
        slow_answer_log_likelihood(model, tokenizer, q, a, temperature=2.0)
        for q, a in zip(questions, answers)
    ]
    got = answer_nll(model, tokenizer, questions, answers, scorer=tempered, batch_size=4, padding_side="left")
    np.testing.assert_allclose(got, [-s / c for s, c in expected], rtol=1e-4, atol=1e-5)
    plain = answer_nll(model, tokenizer, questions, answers, scorer=causal_lm_scorer(model), batch_size=4)
    assert not np.allclose(got, plain)


def test_multi_answer_nll_matches_flat(tiny_target, synthetic):
    model, tokenizer = tiny_target
    rows = synthetic["forget10_perturbed"][:3] + synthetic["world_facts_perturbed"][:2]
    questions = [r["question"] for r in rows]
    lists = [r["perturbed_answer"] for r in rows]
    out = multi_answer_nll(model, tokenizer, questions, lists, batch_size=5)
    assert [len(o) for o in out] == [5, 5, 5, 3, 3]
    for q, answers, got in zip(questions, lists, out):
        np.testing.assert_allclose(
            got, answer_nll(model, tokenizer, [q] * len(answers), answers, batch_size=1), rtol=1e-5
        )


def test_label_log_probs_matches_loop():
    torch.manual_seed(0)
    logits = torch.randn(3, 6, 11)
    labels = torch.randint(0, 11, (3, 6))
    labels[0, :3] = -100
    labels[2, 4:] = -100
    out = label_log_probs(logits, labels)
    expected = torch.zeros(3, 6)
    for b in range(3):
        for t in range(1, 6):
            if labels[b, t] != -100:
                expected[b, t] = torch.log_softmax(logits[b, t - 1], -1)[labels[b, t]]
    torch.testing.assert_close(out, expected)


def test_scoring_bad_input(tiny_target):
    model, tokenizer = tiny_target
    with pytest.raises(ValueError, match="2 questions but 1 answers"):
        answer_nll(model, tokenizer, ["a?", "b?"], ["x"])
    with pytest.raises(ValueError, match="padding_side"):
        answer_nll(model, tokenizer, ["a?"], ["x"], padding_side="center")


def test_mean_answer_nll_averages_per_example_nll_over_rows(tiny_target, examples):
    model, tokenizer = tiny_target
    questions, answers = examples
    per_example = [slow_answer_log_likelihood(model, tokenizer, q, a) for q, a in zip(questions, answers)]
    expected = np.mean([-total / count for total, count in per_example])  # mean of averages, not pooled tokens
    rows = [{"question": q, "answer": a} for q, a in zip(questions, answers)]
    assert mean_answer_nll(model, tokenizer, rows, batch_size=4) == pytest.approx(expected, rel=1e-4)


def test_token_statistics_match_slow_loop(tiny_target, examples):
    """Per answer token: log p(y_t), [argmax == y_t], E_p[log p] and Var_p[log p], from one unpadded forward."""
    model, tokenizer = tiny_target
    questions, answers = examples
    stats = answer_token_statistics(model, tokenizer, questions, answers, batch_size=4)
    for i, (q, a) in enumerate(zip(questions, answers)):
        feats = tokenize_qa(tokenizer, q, a)
        ids = feats["input_ids"]
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].double(), -1)
        steps = range(feats["prompt_length"], len(ids))
        np.testing.assert_array_equal(stats.token_ids[i], [ids[t] for t in steps])
        np.testing.assert_allclose(stats.token_log_probs[i], [logp[t - 1, ids[t]].item() for t in steps], atol=1e-4)
        np.testing.assert_array_equal(stats.greedy_correct[i], [logp[t - 1].argmax().item() == ids[t] for t in steps])
        mu = [(logp[t - 1].exp() * logp[t - 1]).sum().item() for t in steps]
        var = [(logp[t - 1].exp() * logp[t - 1] ** 2).sum().item() - m * m for t, m in zip(steps, mu)]
        np.testing.assert_allclose(stats.vocab_mean[i], mu, atol=1e-4)
        np.testing.assert_allclose(stats.vocab_var[i], var, atol=1e-3)
    np.testing.assert_allclose(stats.avg_nll, answer_nll(model, tokenizer, questions, answers), rtol=1e-5)
    plain = causal_lm_scorer(model)
    custom = answer_token_statistics(model, tokenizer, questions, answers, scorer=plain)
    assert custom.greedy_correct is None and custom.vocab_mean is None and custom.vocab_var is None
    np.testing.assert_allclose(custom.avg_nll, stats.avg_nll, rtol=1e-5)


def test_scoring_truncates_to_model_positions(tiny_target):
    """A model with 24 positions: long answers are cut at the answer end, scored on the kept tokens only."""
    model, tokenizer = tiny_target
    model.config.max_position_embeddings = 24
    question, answer = "Who?", " ".join(["word"] * 60)
    feats = tokenize_qa(tokenizer, question, answer, max_length=24)
    assert len(feats["input_ids"]) == 24
    expected = slow_answer_log_likelihood(model, tokenizer, question, answer, max_length=24)
    got = answer_log_likelihoods(model, tokenizer, [question], [answer])
    assert got.num_tokens[0] == expected[1] == 24 - feats["prompt_length"]
    assert got.sum_log_prob[0] == pytest.approx(expected[0], rel=1e-4)
    stats = answer_token_statistics(model, tokenizer, [question], [answer])
    assert stats.num_truncated == 1 and len(stats.token_ids[0]) == expected[1]
    with pytest.raises(ValueError, match="prompt alone"):
        answer_nll(model, tokenizer, [" ".join(["long"] * 40) + "?"], ["x"])


def test_vocab_statistics_chunks_and_alignment():
    from hf_unlearn.logprobs import vocab_statistics

    torch.manual_seed(1)
    logits = torch.randn(3, 7, 13)
    labels = torch.randint(0, 13, (3, 7))
    labels[0, :4] = -100
    labels[2, 5:] = -100
    whole, chunked = vocab_statistics(logits, labels), vocab_statistics(logits, labels, chunk_size=2)
    for key in whole:
        torch.testing.assert_close(whole[key], chunked[key])
    torch.testing.assert_close(whole["log_prob"], label_log_probs(logits, labels))
    for b in range(3):
        for t in range(7):
            if t == 0 or labels[b, t] == -100:
                assert whole["mean"][b, t] == 0 and not whole["greedy_correct"][b, t]
            else:
                logp = torch.log_softmax(logits[b, t - 1], -1)
                assert whole["greedy_correct"][b, t] == (logp.argmax() == labels[b, t])
                torch.testing.assert_close(whole["mean"][b, t], (logp.exp() * logp).sum())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_label_log_probs_half_precision_in_chunks(dtype):
    """Half-precision logits are upcast a chunk of positions at a time: any chunk size gives the numbers of the
    whole float32 copy (computed here the slow way, one position at a time)."""
    torch.manual_seed(2)
    logits = torch.randn(2, 9, 17).to(dtype)
    labels = torch.randint(0, 17, (2, 9))
    labels[0, :3] = -100
    labels[1, 7:] = -100
    expected = torch.zeros(2, 9)
    for b in range(2):
        for t in range(1, 9):
            if labels[b, t] != -100:
                expected[b, t] = torch.log_softmax(logits[b, t - 1].float(), -1)[labels[b, t]]
    for chunk_size in (None, 1, 3, 8, 100):
        out = label_log_probs(logits, labels, chunk_size=chunk_size)
        assert out.dtype == torch.float32
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)
    one = torch.zeros(2, 1, 17, dtype=dtype)  # one position: nothing is scored
    assert label_log_probs(one, torch.zeros(2, 1, dtype=torch.long)).abs().sum() == 0


def test_label_log_probs_keeps_gradients_through_chunks():
    torch.manual_seed(3)
    logits = torch.randn(2, 6, 11, requires_grad=True)
    labels = torch.randint(0, 11, (2, 6))
    whole = torch.autograd.grad(label_log_probs(logits, labels).sum(), logits)[0]
    chunked = torch.autograd.grad(label_log_probs(logits, labels, chunk_size=2).sum(), logits)[0]
    torch.testing.assert_close(whole, chunked)
