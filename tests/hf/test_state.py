"""Calls on one model from many threads: each equals the single-threaded result, the model comes back as it was."""

from __future__ import annotations

import threading

import pytest
import torch
import transformers

from captum_attnflow import (
    ALTI,
    AttentionFlow,
    AttentionNorm,
    AttentionRollout,
    AttnLRP,
    GradientWeightedRollout,
    LLMAttentionAttribution,
    RawAttention,
    ValueZeroing,
)
from captum_attnflow.baselines import TokenSaliency
from captum_attnflow.capture import capture_graph
from captum_attnflow.functional import rollout_rows
from captum_attnflow.hf import exclusive
from captum_attnflow.models.language_model import build_lm_tokenizer
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


# Every method that reads inside a shared model, with the arguments it needs.
CLASSIFIER_CALLS = {
    RawAttention: {},
    AttentionRollout: {},
    AttentionFlow: {},
    GradientWeightedRollout: {"target": 1},
    ValueZeroing: {},
    ALTI: {},
    AttentionNorm: {},
    AttnLRP: {"target": 1},
}


@pytest.mark.parametrize("method", list(CLASSIFIER_CALLS), ids=lambda m: m.__name__)
def test_threads_calling_every_method_on_one_classifier_get_the_serial_result(method):
    """Each method's capture (attention function, hooks, rules) acts on its own call's forward only."""
    model = make_classifier(layers=2)  # sdpa, as loaded
    model.train()  # left in train mode by the user: every call still runs in eval mode
    model.config.output_attentions = False
    before = model_state(model), model.config._attn_implementation
    ids, mask = padded_batch(batch=2, n=6)
    explainer = method(model)

    def call():
        return explainer.attribute(ids, attention_mask=mask, layer=None, **CLASSIFIER_CALLS[method])

    expected = call()
    results = run_in_threads(call, threads=3, calls=3)
    assert len(results) == 9
    for result in results:
        assert result.shape == expected.shape  # every layer, never fewer
        torch.testing.assert_close(result, expected)
    assert (model_state(model), model.config._attn_implementation) == before
    assert model.training and model.config.output_attentions is False
    # Later calls still work: no hooks or flags were left behind half-restored.
    torch.testing.assert_close(call(), expected)


# DeBERTa-v3's relative attention (AttnLRP swaps its bias function under the lock); Falcon with ALiBi.
OWN_ATTENTION_CONFIGS = {
    "deberta-v2": dict(relative_attention=True, pos_att_type=["p2c", "c2p"], position_biased_input=False,
                       position_buckets=256, norm_rel_ebd="layer_norm", share_att_key=True, type_vocab_size=0),
    "falcon": dict(new_decoder_architecture=True, num_kv_heads=2, alibi=True),
}


@pytest.mark.parametrize("family", list(OWN_ATTENTION_CONFIGS))
def test_threads_on_a_family_with_its_own_attention_modules_get_the_serial_result(family):
    """The families whose attention runs in their own modules switch to eager under the model's
    lock, and AttnLRP's rules (DeBERTa's relative-position bias among them) act on one call only."""
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(
        family, vocab_size=60, hidden_size=32, num_attention_heads=4, intermediate_size=64, num_hidden_layers=2,
        pad_token_id=0, num_labels=2, **OWN_ATTENTION_CONFIGS[family],
    )
    auto = transformers.AutoModelForCausalLM if family == "falcon" else transformers.AutoModelForSequenceClassification
    model = auto.from_config(config).eval()
    before = model_state(model), model.config._attn_implementation
    ids, mask = padded_batch(batch=2, n=6)
    methods = [ALTI(model), AttnLRP(model), AttentionRollout(model)]

    def call():
        return [method.attribute(ids, attention_mask=mask, **({"target": 1} if isinstance(method, AttnLRP) else {}))
                for method in methods]

    expected = call()
    for results in run_in_threads(call, threads=3, calls=2):
        for result, serial in zip(results, expected):
            torch.testing.assert_close(result, serial)
    assert (model_state(model), model.config._attn_implementation) == before


@pytest.mark.parametrize("method", [AttentionRollout, ALTI, AttnLRP], ids=lambda m: m.__name__)
def test_threads_explaining_a_language_model_get_the_serial_result(method):
    tokenizer = build_lm_tokenizer()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
        num_hidden_layers=2, max_position_embeddings=64, bos_token_id=2, eos_token_id=3, pad_token_id=0,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    before = model_state(model)
    explainer = LLMAttentionAttribution(method(model), tokenizer)

    def call():
        return explainer.attribute("the keys to the cabinet", target="are .").token_attr

    expected = call()
    for result in run_in_threads(call, threads=3, calls=2):
        torch.testing.assert_close(result, expected)
    assert model_state(model) == before


def test_threads_mixing_methods_on_one_model():
    """Calls whose captures differ (stored maps, lean capture, internals, AttnLRP's rules, plain
    gradients) interleave on one model."""
    model = make_classifier()
    model.train()  # left in train mode by the user: every call still runs in eval mode
    before = model_state(model)
    ids, mask = padded_batch(batch=2, n=6)
    rollout, alti, lrp, saliency = AttentionRollout(model), ALTI(model), AttnLRP(model), TokenSaliency(model)

    def call():
        return (rollout.attribute(ids, attention_mask=mask), alti.attribute(ids, attention_mask=mask),
                lrp.attribute(ids, target=1, attention_mask=mask), saliency.attribute(ids, target=1, attention_mask=mask))

    expected = call()
    for results in run_in_threads(call, threads=3, calls=2):
        for result, serial in zip(results, expected):
            torch.testing.assert_close(result, serial)
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
