"""Slow float64 references for encoder-decoders (not a test module): ALTI+ (Ferrando, Gállego,
Tsiamas & Costa-jussà, EMNLP 2022, "Towards opening the black box of neural machine translation:
source and target contributions in the Transformer"), value zeroing and the attention norms on the
joint graph, each example on its own real tokens (no padding).

Nothing here uses captum_attnflow nor transformers' attention functions: every attention sub-layer
is recomputed from its weights (explicit ``softmax(q kᵀ · scale + bias + mask)``), and only
token-local submodules of the model are called (feed-forward layers, activations); T5's relative
position bias is read from the model's bucketed table (``compute_bias``, a lookup, no attention).
As in :mod:`tests.references`, a forward hook replaces every block's output by the one computed
here, so the model's own code only embeds the tokens and applies what follows the stacks.

ALTI+ follows the equations of the authors' released code (``mt-upc/transformer-contributions-nmt``,
``wrappers/transformer_wrapper.py``), written out again: each sub-layer's transformed vectors
(the cross-attention's residual a vector of its own, the last column), the contributions
``max(0, ‖y‖₁ − ‖y − T‖₁)`` normalised to sum one ("min_sum"), the self-attention's rows scaled by
the cross-attention's residual column, and the rollout of the encoder and then of the decoder
(sources ``X_l R_enc + S_l U_{l-1}``, targets ``S_l T_{l-1}``, rows renormalised). One difference,
kept on purpose: the released code divides a post-LN sub-layer by ``std(x + eps)`` (eps added to
the values, a no-op for the deviation); here by ``sqrt(var + eps)``, the LayerNorm's own
statistic, so that the transformed vectors add up to the norm's output (checked).

Supported ``model_type``: ``bart``, ``marian`` (post-LN), ``mbart``, ``m2m_100`` (pre-LN), ``t5``
(pre-RMS-norm, no biases, relative position bias).
"""

from __future__ import annotations

import copy

import torch

from references import _layer_norm, _split_heads

POST_LN = {"bart", "marian"}
PRE_LN = {"mbart", "m2m_100"}


def _probabilities(q, k, allowed, scale, bias=None):
    """softmax over keys of q kᵀ · scale + bias, disallowed keys exactly 0; q (H, n_q, d), k (H, n_k, d)."""
    scores = torch.einsum("hic,hjc->hij", q, k) * scale
    if bias is not None:
        scores = scores + bias
    scores = scores.masked_fill(~allowed[None], float("-inf"))
    return torch.softmax(scores, -1)


def _linear(x, linear):
    return x @ linear.weight.T + (0 if linear.bias is None else linear.bias)


def _attention(names, module, hidden, source, allowed, heads, zero, scale, bias=None):
    """One attention sub-layer on one example: queries from ``hidden`` (n_q, D), keys and values
    from ``source`` (n_k, D), ``zero`` a key whose values are zeroed (or None). Returns a record:
    A (H, n_q, n_k), v (H, n_k, d), W_O (H, d, D), b_O (D,), out (n_q, D)."""
    q_name, k_name, v_name, o_name = names
    q = _split_heads(_linear(hidden, getattr(module, q_name))[None], heads)[0]
    k = _split_heads(_linear(source, getattr(module, k_name))[None], heads)[0]
    v = _split_heads(_linear(source, getattr(module, v_name))[None], heads)[0]
    if zero is not None:
        v = v.clone()
        v[:, zero] = 0
    A = _probabilities(q, k, allowed, scale if scale is not None else q.shape[-1] ** -0.5, bias)
    output = getattr(module, o_name)
    W_O = output.weight.T.reshape(heads, -1, output.weight.shape[0])
    b_O = output.bias if output.bias is not None else torch.zeros(output.weight.shape[0], dtype=hidden.dtype)
    out = torch.einsum("hij,hjc,hcd->id", A, v, W_O) + b_O
    return {"A": A, "v": v, "W_O": W_O, "b_O": b_O, "out": out}


def _rms(x, norm):
    return x / torch.sqrt((x**2).mean(-1, keepdim=True) + norm.variance_epsilon) * norm.weight


def _norm_parameters(norm):
    return norm.weight, norm.bias, norm.eps


def _block(model, block, x, encoder, zero=None, decoder=True):
    """One block of one example: ``x`` (n, D) its input, ``encoder`` (n_s, D) the encoder's output
    (decoder blocks). ``zero`` = (sub-layer, token): that key's values zeroed in ``"self"`` or
    ``"cross"``. Returns {"self": record, "cross": record, "out": (n, D)}; each sub-layer record
    also holds ``x`` (its residual stream), ``pre`` (residual + attention), ``y`` (the sub-layer's
    output) and, post-LN, ``ln`` (gamma, beta, eps)."""
    kind = model.config.model_type
    n = x.shape[0]
    causal = torch.ones(n, n, dtype=torch.bool).tril() if decoder else torch.ones(n, n, dtype=torch.bool)
    every = torch.ones(n, encoder.shape[0], dtype=torch.bool) if decoder else None
    zero_self = zero[1] if zero is not None and zero[0] == "self" else None
    zero_cross = zero[1] if zero is not None and zero[0] == "cross" else None
    records = {}
    if kind == "t5":
        heads = model.config.num_heads
        names = ("q", "k", "v", "o")
        first = (model.decoder if decoder else model.encoder).block[0].layer[0].SelfAttention
        bias = first.compute_bias(n, n)[0]
        layer = block.layer
        own = _attention(names, layer[0].SelfAttention, _rms(x, layer[0].layer_norm), _rms(x, layer[0].layer_norm),
                         causal, heads, zero_self, 1.0, bias)
        own.update(x=x, pre=x + own["out"], y=x + own["out"])
        records["self"] = h = own
        hidden = own["y"]
        if decoder:
            cross = _attention(names, layer[1].EncDecAttention, _rms(hidden, layer[1].layer_norm), encoder, every,
                               heads, zero_cross, 1.0)
            cross.update(x=hidden, pre=hidden + cross["out"], y=hidden + cross["out"])
            records["cross"] = h = cross
        hidden = h["y"]
        records["out"] = hidden + layer[-1].DenseReluDense(_rms(hidden, layer[-1].layer_norm))
        return records
    heads = model.config.decoder_attention_heads if decoder else model.config.encoder_attention_heads
    names = ("q_proj", "k_proj", "v_proj", "out_proj")
    post = kind in POST_LN
    norm = block.self_attn_layer_norm
    a = x if post else _layer_norm(x, *_norm_parameters(norm))
    own = _attention(names, block.self_attn, a, a, causal, heads, zero_self, None)
    own.update(x=x, pre=x + own["out"])
    own["y"] = _layer_norm(own["pre"], *_norm_parameters(norm)) if post else own["pre"]
    if post:
        own["ln"] = _norm_parameters(norm)
    records["self"] = h = own
    if decoder:
        hidden = own["y"]
        norm = block.encoder_attn_layer_norm
        a = hidden if post else _layer_norm(hidden, *_norm_parameters(norm))
        cross = _attention(names, block.encoder_attn, a, encoder, every, heads, zero_cross, None)
        cross.update(x=hidden, pre=hidden + cross["out"])
        cross["y"] = _layer_norm(cross["pre"], *_norm_parameters(norm)) if post else cross["pre"]
        if post:
            cross["ln"] = _norm_parameters(norm)
        records["cross"] = h = cross
    hidden = h["y"]
    final = block.final_layer_norm
    if post:
        records["out"] = _layer_norm(hidden + block.fc2(block.activation_fn(block.fc1(hidden))), *_norm_parameters(final))
    else:
        records["out"] = hidden + block.fc2(block.activation_fn(block.fc1(_layer_norm(hidden, *_norm_parameters(final)))))
    return records


def _stacks(model):
    if model.config.model_type == "t5":
        return list(model.encoder.block), list(model.decoder.block), model.encoder
    return list(model.model.encoder.layers), list(model.model.decoder.layers), model.model.encoder


def recomputed_example(model64, source, decoder_inputs):
    """Run one example (1-D ids, no padding) with every block recomputed here. Returns
    ``(encoder records, decoder records, encoder output)``, one record per block, each with its
    input ``"input"``."""
    encoder_blocks, decoder_blocks, encoder_module = _stacks(model64)
    encoder_records, decoder_records, state = [], [], {}

    def replace(decoder):
        def hook(module, args, kwargs, output):
            x = (args[0] if args else kwargs["hidden_states"])[0]
            records = _block(model64, module, x, state.get("encoder"), decoder=decoder)
            records["input"] = x
            (decoder_records if decoder else encoder_records).append(records)
            out = records["out"][None]
            return (out, *output[1:]) if isinstance(output, tuple) else out

        return hook

    def keep_encoder(module, args, output):
        state["encoder"] = output[0][0]

    handles = [b.register_forward_hook(replace(False), with_kwargs=True) for b in encoder_blocks]
    handles += [b.register_forward_hook(replace(True), with_kwargs=True) for b in decoder_blocks]
    handles.append(encoder_module.register_forward_hook(keep_encoder))
    try:
        with torch.no_grad():
            model64(input_ids=source[None], decoder_input_ids=decoder_inputs[None], use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return encoder_records, decoder_records, state["encoder"]


def _float64_copy(model):
    copied = copy.deepcopy(model).double().eval()
    for parameter in copied.parameters():
        parameter.requires_grad_(False)
    return copied


def _transformed(record, residual_column):
    """The sub-layer's transformed vectors (n_q, K, D) and its output y (n_q, D): Σ_h α^h_ij v^h_j W_O^h
    for every key j, the residual x_i added to j = i (self-attention) or appended as a last vector
    (cross-attention); post-LN each linearised with the row's own statistics."""
    A, v, W_O, x = record["A"], record["v"], record["W_O"], record["x"]
    T = torch.einsum("hij,hjc,hcd->ijd", A, v, W_O)
    if residual_column:
        T = torch.cat([T, x[:, None]], 1)
    else:
        T = T + torch.diag_embed(torch.ones(x.shape[0], dtype=x.dtype))[..., None] * x[:, None]
    if "ln" in record:
        gamma, beta, eps = record["ln"]
        pre = record["pre"]
        s = torch.sqrt(((pre - pre.mean(-1, keepdim=True)) ** 2).mean(-1) + eps)
        T = (T - T.mean(-1, keepdim=True)) * gamma / s[:, None, None]
        b_O = record["b_O"]
        rest = (b_O - b_O.mean()) * gamma / s[:, None] + beta
    else:
        rest = record["b_O"]
    y = record["y"]
    assert torch.allclose(T.sum(1) + rest, y, atol=1e-9), "the transformed vectors do not add up to the output"
    return T, y


def _min_sum(T, y, causal):
    """The released code's "l1" contributions, -‖T − y‖₁, normalised by "min_sum" with ‖y‖₁. A row
    whose vectors are all farther from y than ‖y‖₁ (all clipped to 0; the released code divides 0
    by 0) keeps its own token whole: the diagonal, or a cross-attention's residual (last column)."""
    contributions = -(T - y[:, None]).abs().sum(-1)
    contributions = (contributions + y.abs().sum(-1, keepdim=True)).clamp(min=0)
    n, k = contributions.shape
    if causal:  # a later token's vector is 0: its contribution ‖y‖₁ − ‖y‖₁ is exactly 0
        contributions = contributions * torch.ones(n, k, dtype=torch.bool).tril()
    own = torch.eye(n, k, dtype=torch.float64) if k == n else torch.nn.functional.one_hot(torch.full((n,), k - 1), k).double()
    empty = contributions.sum(-1, keepdim=True) == 0
    contributions = torch.where(empty, own, contributions)
    return contributions / contributions.sum(-1, keepdim=True)


def _rollout_encoder(maps):
    rolled = maps[0]
    for layer in maps[1:]:
        rolled = layer @ rolled
    return rolled


def _rollout_decoder(joint, encoder, n_s):
    """The released code's ``rollout``: (L_d, m, n_s + m) joint maps, the encoder's rollout."""
    sources = [joint[0][:, :n_s] @ encoder]
    targets = [joint[0][:, n_s:]]
    for layer in joint[1:]:
        s, t = layer[:, n_s:] @ sources[-1] + layer[:, :n_s] @ encoder, layer[:, n_s:] @ targets[-1]
        total = torch.cat([s, t], -1).sum(-1, keepdim=True)
        sources.append(s / total)
        targets.append(t / total)
    return torch.stack([torch.cat([s, t], -1) for s, t in zip(sources, targets)])


def _examples(model, source, decoder_inputs, attention_mask, decoder_attention_mask, per_example):
    """(L_d, B, m, n_s + m) of ``per_example(model64, source ids, decoder ids)`` -> (L_d, m_b, n_b + m_b), padding 0."""
    model64 = _float64_copy(model)
    batch, n_s = source.shape
    m = decoder_inputs.shape[1]
    out = None
    for b in range(batch):
        real_s = torch.arange(n_s) if attention_mask is None else attention_mask[b].nonzero().flatten()
        real_t = torch.arange(m) if decoder_attention_mask is None else decoder_attention_mask[b].nonzero().flatten()
        rows = per_example(model64, source[b, real_s], decoder_inputs[b, real_t])
        if out is None:
            out = torch.zeros(rows.shape[0], batch, m, n_s + m, dtype=torch.float64)
        columns = torch.cat([real_s, n_s + real_t])
        out[:, b, real_t[:, None], columns[None, :]] = rows
    return out


def alti_plus_reference(model, source, decoder_inputs, attention_mask=None, decoder_attention_mask=None):
    """ALTI+'s rows after every decoder layer, (L_d, B, m, n_s + m) float64: source tokens, then
    the decoder's input tokens; padding 0 (see the module docstring)."""

    def example(model64, src, dec):
        encoder_records, decoder_records, _ = recomputed_example(model64, src, dec)
        encoder = _rollout_encoder([_min_sum(*_transformed(r["self"], False), False) for r in encoder_records])
        joint = []
        for records in decoder_records:
            own = _min_sum(*_transformed(records["self"], False), True)
            cross = _min_sum(*_transformed(records["cross"], True), False)
            joint.append(torch.cat([cross[:, :-1], own * cross[:, -1:]], -1))
        return _rollout_decoder(joint, encoder, src.shape[0])

    return _examples(model, source, decoder_inputs, attention_mask, decoder_attention_mask, example)


def _cosine_distance(a, b):
    return (1 - (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))).clamp(0, 2)


def value_zeroing_reference(model, source, decoder_inputs, attention_mask=None, decoder_attention_mask=None):
    """Value zeroing on the joint graph, (L_d, B, m, n_s + m) float64: each layer's map from
    blocks rerun here with one key's values zeroed (the decoder's rows over both kinds of key
    normalised together), composed as ALTI+'s."""

    def example(model64, src, dec):
        encoder_records, decoder_records, encoder_output = recomputed_example(model64, src, dec)
        encoder_blocks, decoder_blocks, _ = _stacks(model64)
        maps = []
        for block, records in zip(encoder_blocks, encoder_records):
            n = src.shape[0]
            C = torch.stack([
                _cosine_distance(_block(model64, block, records["input"], None, ("self", j), False)["out"], records["out"])
                for j in range(n)
            ], -1)
            maps.append(C / C.sum(-1, keepdim=True))
        encoder = _rollout_encoder(maps)
        joint = []
        for block, records in zip(decoder_blocks, decoder_records):
            distances = []
            for kind, count in (("cross", src.shape[0]), ("self", dec.shape[0])):
                for j in range(count):
                    zeroed = _block(model64, block, records["input"], encoder_output, (kind, j))["out"]
                    distances.append(_cosine_distance(zeroed, records["out"]))
            C = torch.stack(distances, -1)
            C[:, src.shape[0]:] *= torch.ones(dec.shape[0], dec.shape[0]).tril()  # a later token changes nothing
            joint.append(C / C.sum(-1, keepdim=True))
        return _rollout_decoder(joint, encoder, src.shape[0])

    return _examples(model, source, decoder_inputs, attention_mask, decoder_attention_mask, example)


def attention_norm_reference(model, source, decoder_inputs, attention_mask=None, decoder_attention_mask=None):
    """Each decoder layer's norms ‖Σ_h α^h_tj v^h_j W_O^h‖₂, the cross-attention's over the source
    tokens then the self-attention's over the decoder inputs, (L_d, B, m, n_s + m) float64, not normalised."""

    def example(model64, src, dec):
        _, decoder_records, _ = recomputed_example(model64, src, dec)
        return torch.stack([
            torch.cat([torch.einsum("hij,hjc,hcd->ijd", r[kind]["A"], r[kind]["v"], r[kind]["W_O"]).norm(dim=-1)
                       for kind in ("cross", "self")], -1)
            for r in decoder_records
        ])

    return _examples(model, source, decoder_inputs, attention_mask, decoder_attention_mask, example)

