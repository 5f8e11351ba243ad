"""Slow, float64 reference implementations of the attribution methods, for the tests (not a test module).

Written from the papers and checked against the maths of the authors' released code (notes in
``/work/notes/authors_maths.md``); nothing here uses captum_attnflow, nor transformers' attention
functions. Every function works on a deep copy of the model in float64 and eval mode, recomputes
each layer's self-attention by hand from the layer's weights (explicit ``softmax(q kᵀ · scale + mask)``),
and calls only the token-local feed-forward submodules (``intermediate``/``mlp``/``ffn``) of the model.

How the recomputation is wired: a forward hook on every transformer layer replaces the layer's
output by the output computed here from the layer's input. The model's own code therefore only
embeds the inputs (layer 0's input) and applies what comes after the last layer (final norm,
pooler, classifier), so ``target_fn`` receives the model's usual output object while every
attention map it depends on is a tensor computed here.

Supported: ``bert``, ``roberta``, ``distilbert`` (post-LN), ``gpt2`` (causal), ``llama`` (causal,
rotary positions, grouped-query attention, RMSNorm), the bundled agreement model (non-causal GPT-2
blocks), ``vit`` (pre-LN, pixel values, no mask); base models and their classification heads.

Shapes: ``inputs`` (B, n) token ids, or (B, 3, H, W) pixel values for ViT; ``attention_mask``
(B, n) with 1 for real tokens (right or left padding), or None. Every function returns float64
(L, B, n, n) maps, one per layer, rows = the position explained (i), columns = the source (j).
Rows and columns of padding positions are exactly 0, and padding never changes the values of the
real tokens (the masked keys get probability exactly 0).

Positions of padding tokens: the models are run exactly as transformers runs them (GPT-2 and
Llama number positions 0..n-1 whatever the mask, so a left-padded decoder input is not the same
sentence as the unpadded one; RoBERTa numbers from the padding mask).
"""

from __future__ import annotations

import copy
import math

import torch

POST_LN = {"bert", "roberta", "distilbert", "electra", "deberta-v2", "mpnet"}
CAUSAL = {"gpt2", "llama", "qwen3", "qwen3_moe", "mixtral", "clip_text_model", "gemma2", "gemma3_text", "olmo2", "bloom",
          "falcon"}
KINDS = {
    "bert": "bert",
    "roberta": "bert",
    "electra": "bert",
    "qwen3": "llama",  # with RMSNorm on each head's queries and keys
    "mixtral": "llama",  # with the mixture of experts as its feed-forward
    "qwen3_moe": "llama",  # query and key norms, and a mixture of experts on some layers
    "gemma2": "post_norm",
    "gemma3_text": "post_norm",
    "olmo2": "post_norm",
    "dinov2": "dinov2",
    "clip_text_model": "clip",
    "clip_vision_model": "clip",
    "distilbert": "distilbert",
    "gpt2": "gpt2",
    "captum_attnflow_agreement": "gpt2",
    "llama": "llama",
    "vit": "vit",
    "deberta-v2": "deberta",
    "mpnet": "mpnet",
    "bloom": "bloom",
    "falcon": "falcon",
}


# --------------------------------------------------------------------------------------------
# building blocks, written out


def _layer_norm(x, weight, bias, eps):
    """LayerNorm over the last dimension: (x - mean) / sqrt(var + eps) * weight + bias."""
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def _rms_norm(x, weight, eps):
    """RMSNorm (Llama): x / sqrt(mean(x²) + eps) * weight."""
    return x / torch.sqrt((x**2).mean(-1, keepdim=True) + eps) * weight


def _split_heads(x, heads):
    """(B, n, heads * dh) -> (B, heads, n, dh); head h is the slice [h*dh, (h+1)*dh)."""
    B, n, width = x.shape
    return x.view(B, n, heads, width // heads).transpose(1, 2)


def _attention_probabilities(q, k, allowed, scale, bias=None):
    """softmax over keys of q kᵀ · scale (+ ``bias``, broadcast to (B, H, n, n)), with
    disallowed keys at the most negative float64.

    q (B, H, n, dh), k (B, H, n, dh), allowed (B, n, n) bool. Disallowed keys get exactly 0 in
    every row that has an allowed key; a row with none (a left-padding query of a causal model)
    becomes uniform instead of NaN, as in transformers' eager attention, and is never used.
    """
    scores = torch.einsum("bhic,bhjc->bhij", q, k) * scale
    if bias is not None:
        scores = scores + bias
    scores = scores.masked_fill(~allowed[:, None], torch.finfo(torch.float64).min)
    scores = scores - scores.max(-1, keepdim=True).values
    weights = torch.exp(scores)
    return weights / weights.sum(-1, keepdim=True)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def _rotary(x, positions, theta):
    """Rotary position embedding (the "rotate half" convention transformers' Llama uses).

    Angles pos * theta^(-2c/dh) for c < dh/2, each used for dimensions c and c + dh/2. In float64
    (transformers computes the angles, and RMSNorm, in float32 even in a float64 model, so a
    float64 Llama agrees with this only to ~1e-6)."""
    dh = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, dh, 2, dtype=torch.float64) / dh)
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]  # (n, dh/2)
    angles = torch.cat([angles, angles], dim=-1)  # (n, dh)
    return x * torch.cos(angles) + _rotate_half(x) * torch.sin(angles)


def _linear(x, linear):
    """x Wᵀ + b of an nn.Linear (no bias when it has none)."""
    out = x @ linear.weight.T
    return out if linear.bias is None else out + linear.bias


def _output_heads(weight_in_by_out, heads):
    """Per-head output projections (H, dh, d) from a (H*dh, d) matrix: attn_out = Σ_h ctx_h @ W_O^h + b_O."""
    width, d = weight_in_by_out.shape
    return weight_in_by_out.reshape(heads, width // heads, d)


def _zero_token_value(v, token):
    """Value vectors (after the value projection, bias included) with token ``token`` zeroed in all heads."""
    if token is None:
        return v
    v = v.clone()
    v[:, :, token, :] = 0
    return v


def _finish(record, x, A, v, W_O, b_O):
    """Context vectors, the attention output Σ_h (A_h v_h) W_O^h + b_O, and the record of the layer."""
    context = torch.einsum("bhij,bhjc->bhic", A, v)
    attn_out = torch.einsum("bhic,hcd->bid", context, W_O) + b_O
    record.update(x=x, A=A, v=v, W_O=W_O, b_O=b_O, attn_out=attn_out)
    return attn_out


def _linear_attention(record, x, a, linears, heads, allowed, zero_token):
    """The attention of a block whose projections are ``linears`` = (query, key, value, output)
    nn.Linear layers of H = ``heads`` heads applied to ``a`` (x itself post-LN, the normed x
    pre-LN): softmax(q k^T / sqrt(dh)) over ``allowed`` keys, then :func:`_finish`."""
    query, key, value, output = linears
    q = _split_heads(_linear(a, query), heads)
    k = _split_heads(_linear(a, key), heads)
    v = _zero_token_value(_split_heads(_linear(a, value), heads), zero_token)
    A = _attention_probabilities(q, k, allowed, 1.0 / math.sqrt(q.shape[-1]))
    return _finish(record, x, A, v, _output_heads(output.weight.T, heads), output.bias)


# --------------------------------------------------------------------------------------------
# one layer per architecture: returns a record with the layer input x (B, n, d), the attention
# probabilities A (B, H, n, n), value vectors v (B, H, n, dh) per query head, W_O (H, dh, d),
# b_O (d,), attn_out (B, n, d), mid (the attention block's output: LN1(x + attn_out) post-LN,
# x + attn_out pre-LN), the LN1 parameters for post-LN, and out (the layer output).


def _bert_layer(layer, config, x, allowed, zero_token=None, layer_index=0):
    heads = config.num_attention_heads
    sa = layer.attention.self
    record = {}
    attn_out = _linear_attention(
        record, x, x, (sa.query, sa.key, sa.value, layer.attention.output.dense), heads, allowed, zero_token
    )
    ln1 = layer.attention.output.LayerNorm
    pre_ln1 = x + attn_out
    mid = _layer_norm(pre_ln1, ln1.weight, ln1.bias, ln1.eps)
    ffn = layer.output.dense(layer.intermediate(mid))  # intermediate = dense + activation
    ln2 = layer.output.LayerNorm
    out = _layer_norm(ffn + mid, ln2.weight, ln2.bias, ln2.eps)
    record.update(pre_ln1=pre_ln1, ln1=(ln1.weight, ln1.bias, ln1.eps), mid=mid, out=out)
    return record


def _distilbert_layer(layer, config, x, allowed, zero_token=None, layer_index=0):
    heads = config.n_heads
    att = layer.attention
    record = {}
    attn_out = _linear_attention(record, x, x, (att.q_lin, att.k_lin, att.v_lin, att.out_lin), heads, allowed, zero_token)
    ln1 = layer.sa_layer_norm
    pre_ln1 = x + attn_out
    mid = _layer_norm(pre_ln1, ln1.weight, ln1.bias, ln1.eps)
    ln2 = layer.output_layer_norm
    out = _layer_norm(layer.ffn(mid) + mid, ln2.weight, ln2.bias, ln2.eps)
    record.update(pre_ln1=pre_ln1, ln1=(ln1.weight, ln1.bias, ln1.eps), mid=mid, out=out)
    return record


def _gpt2_layer(layer, config, x, allowed, zero_token=None, layer_index=0):
    """A GPT-2 block (GPT-2 itself, causal, and the agreement model's non-causal blocks)."""
    heads = config.num_attention_heads
    d = x.shape[-1]
    a = _layer_norm(x, layer.ln_1.weight, layer.ln_1.bias, layer.ln_1.eps)
    qkv = a @ layer.attn.c_attn.weight + layer.attn.c_attn.bias  # Conv1D: x W + b, W (d, 3d)
    q, k, v = (_split_heads(qkv[..., i * d : (i + 1) * d], heads) for i in range(3))
    v = _zero_token_value(v, zero_token)
    scale = 1.0 / math.sqrt(q.shape[-1]) if config.scale_attn_weights else 1.0
    if config.scale_attn_by_inverse_layer_idx:
        scale /= layer_index + 1
    A = _attention_probabilities(q, k, allowed, scale)
    c_proj = layer.attn.c_proj
    record = {}
    attn_out = _finish(record, x, A, v, _output_heads(c_proj.weight, heads), c_proj.bias)
    mid = x + attn_out
    out = mid + layer.mlp(_layer_norm(mid, layer.ln_2.weight, layer.ln_2.bias, layer.ln_2.eps))
    record.update(mid=mid, out=out)
    return record


def _llama_layer(layer, config, x, allowed, zero_token=None, layer_index=0):
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    rope = config.rope_parameters
    if rope.get("rope_type", "default") != "default":
        raise NotImplementedError(f"reference rotary embedding only for rope_type 'default', got {rope}")
    att = layer.self_attn
    a = _rms_norm(x, layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon)
    positions = torch.arange(x.shape[1])  # LlamaModel's default position_ids
    q, k = _split_heads(_linear(a, att.q_proj), heads), _split_heads(_linear(a, att.k_proj), kv_heads)
    if hasattr(att, "q_norm"):  # Qwen3: each head's queries and keys RMS-normed before the rotation
        q = _rms_norm(q, att.q_norm.weight, att.q_norm.variance_epsilon)
        k = _rms_norm(k, att.k_norm.weight, att.k_norm.variance_epsilon)
    q, k = _rotary(q, positions, rope["rope_theta"]), _rotary(k, positions, rope["rope_theta"])
    v = _zero_token_value(_split_heads(_linear(a, att.v_proj), kv_heads), zero_token)
    # grouped-query attention: query head h reads key/value head h // (heads / kv_heads)
    group = heads // kv_heads
    k = torch.stack([k[:, h // group] for h in range(heads)], dim=1)
    v = torch.stack([v[:, h // group] for h in range(heads)], dim=1)
    A = _attention_probabilities(q, k, allowed, 1.0 / math.sqrt(q.shape[-1]))
    o_proj = att.o_proj
    b_O = o_proj.bias if o_proj.bias is not None else torch.zeros(x.shape[-1], dtype=x.dtype)
    record = {}
    attn_out = _finish(record, x, A, v, _output_heads(o_proj.weight.T, heads), b_O)
    mid = x + attn_out
    norm2 = layer.post_attention_layernorm
    out = mid + layer.mlp(_rms_norm(mid, norm2.weight, norm2.variance_epsilon))
    record.update(mid=mid, out=out)
    return record


def _vit_layer(layer, config, x, allowed, zero_token=None, layer_index=0):
    heads = config.num_attention_heads
    att = layer.attention
    a = _layer_norm(x, layer.layernorm_before.weight, layer.layernorm_before.bias, layer.layernorm_before.eps)
    record = {}
    attn_out = _linear_attention(record, x, a, (att.q_proj, att.k_proj, att.v_proj, att.o_proj), heads, allowed, zero_token)
    mid = x + attn_out
    ln2 = layer.layernorm_after
    out = mid + layer.mlp(_layer_norm(mid, ln2.weight, ln2.bias, ln2.eps))
    record.update(mid=mid, out=out)
    return record


def _rms_scale(x, norm):
    """The factor w' / sqrt(mean(x²) + eps) of a model's RMS norm module on x: w' = 1 + w for Gemma's, w for the others."""
    eps = norm.variance_epsilon if hasattr(norm, "variance_epsilon") else norm.eps
    weight = 1 + norm.weight if type(norm).__name__.startswith("Gemma") else norm.weight
    return weight / torch.sqrt((x**2).mean(-1, keepdim=True) + eps)


def _rms_norm_of(x, norm):
    """A model's RMS norm module, written out."""
    return x * _rms_scale(x, norm)


def _post_norm_layer(layer, config, x, allowed, zero_token=None, layer_index=0):
    """Gemma 2/3 and OLMo 2: RMS norms on the attention's and the feed-forward's outputs before
    the residual (Gemma: on their inputs too); queries and keys RMS-normed per head (Gemma 3) or
    over all heads at once (OLMo 2). The attention output's norm is linear given token i's own
    statistics: record["attention_scale"] s_i = w' / rms(attn_out_i), mid = x + s ⊙ attn_out."""
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    att = layer.self_attn
    gemma = hasattr(layer, "input_layernorm")
    a = _rms_norm_of(x, layer.input_layernorm) if gemma else x
    q, k = _linear(a, att.q_proj), _linear(a, att.k_proj)
    olmo = config.model_type == "olmo2"
    if olmo:
        q, k = _rms_norm_of(q, att.q_norm), _rms_norm_of(k, att.k_norm)
    q, k = _split_heads(q, heads), _split_heads(k, kv_heads)
    if hasattr(att, "q_norm") and not olmo:
        q, k = _rms_norm_of(q, att.q_norm), _rms_norm_of(k, att.k_norm)
    rope = config.rope_parameters
    theta = rope["rope_theta"] if "rope_theta" in rope else rope[config.layer_types[layer_index]]["rope_theta"]
    positions = torch.arange(x.shape[1])
    q, k = _rotary(q, positions, theta), _rotary(k, positions, theta)
    v = _zero_token_value(_split_heads(_linear(a, att.v_proj), kv_heads), zero_token)
    group = heads // kv_heads
    k = torch.stack([k[:, h // group] for h in range(heads)], dim=1)
    v = torch.stack([v[:, h // group] for h in range(heads)], dim=1)
    scale = config.query_pre_attn_scalar**-0.5 if gemma else q.shape[-1] ** -0.5
    A = _attention_probabilities(q, k, allowed, scale)
    record = {}
    attn_out = _finish(record, x, A, v, _output_heads(att.o_proj.weight.T, heads), torch.zeros(x.shape[-1], dtype=x.dtype))
    attention_scale = _rms_scale(attn_out, layer.post_attention_layernorm)
    mid = x + attention_scale * attn_out
    inner = layer.mlp(_rms_norm_of(mid, layer.pre_feedforward_layernorm) if gemma else mid)
    out = mid + _rms_norm_of(inner, layer.post_feedforward_layernorm)
    record.update(mid=mid, out=out, attention_scale=attention_scale)
    return record


def _dinov2_layer(layer, config, x, allowed, zero_token=None, layer_index=0):
    """DINOv2: ViT's block with a learned per-channel scale λ on the attention's and the
    feed-forward's outputs before the residual (record["attention_scale"] = λ)."""
    heads = config.num_attention_heads
    att = layer.attention
    a = _layer_norm(x, layer.norm1.weight, layer.norm1.bias, layer.norm1.eps)
    record = {}
    attn_out = _linear_attention(record, x, a, (att.q_proj, att.k_proj, att.v_proj, att.o_proj), heads, allowed, zero_token)
    scale = layer.layer_scale1.lambda1
    mid = x + scale * attn_out
    inner = layer.mlp(_layer_norm(mid, layer.norm2.weight, layer.norm2.bias, layer.norm2.eps))
    out = mid + layer.layer_scale2.lambda1 * inner
    record.update(mid=mid, out=out, attention_scale=scale.expand_as(attn_out))
    return record


def _clip_layer(layer, config, x, allowed, zero_token=None, layer_index=0):
    """A CLIP (or SigLIP) encoder layer: pre-LN, as ViT's with other names."""
    heads = config.num_attention_heads
    att = layer.self_attn
    a = _layer_norm(x, layer.layer_norm1.weight, layer.layer_norm1.bias, layer.layer_norm1.eps)
    record = {}
    attn_out = _linear_attention(record, x, a, (att.q_proj, att.k_proj, att.v_proj, att.out_proj), heads, allowed, zero_token)
    mid = x + attn_out
    ln2 = layer.layer_norm2
    out = mid + layer.mlp(_layer_norm(mid, ln2.weight, ln2.bias, ln2.eps))
    record.update(mid=mid, out=out)
    return record


def _owner(layer):
    """The encoder holding ``layer`` (its relative-position tables), linked by :func:`recomputed_forward`."""
    return layer.__dict__["_reference_encoder"]


def _expand_heads(x, heads):
    """(B, h, n, d) key or value heads -> (B, heads, n, d): query head h reads head h // (heads / h)."""
    return x.repeat_interleave(heads // x.shape[1], dim=1)


def _post_ln_finish(record, x, attn_out, ln1, intermediate, output):
    """BERT's block after the attention: LN1(x + attention), then the feed-forward and LN2."""
    pre_ln1 = x + attn_out
    mid = _layer_norm(pre_ln1, ln1.weight, ln1.bias, ln1.eps)
    ln2 = output.LayerNorm
    out = _layer_norm(output.dense(intermediate(mid)) + mid, ln2.weight, ln2.bias, ln2.eps)
    record.update(pre_ln1=pre_ln1, ln1=(ln1.weight, ln1.bias, ln1.eps), mid=mid, out=out)
    return record


def _deberta_layer(layer, config, x, allowed, zero_token=None, layer_index=0):
    """DeBERTa-v2/v3: BERT's post-LN block whose scores add to q_i · k_j the content-to-position
    term q_i · k^r_δ and the position-to-content term k_j · q^r_δ, δ = span + i - j (clamped to the
    table), all over sqrt(dh (1 + number of terms)); k^r and q^r are the relative embeddings
    (LayerNorm-ed) through the key and query projections (shared, or the position ones). Written
    for inputs shorter than half the position buckets, where the buckets are the distances."""
    heads, att = config.num_attention_heads, layer.attention.self
    q, k = _split_heads(_linear(x, att.query_proj), heads), _split_heads(_linear(x, att.key_proj), heads)
    v = _zero_token_value(_split_heads(_linear(x, att.value_proj), heads), zero_token)
    terms = config.pos_att_type or []
    scale = 1.0 / math.sqrt(q.shape[-1] * (1 + len(terms)))
    encoder, n = _owner(layer), x.shape[1]
    buckets = config.position_buckets
    span = buckets if buckets > 0 else (config.max_relative_positions if config.max_relative_positions > 0
                                        else config.max_position_embeddings)
    assert buckets <= 0 or n < buckets // 2, "the reference writes out distances, not log buckets"
    table = encoder.rel_embeddings.weight[: 2 * span]
    if "layer_norm" in config.norm_rel_ebd:
        table = _layer_norm(table, encoder.LayerNorm.weight, encoder.LayerNorm.bias, encoder.LayerNorm.eps)
    share = config.share_att_key
    delta = (torch.arange(n)[:, None] - torch.arange(n)[None] + span).clamp(0, 2 * span - 1)  # (n, n)
    bias = torch.zeros(x.shape[0], heads, n, n, dtype=x.dtype)
    if "c2p" in terms:
        rel_k = _split_heads(_linear(table[None], att.key_proj if share else att.pos_key_proj), heads)[0]  # (H, 2 span, dh)
        bias = bias + torch.einsum("bhic,hijc->bhij", q, rel_k[:, delta]) * scale
    if "p2c" in terms:
        rel_q = _split_heads(_linear(table[None], att.query_proj if share else att.pos_query_proj), heads)[0]
        bias = bias + torch.einsum("bhjc,hijc->bhij", k, rel_q[:, delta]) * scale
    A = _attention_probabilities(q, k, allowed, scale, bias)
    record = {}
    out = layer.attention.output
    attn_out = _finish(record, x, A, v, _output_heads(out.dense.weight.T, heads), out.dense.bias)
    return _post_ln_finish(record, x, attn_out, out.LayerNorm, layer.intermediate, layer.output)


def _mpnet_layer(layer, config, x, allowed, zero_token=None, layer_index=0):
    """MPNet: BERT's post-LN block whose scores add a learned bias per head and relative position
    bucket, bucket(i, j) = 16 [j > i] + |i - j| (32 buckets: the distance itself below 8)."""
    heads, att = config.num_attention_heads, layer.attention.attn
    n = x.shape[1]
    assert n <= 8, "the reference writes out the buckets of distances below 8"
    i, j = torch.arange(n)[:, None], torch.arange(n)[None]
    buckets = 16 * (j > i).long() + (i - j).abs()
    bias = _owner(layer).relative_attention_bias.weight[buckets].permute(2, 0, 1)[None]  # (1, H, n, n)
    q, k = _split_heads(_linear(x, att.q), heads), _split_heads(_linear(x, att.k), heads)
    v = _zero_token_value(_split_heads(_linear(x, att.v), heads), zero_token)
    A = _attention_probabilities(q, k, allowed, 1.0 / math.sqrt(q.shape[-1]), bias)
    record = {}
    attn_out = _finish(record, x, A, v, _output_heads(att.o.weight.T, heads), att.o.bias)
    return _post_ln_finish(record, x, attn_out, layer.attention.LayerNorm, layer.intermediate, layer.output)


def alibi_slopes(heads):
    """ALiBi's slope of each head, 2^(-8 h / H) for h = 1..H (H a power of 2)."""
    assert heads & (heads - 1) == 0, "the reference writes out ALiBi for a power of 2 heads"
    return 2.0 ** (-8.0 * torch.arange(1, heads + 1, dtype=torch.float64) / heads)


def _alibi(allowed, heads):
    """(B, H, 1, n) ALiBi: each head's slope times the key's position among the real tokens."""
    real = allowed.any(1)  # (B, n): keys some query may read
    positions = (real.cumsum(-1) - 1) * real
    return (alibi_slopes(heads)[None, :, None] * positions[:, None].double())[:, :, None]


def _bloom_layer(layer, config, x, allowed, zero_token=None, layer_index=0):
    """BLOOM: pre-LN, a fused projection of (H, 3, dh) queries, keys and values, scores
    q kᵀ / sqrt(dh) plus ALiBi; the feed-forward adds its residual itself."""
    heads = config.n_head
    norm1 = layer.input_layernorm
    a = _layer_norm(x, norm1.weight, norm1.bias, norm1.eps)
    att = layer.self_attention
    fused = _linear(a, att.query_key_value).view(*x.shape[:2], heads, 3, -1)
    q, k, v = (fused[..., index, :].transpose(1, 2) for index in range(3))
    v = _zero_token_value(v, zero_token)
    A = _attention_probabilities(q, k, allowed, 1.0 / math.sqrt(q.shape[-1]), _alibi(allowed, heads))
    record = {}
    attn_out = _finish(record, x, A, v, _output_heads(att.dense.weight.T, heads), att.dense.bias)
    residual = a if config.apply_residual_connection_post_layernorm else x
    mid = residual + attn_out
    norm2 = layer.post_attention_layernorm
    normed = _layer_norm(mid, norm2.weight, norm2.bias, norm2.eps)
    out = layer.mlp(normed, normed if config.apply_residual_connection_post_layernorm else mid)
    record.update(mid=mid, out=out, residual=residual)
    return record


def _falcon_layer(layer, config, x, allowed, zero_token=None, layer_index=0):
    """Falcon: a fused projection, laid out per key head as its queries then key and value
    (new decoder architecture), as all queries then one key and value (multi-query), or as
    (H, 3, dh); ALiBi (once: the model as sdpa computes it) or rotary positions; the
    feed-forward beside the attention (parallel: on the block's input) or after it."""
    heads = config.num_attention_heads
    first = layer.ln_attn if hasattr(layer, "ln_attn") else layer.input_layernorm
    a = _layer_norm(x, first.weight, first.bias, first.eps)
    att = layer.self_attention
    B, n, D = x.shape
    dh = D // heads
    fused = _linear(a, att.query_key_value)
    if config.new_decoder_architecture:
        kv = config.num_kv_heads
        grouped = fused.view(B, n, kv, heads // kv + 2, dh)
        q, k, v = grouped[..., :-2, :].reshape(B, n, heads, dh), grouped[..., -2, :], grouped[..., -1, :]
    elif config.multi_query:
        q, k, v = fused.view(B, n, heads + 2, dh).split([heads, 1, 1], dim=2)
    else:
        q, k, v = fused.view(B, n, heads, 3, dh).unbind(3)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    if config.alibi:
        bias = _alibi(allowed, heads) / math.sqrt(dh)
    else:
        theta = config.rope_parameters["rope_theta"]
        q, k, bias = _rotary(q, torch.arange(n), theta), _rotary(k, torch.arange(n), theta), None
    k, v = _expand_heads(k, heads), _zero_token_value(_expand_heads(v, heads), zero_token)
    A = _attention_probabilities(q, k, allowed, 1.0 / math.sqrt(dh), bias)
    record = {}
    b_O = att.dense.bias if att.dense.bias is not None else torch.zeros(D, dtype=x.dtype)
    attn_out = _finish(record, x, A, v, _output_heads(att.dense.weight.T, heads), b_O)
    mid = x + attn_out
    if hasattr(layer, "ln_mlp"):
        out = mid + layer.mlp(_layer_norm(x, layer.ln_mlp.weight, layer.ln_mlp.bias, layer.ln_mlp.eps))
    elif config.new_decoder_architecture or config.parallel_attn:
        out = mid + layer.mlp(a)
    else:
        norm2 = layer.post_attention_layernorm
        out = mid + layer.mlp(_layer_norm(mid, norm2.weight, norm2.bias, norm2.eps))
    record.update(mid=mid, out=out)
    return record


LAYER_FUNCTIONS = {
    "clip": _clip_layer,
    "post_norm": _post_norm_layer,
    "dinov2": _dinov2_layer,
    "bert": _bert_layer,
    "distilbert": _distilbert_layer,
    "gpt2": _gpt2_layer,
    "llama": _llama_layer,
    "vit": _vit_layer,
    "deberta": _deberta_layer,
    "mpnet": _mpnet_layer,
    "bloom": _bloom_layer,
    "falcon": _falcon_layer,
}


# --------------------------------------------------------------------------------------------
# the model


def model_kind(model) -> str:
    """``config.model_type``, checked to be one this module implements."""
    model_type = model.config.model_type
    if model_type not in KINDS:
        raise NotImplementedError(f"no reference for model_type {model_type!r}")
    if getattr(model.config, "is_decoder", False) and model_type in POST_LN:
        raise NotImplementedError("reference BERT-like models are encoders")
    if getattr(model.config, "position_embedding_type", "absolute") != "absolute":
        raise NotImplementedError("reference BERT-like models use absolute positions")
    return model_type


def layers_of(model):
    """The model's transformer layers, in order."""
    base = model.base_model
    kind = KINDS[model_kind(model)]
    if kind in ("bert", "deberta", "mpnet"):
        return list(base.encoder.layer)
    if kind in ("bloom", "falcon"):
        return list(base.h)
    if kind == "distilbert":
        return list(base.transformer.layer)
    if kind == "gpt2":
        return list(base.h)
    if kind == "clip":
        return list(base.encoder.layers)
    if kind == "dinov2":
        return list(base.encoder.layer)
    return list(base.layers)  # llama, vit (transformers 5: ViTModel.layers)


def float64_copy(model):
    """A deep copy in float64, eval mode, parameters not requiring gradients."""
    copied = copy.deepcopy(model).double().eval()
    for parameter in copied.parameters():
        parameter.requires_grad_(False)
    return copied


def _model_inputs(model, inputs, attention_mask):
    if model_kind(model) in ("vit", "clip_vision_model", "dinov2"):
        return {"pixel_values": inputs.to(torch.float64)}
    kwargs = {"input_ids": inputs}
    if attention_mask is not None:
        kwargs["attention_mask"] = attention_mask
    return kwargs


def _allowed_keys(model_type, real, n):
    """(B, n, n) bool: query i may read key j (j is a real token, and j <= i for decoders)."""
    allowed = real[:, None, :].expand(-1, n, -1)
    if model_type in CAUSAL:
        allowed = allowed & torch.ones(n, n, dtype=torch.bool).tril()
    return allowed


def recomputed_forward(model64, inputs, attention_mask, requires_grad=False):
    """Run ``model64`` (a float64 copy) with every layer's output replaced by the one computed here.

    Returns ``(output, records, real)``: the model's output object, the per-layer records (see
    the layer functions above; ``records[l]["x"]`` is the input of layer l), and ``real`` (B, n)
    bool. With ``requires_grad`` layer 0's input is a leaf requiring gradients, so the attention
    maps ``records[l]["A"]`` are differentiable (non-leaf) tensors of the output.
    """
    model_type = model_kind(model64)
    layer_function = LAYER_FUNCTIONS[KINDS[model_type]]
    records = []
    state = {}

    def replace_output(index):
        def hook(module, args, kwargs, output):
            x = args[0] if args else kwargs["hidden_states"]
            if index == 0:
                x = x.detach().requires_grad_(requires_grad)
                n = x.shape[1]
                if attention_mask is None:
                    real = torch.ones(x.shape[0], n, dtype=torch.bool)
                else:
                    real = attention_mask.to(torch.bool)
                state["real"] = real
                state["allowed"] = _allowed_keys(model_type, real, n)
            record = layer_function(module, model64.config, x, state["allowed"], layer_index=index)
            records.append(record)
            return (record["out"], *output[1:]) if isinstance(output, tuple) else record["out"]

        return hook

    for layer in layers_of(model64):
        layer.__dict__["_reference_encoder"] = model64.base_model.encoder if hasattr(model64.base_model, "encoder") else None
    handles = [
        layer.register_forward_hook(replace_output(index), with_kwargs=True)
        for index, layer in enumerate(layers_of(model64))
    ]
    try:
        with torch.set_grad_enabled(requires_grad):
            output = model64(**_model_inputs(model64, inputs, attention_mask))
    finally:
        for handle in handles:
            handle.remove()
    return output, records, state["real"]


def rerun_layer(model64, index, record, allowed, zero_token=None):
    """Layer ``index`` recomputed from the same input ``record["x"]``, optionally with token
    ``zero_token``'s value vectors (after the value projection, bias included) zeroed in all heads."""
    layer_function = LAYER_FUNCTIONS[KINDS[model_kind(model64)]]
    return layer_function(
        layers_of(model64)[index], model64.config, record["x"], allowed, zero_token=zero_token, layer_index=index
    )


def _mask_pairs(maps, real):
    """Zero the rows and columns of padding positions of (B, n, n) maps."""
    pair = real[:, :, None] & real[:, None, :]
    return torch.where(pair, maps, torch.zeros((), dtype=maps.dtype))


def _normalise_rows(maps, real):
    """Rows over real tokens divided by their sum (a zero row stays zero); padding rows/columns 0."""
    maps = _mask_pairs(maps, real)
    sums = maps.sum(-1, keepdim=True)
    return torch.where(sums > 0, maps / torch.where(sums > 0, sums, torch.ones_like(sums)), maps)


# --------------------------------------------------------------------------------------------
# the methods


def rollout_of(matrices) -> torch.Tensor:
    """Rollout across layers: (M_1, M_2 M_1, M_3 M_2 M_1, ...) of (L, B, n, n) matrices, in float64."""
    matrices = torch.as_tensor(matrices).to(torch.float64)
    products = [matrices[0]]
    for layer in range(1, matrices.shape[0]):
        products.append(matrices[layer] @ products[-1])
    return torch.stack(products)


def gradient_weighted_rollout_reference(model, inputs, attention_mask, target_fn) -> torch.Tensor:
    """Chefer, Gur & Wolf (ICCV 2021) rule 5 + 6: R after each layer, (L, B, n, n).

    R_0 = I; R_l = R_{l-1} + Ā_l R_{l-1}, Ā_l = mean over heads of (∇A_l ⊙ A_l)⁺, where A_l are the
    attention probabilities (post-softmax, B, H, n, n) of layer l and ∇A_l the gradient of
    ``target_fn(output)`` (a (B,) tensor; its sum is differentiated, which gives each example its own
    gradient) w.r.t. A_l, through every later layer. The clamp is applied after the product and
    before the mean over heads, as in the authors' ``avg_heads``. No normalisation of R.
    Padding rows and columns are zeroed (they are exactly 0 anyway for real rows).
    """
    model64 = float64_copy(model)
    output, records, real = recomputed_forward(model64, inputs, attention_mask, requires_grad=True)
    score = target_fn(output)
    if score.dim() != 1 or score.shape[0] != real.shape[0]:
        raise ValueError(f"target_fn must return a (B,) tensor, got shape {tuple(score.shape)}")
    maps = [record["A"] for record in records]
    grads = torch.autograd.grad(score.sum(), maps, allow_unused=True)
    B, n = real.shape
    R = torch.eye(n, dtype=torch.float64).expand(B, n, n)
    out = []
    for A, grad in zip(maps, grads):
        grad = torch.zeros_like(A) if grad is None else grad
        A_bar = (grad * A.detach()).clamp(min=0).mean(dim=1)  # (B, n, n)
        R = R + A_bar @ R
        out.append(_mask_pairs(R, real))
    return torch.stack(out).detach()


def value_zeroing_reference(model, inputs, attention_mask) -> torch.Tensor:
    """Mohebbi et al. (EACL 2023) Value Zeroing, per layer (L, B, n, n).

    For layer l and each token j: layer l is rerun from its original input with token j's value
    vectors (the value projection's output, bias included) set to 0 in every head; attention
    probabilities, queries, keys, residuals and norms unchanged. C_l[i, j] = 1 - cos(x̃_i, x_i),
    x_i the layer's original output (after the feed-forward block and, post-LN, LN2), x̃_i the
    output with token j zeroed (clipped to [0, 2] like the authors' sklearn ``cosine_distances``,
    which only removes rounding: a decoder's i < j get 0). Rows over real tokens are divided by
    their sum (diagonal kept, as in the authors' code); padding rows and columns are 0.
    """
    model64 = float64_copy(model)
    _, records, real = recomputed_forward(model64, inputs, attention_mask)
    B, n = real.shape
    allowed = _allowed_keys(model_kind(model64), real, n)
    out = []
    with torch.no_grad():
        for index, record in enumerate(records):
            original = record["out"]
            C = torch.zeros(B, n, n, dtype=torch.float64)
            for j in range(n):
                zeroed = rerun_layer(model64, index, record, allowed, zero_token=j)["out"]
                cos = (zeroed * original).sum(-1) / (zeroed.norm(dim=-1) * original.norm(dim=-1))
                C[:, :, j] = (1 - cos).clamp(0, 2)  # sklearn's cosine_distances (the authors') clips too
            out.append(_normalise_rows(C, real))
    return torch.stack(out)


def weighted_value_vectors(record) -> torch.Tensor:
    """Σ_h α^h_ij f^h(x_j) (B, n, n, d) of one layer, f^h(x_j) = v^h_j W_O^h (value bias included, b_O not)."""
    A, v, W_O = record["A"], record["v"], record["W_O"]
    B, H, n, _ = A.shape
    weighted = torch.zeros(B, n, n, W_O.shape[-1], dtype=torch.float64)
    for h in range(H):
        f_h = v[:, h] @ W_O[h]  # (B, n, d): f^h(x_j) for every j
        weighted = weighted + A[:, h, :, :, None] * f_h[:, None, :, :]  # [b, i, j] = α^h_ij f^h(x_j)
    return weighted


def transformed_vectors(record) -> torch.Tensor:
    """T_i(x_j) (B, n, n, d) of one layer, before any LayerNorm: Σ_h α^h_ij v^h_j W_O^h + δ_ij x_i.

    v^h_j is the value vector (value bias included; for pre-LN models the input norm is inside it,
    being token-local). The output bias b_O is not in it (ALTI puts it in y_i only)."""
    T = weighted_value_vectors(record)
    x = record.get("residual", record["x"])  # what the attention's output is added to
    for i in range(x.shape[1]):
        T[:, i, i] = T[:, i, i] + x[:, i]
    return T


def alti_reference(model, inputs, attention_mask) -> torch.Tensor:
    """ALTI (Ferrando et al., EMNLP 2022), per-layer normalised contributions (L, B, n, n).

    c_ij = max(0, ‖y_i‖₁ − ‖y_i − T_i(x_j)‖₁) / Σ_k max(0, ‖y_i‖₁ − ‖y_i − T_i(x_k)‖₁),
    over real j, k.

    Post-LN (BERT, RoBERTa, DistilBERT), as in the authors' code: T_i(x_j) is the LayerNorm-linearised
    Σ_h α^h_ij v^h_j W_O^h + δ_ij x_i, i.e. (z − mean(z)) ⊙ γ / s_i with the mean subtracted from each
    vector z separately and s_i = sqrt(var(x_i + attn_out_i) + eps), token i's own statistics of
    its full pre-LN vector (the authors drop eps; negligible at 1e-12); β and b_O are not in T_i;
    y_i is the actual LN1 output (= Σ_j T_i(x_j) + (b_O − mean b_O) ⊙ γ / s_i + β, checked here).
    Pre-LN (GPT-2, agreement, ViT, Llama): T_i(x_j) = Σ_h α^h_ij v^h_j W_O^h + δ_ij x_i (value bias
    and the input norm inside v_j), y_i = x_i + attn_out_i (b_O included), the residual stream
    after attention (the authors' ALTI-logit decomposition; checked Σ_j T_i(x_j) + b_O = y_i).
    Rows are over real tokens; padding rows and columns are 0. A row whose clipped values are all
    0 stays 0.
    """
    model64 = float64_copy(model)
    _, records, real = recomputed_forward(model64, inputs, attention_mask)
    post_ln = model_kind(model64) in POST_LN
    out = []
    with torch.no_grad():
        for record in records:
            T = transformed_vectors(record)
            y = record["mid"]
            if "attention_scale" in record:  # a scale on the attention's output before the residual
                scale = record["attention_scale"]
                T = weighted_value_vectors(record) * scale[:, :, None, :]
                for i in range(T.shape[1]):
                    T[:, i, i] = T[:, i, i] + record["x"][:, i]
                bias_term = record["b_O"] * scale
            elif post_ln:
                gamma, beta, eps = record["ln1"]
                pre = record["pre_ln1"]
                s = torch.sqrt(((pre - pre.mean(-1, keepdim=True)) ** 2).mean(-1) + eps)  # (B, n)
                T = (T - T.mean(-1, keepdim=True)) * gamma / s[:, :, None, None]
                b_O = record["b_O"]
                bias_term = (b_O - b_O.mean())[None, None] * gamma / s[:, :, None] + beta
            else:
                bias_term = record["b_O"]
            reconstruction = T.sum(2) + bias_term
            assert torch.allclose(reconstruction, y, atol=1e-9, rtol=1e-9), "ALTI decomposition does not add up"
            distance = (y[:, :, None, :] - T).abs().sum(-1)  # [b, i, j] = ‖y_i − T_i(x_j)‖₁
            C = (y.abs().sum(-1)[:, :, None] - distance).clamp(min=0)
            out.append(_normalise_rows(C, real))
    return torch.stack(out)


def attention_norm_reference(model, inputs, attention_mask) -> torch.Tensor:
    """Kobayashi et al. (EMNLP 2020) norm-based attention, per layer (L, B, n, n), not normalised.

    N_l[i, j] = ‖Σ_h α^h_ij f^h(x_j)‖₂, f^h(x) = v^h(x) W_O^h with the value bias included and
    the output bias b_O not; for pre-LN models v includes the (token-local) input norm. No
    residual, no LayerNorm. Padding rows and columns are 0.
    """
    model64 = float64_copy(model)
    _, records, real = recomputed_forward(model64, inputs, attention_mask)
    out = []
    with torch.no_grad():
        for record in records:
            N = weighted_value_vectors(record).norm(dim=-1)  # [b, i, j] = ‖Σ_h α^h_ij f^h(x_j)‖₂
            out.append(_mask_pairs(N, real))
    return torch.stack(out)
