"""Calls on one model from many threads: each equals the single-threaded result, the model comes back as it was."""

from __future__ import annotations

import threading

import pytest
import torch

from captum_attnflow import AttentionFlow, AttentionRollout, RawAttention
from captum_attnflow.baselines import TokenSaliency
from captum_attnflow.capture import capture_graph
from captum_attnflow.functional import rollout_rows
from captum_attnflow.hf import exclusive
from helpers import make_classifier, make_tiny_model, model_state, padded_batch


def run_in_threads(call, threads: int = 4, calls: int = 3) -> list:
    results: list = []
    errors: list = []
    start = threading.Barrier(threads)

    def work():
        start.wait()
        try:
            for _ in range(calls):
                results.append(call())
        except Exception as error:  # collected and re-raised by the test
            errors.append(error)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("method", [RawAttention, AttentionRollout, AttentionFlow])
def test_threads_calling_one_model_get_the_single_threaded_result(method):
    model = make_tiny_model("bert")  # sdpa, as loaded
    model.config.output_attentions = False
    before = model_state(model), model.config._attn_implementation
    ids, mask = padded_batch(batch=3, n=7)
    explainer = method(model)
    expected = explainer.attribute(ids, attention_mask=mask, layer=None)
    results = run_in_threads(lambda: explainer.attribute(ids, attention_mask=mask, layer=None))
    assert len(results) == 12
    for result in results:
        assert result.shape == expected.shape  # every layer, never fewer
        torch.testing.assert_close(result, expected)
    assert (model_state(model), model.config._attn_implementation) == before
    assert model.config.output_attentions is False
    # Later calls still work: no hooks or flags were left behind half-restored.
    torch.testing.assert_close(explainer.attribute(ids, attention_mask=mask, layer=None), expected)


def test_threads_mixing_attention_and_gradient_methods_on_one_model():
    model = make_classifier()
    model.train()  # left in train mode by the user: every call still runs in eval mode
    before = model_state(model)
    ids, mask = padded_batch(batch=2, n=6)
    rollout, saliency = AttentionRollout(model), TokenSaliency(model)
    expected = rollout.attribute(ids, attention_mask=mask), saliency.attribute(ids, target=1, attention_mask=mask)
    results = run_in_threads(
        lambda: (rollout.attribute(ids, attention_mask=mask), saliency.attribute(ids, target=1, attention_mask=mask))
    )
    for scores, gradients in results:
        torch.testing.assert_close(scores, expected[0])
        torch.testing.assert_close(gradients, expected[1])
    assert model_state(model) == before and model.training


def test_exclusive_is_reentrant_and_per_model():
    first, second = make_tiny_model("bert"), make_tiny_model("gpt2")
    entered = threading.Event()
    with exclusive(first), exclusive(first):  # the same thread may nest
        thread = threading.Thread(target=lambda: exclusive(second).__enter__() and None or entered.set())
        thread.start()
        thread.join(timeout=5)
        assert entered.is_set()  # another model is not blocked


def test_threads_sharing_one_lean_graph_get_the_single_threaded_result(monkeypatch):
    """Each thread recomputes layers in buffers of its own; the graph's layers are built once."""
    monkeypatch.setattr("captum_attnflow.capture.lean_blocks._BLOCK_BYTES", 2 * 4 * 3 * 4)  # B = 3, H = 4: blocks of 2 numbers a head
    model = make_tiny_model("bert")
    ids, mask = padded_batch(batch=3, n=7)
    graph = capture_graph(model, ids, attention_mask=mask, lean=True)
    stored = capture_graph(model, ids, attention_mask=mask, lean=False)
    expected = {p: rollout_rows(stored, position=p, layer=None) for p in range(3)}
    calls = iter(range(10**6))

    def call():
        p = next(calls) % 3
        if p == 2:
            torch.testing.assert_close(graph.layer(1), stored.weights[1], atol=1e-6, rtol=0)
        return p, rollout_rows(graph, position=p, layer=None)

    for p, result in run_in_threads(call, threads=4, calls=6):
        torch.testing.assert_close(result, expected[p], atol=1e-6, rtol=0)
    built = run_in_threads(lambda: graph.weights, threads=4, calls=1)
    assert all(weights is built[0] for weights in built)
    torch.testing.assert_close(built[0], stored.weights, atol=1e-6, rtol=0)
