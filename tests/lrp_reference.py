"""Slow float64 AttnLRP (Achtibat et al., ICML 2024) for the tests (not a test module): explicit
layer-by-layer relevance propagation written from the paper's rules, no autograd.

Each model is recomputed from its weights, one example at a time on its real tokens only (padding
must change nothing), as a list of nodes in forward order; relevance then flows from the explained
logit (:math:`R = y_t`) back through the nodes in reverse order, each node splitting the relevance
of its output among its inputs by its rule:

* linear map :math:`y = W x + b` (also rotary positions, LayerNorm's centring, the affine parts of
  norms), ε-rule at ε = 0: :math:`R_{x_i} = x_i \\sum_j W_{ji} R_{y_j} / y_j` (b keeps the rest);
* sum :math:`y = \\sum_k a_k` (residuals, embeddings): :math:`R_{a_k} = a_k R_y / y`;
* element-wise activation, the division of a norm by :math:`\\sigma`: identity, :math:`R_x = R_y`;
* element-wise product :math:`\\mathrm{act}(g) \\odot u`: uniform, :math:`R_a = R_b = R_y / 2`;
* attention :math:`O = \\mathrm{softmax}(s q k^\\top + b + M) v`: the sum over keys by the ε-rule on
  the terms :math:`A_{ij} v_{jd}`, each term half to :math:`A_{ij}`, half to :math:`v_{jd}`; the
  softmax by Proposition 3.1, :math:`R_{S_{ij}} = S_{ij}(R_{A_{ij}} - A_{ij} \\sum_k R_{A_{ik}})`;
  :math:`S = s q k^\\top + b` by the ε-rule on its terms :math:`s q_{id} k_{jd}` (each half to q,
  half to k) and the score bias :math:`b_{ij}` (relative positions, ALiBi: a constant, its share
  booked with the position embeddings'); soft-capped scores :math:`c \\tanh(S / c)` (Gemma 2) by the
  identity rule.

Every node also books what its inputs do not receive (:data:`LEDGER` kinds: ``bias``,
``softmax``), and the embedding leaves are ``token`` or ``other`` (position, token type), so
``token + other + bias + softmax = logit``.

Supported: BertForSequenceClassification, RobertaForSequenceClassification (its head's tanh by the
identity rule), GPT2LMHeadModel, LlamaForCausalLM (grouped-query heads, default rotary, with or
without biases), ViTForImageClassification; the families whose attention runs in their own
modules, DebertaV2ForSequenceClassification (content-to-position and position-to-content terms),
MPNetForSequenceClassification (relative position bias), BloomForCausalLM and FalconForCausalLM
(ALiBi, or Falcon's rotary positions); Gemma2ForCausalLM (soft-capping in the attention and on the
logits); T5ForConditionalGeneration (:func:`seq2seq_attnlrp_reference`: two token leaves, the
cross-attention by the attention's rules, its relative position bias a term of the scores).
"""

from __future__ import annotations

import copy
import math

import torch

LEDGER = ("token", "other", "bias", "softmax")


def _ratio(r, y):
    return torch.where(y == 0, torch.zeros_like(r), r / torch.where(y == 0, torch.ones_like(y), y))


class _Tape:
    """Nodes in forward order: ``(value, parents, rule)``, rule(R_out) -> R of each parent."""

    def __init__(self):
        self.values, self.parents, self.rules, self.kinds = [], [], [], []
        self.ledger_bias, self.ledger_softmax, self.ledger_other = [], [], []

    def node(self, value, parents=(), rule=None, kind=None):
        self.values.append(value)
        self.parents.append(tuple(parents))
        self.rules.append(rule)
        self.kinds.append(kind)
        return len(self.values) - 1

    def v(self, i):
        return self.values[i]

    # ----- operations, each with its rule
    def leaf(self, value, kind):
        return self.node(value, kind=kind)

    def linear(self, x, weight, bias=None):
        """y = x Wᵀ + b over the last axis (weight (out, in) as nn.Linear stores it)."""
        X = self.v(x)
        y = X @ weight.T + (0 if bias is None else bias)
        return self.node(y, [x], lambda R: self._booked(R, [X * (_ratio(R, y) @ weight)]))

    def _booked(self, R, shares):
        """The shares, what they leave of R booked as the biases'."""
        self.ledger_bias.append(float(R.sum() - sum(share.sum() for share in shares)))
        return shares

    def add(self, *xs):
        Xs = [self.v(x) for x in xs]
        y = sum(Xs)
        return self.node(y, xs, lambda R: [X * _ratio(R, y) for X in Xs])

    def identity(self, x, f):
        return self.node(f(self.v(x)), [x], lambda R: [R])

    def product(self, a, b):
        return self.node(self.v(a) * self.v(b), [a, b], lambda R: [R / 2, R / 2])

    def take(self, x, index):
        """Row(s) ``index`` of the first axis (a token), the others get no relevance."""
        X = self.v(x)

        def rule(R):
            out = torch.zeros_like(X)
            out[index] = R
            return [out]

        return self.node(X[index], [x], rule)

    def layer_norm(self, x, norm):
        centred_value = self.v(x) - self.v(x).mean(-1, keepdim=True)
        X = self.v(x)
        # the centring, a linear map without bias: R_x = x ⊙ Cᵀ(R_c / c), C = I - 1/D
        def centring(R):
            share = _ratio(R, centred_value)
            return [X * (share - share.mean(-1, keepdim=True))]

        c = self.node(centred_value, [x], centring)
        sigma = torch.sqrt((centred_value**2).mean(-1, keepdim=True) + norm.eps)
        n = self.identity(c, lambda value: value / sigma)
        return self.affine(n, norm.weight, norm.bias)

    def rms_norm(self, x, norm):
        X = self.v(x)
        rms = torch.sqrt((X**2).mean(-1, keepdim=True) + norm.variance_epsilon)
        n = self.identity(x, lambda value: value / rms)
        return self.affine(n, norm.weight, None)

    def affine(self, x, weight, bias):
        X = self.v(x)
        scaled = X * weight
        y = scaled + (0 if bias is None else bias)
        return self.node(y, [x], lambda R: self._booked(R, [scaled * _ratio(R, y)]))

    def rotary(self, x, heads, positions, theta):
        """Llama's rotary positions on (n, heads * d): y = x cos + rotate_half(x) sin, linear in x."""
        X = self.v(x)
        n = X.shape[0]
        d = X.shape[1] // heads
        inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
        angles = positions[:, None].double() * inv[None]
        cos = torch.cos(torch.cat([angles, angles], -1))[:, None]  # (n, 1, d)
        sin = torch.sin(torch.cat([angles, angles], -1))[:, None]
        h = X.reshape(n, heads, d)

        def rotate(u):
            return torch.cat([-u[..., d // 2 :], u[..., : d // 2]], -1)

        def rotate_transposed(u):
            return torch.cat([u[..., d // 2 :], -u[..., : d // 2]], -1)

        y = (h * cos + rotate(h) * sin).reshape(n, heads * d)

        def rule(R):
            g = _ratio(R, y).reshape(n, heads, d)
            return [X * (g * cos + rotate_transposed(g * sin)).reshape(n, heads * d)]

        return self.node(y, [x], rule)

    def attention(self, q, k, v, heads, kv_heads, allowed, scale, bias=None, softcap=None):
        """Multi-head attention of (n, heads*d) queries over (m, kv_heads*d) keys and values;
        ``allowed`` (n, m), ``bias`` (H, n, m) added to the scores, ``softcap`` c: the scores
        capped to c tanh(S / c)."""
        Q, K, V = self.v(q), self.v(k), self.v(v)
        n, m = Q.shape[0], K.shape[0]
        d = Q.shape[1] // heads
        group = heads // kv_heads
        Qh = Q.reshape(n, heads, d).transpose(0, 1)
        Kh = K.reshape(m, kv_heads, d).transpose(0, 1)[torch.arange(heads) // group]
        Vh = V.reshape(m, kv_heads, d).transpose(0, 1)[torch.arange(heads) // group]
        bias = torch.zeros(heads, n, m, dtype=Q.dtype) if bias is None else bias.expand(heads, n, m)
        S = scale * Qh @ Kh.transpose(1, 2) + bias  # (H, n, m)
        capped = S if softcap is None else softcap * torch.tanh(S / softcap)
        A = torch.softmax(capped.masked_fill(~allowed, float("-inf")), -1)
        O = A @ Vh  # (H, n, d)
        y = O.transpose(0, 1).reshape(n, heads * d)
        ledger, ledger_other = self.ledger_softmax, self.ledger_other

        def rule(R):
            RO = R.reshape(n, heads, d).transpose(0, 1)
            terms = A[..., None] * Vh[:, None] * _ratio(RO, O)[:, :, None]  # (H, i, j, d): A_ij v_jd R_id / O_id
            RA = 0.5 * terms.sum(-1)
            RV = 0.5 * terms.sum(1)
            # the softmax's rule on the capped scores; the cap's identity rule hands it on to S as it is
            RS = torch.where(allowed, capped * (RA - A * RA.sum(-1, keepdim=True)), torch.zeros_like(S))
            ledger.append(float(RA.sum() - RS.sum()))
            ledger_other.append(float((bias * _ratio(RS, S)).sum()))
            qk = scale * Qh[:, :, None] * Kh[:, None] * _ratio(RS, S)[..., None]  # (H, i, j, d)
            RQ = 0.5 * qk.sum(2)
            RK = 0.5 * qk.sum(1)
            fold = lambda Rh: Rh.reshape(kv_heads, group, m, d).sum(1).transpose(0, 1).reshape(m, kv_heads * d)
            return [RQ.transpose(0, 1).reshape(n, heads * d), fold(RK), fold(RV)]

        return self.node(y, [q, k, v], rule)

    # ----- relevance
    def relevance(self, output):
        """Propagate R = value of node ``output`` (a scalar) back; returns (R of every node, ledger)."""
        R = [None] * len(self.values)
        R[output] = self.values[output].clone()
        for i in range(output, -1, -1):
            if R[i] is None or self.rules[i] is None:
                continue
            for parent, share in zip(self.parents[i], self.rules[i](R[i])):
                R[parent] = share if R[parent] is None else R[parent] + share
        return R


def _bert(model, ids):
    """BERT, or RoBERTa (positions counted from its pad id + 1, its head dense -> tanh -> out_proj)."""
    roberta = model.config.model_type == "roberta"
    bert, config = model.base_model, model.config
    n = ids.shape[0]
    tape = _Tape()
    token = tape.leaf(bert.embeddings.word_embeddings.weight[ids], "token")
    first = config.pad_token_id + 1 if roberta else 0
    position = tape.leaf(bert.embeddings.position_embeddings.weight[first : first + n], "other")
    kind = tape.leaf(bert.embeddings.token_type_embeddings.weight[torch.zeros(n, dtype=torch.long)], "other")
    h = tape.layer_norm(tape.add(token, position, kind), bert.embeddings.LayerNorm)
    allowed = torch.ones(n, n, dtype=torch.bool)
    heads = config.num_attention_heads
    for layer in bert.encoder.layer:
        att = layer.attention.self
        q, k, v = (tape.linear(h, m.weight, m.bias) for m in (att.query, att.key, att.value))
        scale = 1.0 / math.sqrt(config.hidden_size // heads)
        context = tape.attention(q, k, v, heads, heads, allowed, scale)
        out = layer.attention.output
        h = tape.layer_norm(tape.add(tape.linear(context, out.dense.weight, out.dense.bias), h), out.LayerNorm)
        inner = tape.identity(tape.linear(h, layer.intermediate.dense.weight, layer.intermediate.dense.bias),
                              layer.intermediate.intermediate_act_fn)
        h = tape.layer_norm(tape.add(tape.linear(inner, layer.output.dense.weight, layer.output.dense.bias), h),
                            layer.output.LayerNorm)
    if roberta:
        head = model.classifier
        pooled = tape.identity(tape.linear(tape.take(h, 0), head.dense.weight, head.dense.bias), torch.tanh)
        return tape, tape.linear(pooled, head.out_proj.weight, head.out_proj.bias)
    pooled = tape.identity(tape.linear(tape.take(h, 0), bert.pooler.dense.weight, bert.pooler.dense.bias), torch.tanh)
    logits = tape.linear(pooled, model.classifier.weight, model.classifier.bias)
    return tape, logits


def _gpt2(model, ids, position):
    gpt, config = model.transformer, model.config
    n = ids.shape[0]
    tape = _Tape()
    token = tape.leaf(gpt.wte.weight[ids], "token")
    h = tape.add(token, tape.leaf(gpt.wpe.weight[:n], "other"))
    allowed = torch.ones(n, n, dtype=torch.bool).tril()
    heads = config.n_head
    D = config.n_embd
    for block in gpt.h:
        a = tape.layer_norm(h, block.ln_1)
        weight, bias = block.attn.c_attn.weight.T, block.attn.c_attn.bias  # Conv1D stores (in, out)
        q, k, v = (tape.linear(a, weight[i * D : (i + 1) * D], bias[i * D : (i + 1) * D]) for i in range(3))
        context = tape.attention(q, k, v, heads, heads, allowed, 1.0 / math.sqrt(D // heads))
        h = tape.add(h, tape.linear(context, block.attn.c_proj.weight.T, block.attn.c_proj.bias))
        m = tape.layer_norm(h, block.ln_2)
        inner = tape.identity(tape.linear(m, block.mlp.c_fc.weight.T, block.mlp.c_fc.bias), block.mlp.act)
        h = tape.add(h, tape.linear(inner, block.mlp.c_proj.weight.T, block.mlp.c_proj.bias))
    h = tape.layer_norm(h, gpt.ln_f)
    return tape, tape.linear(tape.take(h, position), model.lm_head.weight)


def _llama(model, ids, position):
    base, config = model.model, model.config
    n = ids.shape[0]
    tape = _Tape()
    h = tape.leaf(base.embed_tokens.weight[ids], "token")
    allowed = torch.ones(n, n, dtype=torch.bool).tril()
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    theta = config.rope_parameters["rope_theta"]
    positions = torch.arange(n)
    for layer in base.layers:
        att = layer.self_attn
        a = tape.rms_norm(h, layer.input_layernorm)
        q = tape.rotary(tape.linear(a, att.q_proj.weight, att.q_proj.bias), heads, positions, theta)
        k = tape.rotary(tape.linear(a, att.k_proj.weight, att.k_proj.bias), kv_heads, positions, theta)
        v = tape.linear(a, att.v_proj.weight, att.v_proj.bias)
        context = tape.attention(q, k, v, heads, kv_heads, allowed, att.head_dim**-0.5)
        h = tape.add(h, tape.linear(context, att.o_proj.weight, att.o_proj.bias))
        m = tape.rms_norm(h, layer.post_attention_layernorm)
        mlp = layer.mlp
        gate = tape.identity(tape.linear(m, mlp.gate_proj.weight, mlp.gate_proj.bias), mlp.act_fn)
        up = tape.linear(m, mlp.up_proj.weight, mlp.up_proj.bias)
        h = tape.add(h, tape.linear(tape.product(gate, up), mlp.down_proj.weight, mlp.down_proj.bias))
    h = tape.rms_norm(h, base.norm)
    return tape, tape.linear(tape.take(h, position), model.lm_head.weight)


def _vit(model, pixels):
    vit, config = model.vit, model.config
    tape = _Tape()
    patches = vit.embeddings.patch_embeddings(pixels[None])[0]  # the patch embeddings: the leaf's values
    token = tape.leaf(torch.cat([vit.embeddings.cls_token[0], patches]), "token")
    h = tape.add(token, tape.leaf(vit.embeddings.position_embeddings[0], "other"))
    n = patches.shape[0] + 1
    allowed = torch.ones(n, n, dtype=torch.bool)
    heads = config.num_attention_heads
    for layer in vit.layers:
        att = layer.attention
        a = tape.layer_norm(h, layer.layernorm_before)
        q, k, v = (tape.linear(a, m.weight, m.bias) for m in (att.q_proj, att.k_proj, att.v_proj))
        context = tape.attention(q, k, v, heads, heads, allowed, 1.0 / math.sqrt(config.hidden_size // heads))
        h = tape.add(h, tape.linear(context, att.o_proj.weight, att.o_proj.bias))
        m = tape.layer_norm(h, layer.layernorm_after)
        inner = tape.identity(tape.linear(m, layer.mlp.fc1.weight, layer.mlp.fc1.bias), layer.mlp.activation_fn)
        h = tape.add(h, tape.linear(inner, layer.mlp.fc2.weight, layer.mlp.fc2.bias))
    h = tape.layer_norm(h, vit.layernorm)
    return tape, tape.linear(tape.take(h, 0), model.classifier.weight, model.classifier.bias)


def _post_ln_layers(tape, h, layers, heads, attention_of):
    """BERT-style post-LN blocks: ``attention_of(layer, h)`` -> (q, k, v, out, bias (H, n, n), scale)."""
    n = tape.v(h).shape[0]
    allowed = torch.ones(n, n, dtype=torch.bool)
    for layer in layers:
        q, k, v, out, norm, bias, scale = attention_of(layer, h)
        context = tape.attention(q, k, v, heads, heads, allowed, scale, bias)
        h = tape.layer_norm(tape.add(tape.linear(context, out.weight, out.bias), h), norm)
        inner = tape.identity(tape.linear(h, layer.intermediate.dense.weight, layer.intermediate.dense.bias),
                              layer.intermediate.intermediate_act_fn)
        h = tape.layer_norm(tape.add(tape.linear(inner, layer.output.dense.weight, layer.output.dense.bias), h),
                            layer.output.LayerNorm)
    return h


def _deberta(model, ids):
    """DeBERTa-v3 (no absolute positions or token types): its scores' content-to-position and
    position-to-content terms, q_i · k^r_δ + k_j · q^r_δ with δ = span + i - j, a bias."""
    deberta, config = model.deberta, model.config
    tape, n, heads = _Tape(), ids.shape[0], config.num_attention_heads
    h = tape.layer_norm(tape.leaf(deberta.embeddings.word_embeddings.weight[ids], "token"), deberta.embeddings.LayerNorm)
    encoder = deberta.encoder
    span = config.position_buckets
    assert n < span // 2 and config.share_att_key, "written for the buckets of short inputs, shared projections"
    table = encoder.LayerNorm(encoder.rel_embeddings.weight[: 2 * span])
    delta = (torch.arange(n)[:, None] - torch.arange(n)[None] + span).clamp(0, 2 * span - 1)

    def attention_of(layer, h):
        att = layer.attention.self
        q, k, v = (tape.linear(h, m.weight, m.bias) for m in (att.query_proj, att.key_proj, att.value_proj))
        scale = 1.0 / math.sqrt(att.attention_head_size * (1 + len(config.pos_att_type)))
        split = lambda x: x.reshape(x.shape[0], heads, -1)  # (·, H, dh)
        rel_k, rel_q = split(att.key_proj(table)), split(att.query_proj(table))
        Q, K = split(tape.v(q)), split(tape.v(k))
        bias = scale * (torch.einsum("ihc,ijhc->hij", Q, rel_k[delta]) + torch.einsum("jhc,ijhc->hij", K, rel_q[delta]))
        return q, k, v, layer.attention.output.dense, layer.attention.output.LayerNorm, bias, scale

    h = _post_ln_layers(tape, h, encoder.layer, heads, attention_of)
    pooled = tape.identity(tape.linear(tape.take(h, 0), model.pooler.dense.weight, model.pooler.dense.bias),
                           torch.nn.functional.gelu)
    return tape, tape.linear(pooled, model.classifier.weight, model.classifier.bias)


def _mpnet(model, ids):
    """MPNet: positions from 2 (after its pad id 1), a learned bias per head and relative position
    bucket, 16 [j > i] + |i - j| below 8."""
    mpnet, config = model.mpnet, model.config
    tape, n, heads = _Tape(), ids.shape[0], config.num_attention_heads
    assert n <= 8, "written for distances below 8, each its own bucket"
    token = tape.leaf(mpnet.embeddings.word_embeddings.weight[ids], "token")
    position = tape.leaf(mpnet.embeddings.position_embeddings.weight[2 : 2 + n], "other")
    h = tape.layer_norm(tape.add(token, position), mpnet.embeddings.LayerNorm)
    i, j = torch.arange(n)[:, None], torch.arange(n)[None]
    bias = mpnet.encoder.relative_attention_bias.weight[16 * (j > i).long() + (i - j).abs()].permute(2, 0, 1)

    def attention_of(layer, h):
        att = layer.attention.attn
        q, k, v = (tape.linear(h, m.weight, m.bias) for m in (att.q, att.k, att.v))
        return q, k, v, att.o, layer.attention.LayerNorm, bias, 1.0 / math.sqrt(att.attention_head_size)

    h = _post_ln_layers(tape, h, mpnet.encoder.layer, heads, attention_of)
    head = model.classifier
    pooled = tape.identity(tape.linear(tape.take(h, 0), head.dense.weight, head.dense.bias), torch.tanh)
    return tape, tape.linear(pooled, head.out_proj.weight, head.out_proj.bias)


def _alibi(heads, n):
    """(H, 1, n) ALiBi: head h's slope 2^(-8 h / H) times the key's position (H a power of 2)."""
    slopes = 2.0 ** (-8.0 * torch.arange(1, heads + 1, dtype=torch.float64) / heads)
    return slopes[:, None, None] * torch.arange(n, dtype=torch.float64)


def _rows(linear, rows):
    """(weight, bias) of the output channels ``rows`` of a linear layer."""
    return linear.weight[rows], None if linear.bias is None else linear.bias[rows]


def _bloom(model, ids, position):
    """BLOOM: a fused (H, 3, dh) projection, ALiBi, BloomGelu by the identity rule."""
    bloom, config = model.transformer, model.config
    tape, n, heads = _Tape(), ids.shape[0], config.n_head
    h = tape.layer_norm(tape.leaf(bloom.word_embeddings.weight[ids], "token"), bloom.word_embeddings_layernorm)
    allowed = torch.ones(n, n, dtype=torch.bool).tril()
    channels = torch.arange(3 * config.hidden_size).view(heads, 3, -1)
    for block in bloom.h:
        att = block.self_attention
        a = tape.layer_norm(h, block.input_layernorm)
        q, k, v = (tape.linear(a, *_rows(att.query_key_value, channels[:, i].flatten())) for i in range(3))
        scale = 1.0 / math.sqrt(config.hidden_size // heads)
        context = tape.attention(q, k, v, heads, heads, allowed, scale, _alibi(heads, n))
        h = tape.add(h, tape.linear(context, att.dense.weight, att.dense.bias))
        m = tape.layer_norm(h, block.post_attention_layernorm)
        inner = tape.identity(tape.linear(m, block.mlp.dense_h_to_4h.weight, block.mlp.dense_h_to_4h.bias),
                              block.mlp.gelu_impl)
        h = tape.add(h, tape.linear(inner, block.mlp.dense_4h_to_h.weight, block.mlp.dense_4h_to_h.bias))
    h = tape.layer_norm(h, bloom.ln_f)
    return tape, tape.linear(tape.take(h, position), model.lm_head.weight)


def _falcon(model, ids, position):
    """Falcon: the new decoder architecture's fused projection (per key head: its queries, then key
    and value) with ALiBi and two norms, or the multi-query one (all queries, one key, one value)
    with rotary positions and one norm; the feed-forward beside the attention."""
    falcon, config = model.transformer, model.config
    tape, n, heads = _Tape(), ids.shape[0], config.num_attention_heads
    h = tape.leaf(falcon.word_embeddings.weight[ids], "token")
    allowed = torch.ones(n, n, dtype=torch.bool).tril()
    dh = config.hidden_size // heads
    kv = config.num_kv_heads if config.new_decoder_architecture else 1
    if config.new_decoder_architecture:
        grouped = torch.arange((heads + 2 * kv) * dh).view(kv, heads // kv + 2, dh)
        rows = grouped[:, :-2].flatten(), grouped[:, -2].flatten(), grouped[:, -1].flatten()
    else:
        rows = torch.arange(heads * dh), torch.arange(heads * dh, (heads + 1) * dh), torch.arange((heads + 1) * dh, (heads + 2) * dh)
    for block in falcon.h:
        att = block.self_attention
        a = tape.layer_norm(h, block.ln_attn if hasattr(block, "ln_attn") else block.input_layernorm)
        q, k, v = (tape.linear(a, *_rows(att.query_key_value, r)) for r in rows)
        bias = _alibi(heads, n) / math.sqrt(dh) if config.alibi else None
        if not config.alibi:
            theta = config.rope_parameters["rope_theta"]
            q, k = tape.rotary(q, heads, torch.arange(n), theta), tape.rotary(k, kv, torch.arange(n), theta)
        context = tape.attention(q, k, v, heads, kv, allowed, 1.0 / math.sqrt(dh), bias)
        m = tape.layer_norm(h, block.ln_mlp) if hasattr(block, "ln_mlp") else a
        mlp = block.mlp
        inner = tape.identity(tape.linear(m, mlp.dense_h_to_4h.weight, mlp.dense_h_to_4h.bias), mlp.act)
        h = tape.add(h, tape.linear(context, att.dense.weight, att.dense.bias),
                     tape.linear(inner, mlp.dense_4h_to_h.weight, mlp.dense_4h_to_h.bias))
    h = tape.layer_norm(h, falcon.ln_f)
    return tape, tape.linear(tape.take(h, position), model.lm_head.weight)


def _gemma2(model, ids, position):
    """Gemma 2: embeddings times sqrt(D), RMS norms scaling by 1 + w around the attention and the
    gated feed-forward, local layers attending to the last ``sliding_window`` tokens, the scores
    and the logits soft-capped (the identity rule)."""
    base, config = model.model, model.config
    tape, n = _Tape(), ids.shape[0]
    token = tape.leaf(base.embed_tokens.weight[ids], "token")
    h = tape.affine(token, torch.full((config.hidden_size,), config.hidden_size**0.5, dtype=torch.float64), None)

    def norm(x, module):
        X = tape.v(x)
        rms = torch.sqrt((X**2).mean(-1, keepdim=True) + module.eps)
        return tape.affine(tape.identity(x, lambda value: value / rms), 1 + module.weight, None)

    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    local = causal & (torch.arange(n)[:, None] - torch.arange(n)[None] < config.sliding_window)
    theta = config.rope_parameters["rope_theta"]
    for layer, kind in zip(base.layers, config.layer_types):
        att = layer.self_attn
        a = norm(h, layer.input_layernorm)
        q = tape.rotary(tape.linear(a, att.q_proj.weight, att.q_proj.bias), heads, torch.arange(n), theta)
        k = tape.rotary(tape.linear(a, att.k_proj.weight, att.k_proj.bias), kv_heads, torch.arange(n), theta)
        v = tape.linear(a, att.v_proj.weight, att.v_proj.bias)
        context = tape.attention(q, k, v, heads, kv_heads, local if kind == "sliding_attention" else causal,
                                 config.query_pre_attn_scalar**-0.5, softcap=config.attn_logit_softcapping)
        h = tape.add(h, norm(tape.linear(context, att.o_proj.weight, att.o_proj.bias), layer.post_attention_layernorm))
        m = norm(h, layer.pre_feedforward_layernorm)
        mlp = layer.mlp
        gate = tape.identity(tape.linear(m, mlp.gate_proj.weight), mlp.act_fn)
        inner = tape.linear(tape.product(gate, tape.linear(m, mlp.up_proj.weight)), mlp.down_proj.weight)
        h = tape.add(h, norm(inner, layer.post_feedforward_layernorm))
    logits = tape.linear(tape.take(norm(h, base.norm), position), model.lm_head.weight)
    cap = config.final_logit_softcapping
    return tape, tape.identity(logits, lambda value: cap * torch.tanh(value / cap))


def _vision_tower(model, pixels, feature):
    """A vision tower's pooled output, feature ``feature``: DINOv2 (class token, layer scales; the
    final norm's class row), CLIP (class embedding, a norm before the layers; the class row
    normed), SigLIP (no class token; all rows normed, then the pooling head: a learned probe's
    attention over them, a relevance sink, and a feed-forward, residual)."""
    kind = model.config.model_type
    tower = model
    embeddings = tower.embeddings
    tape = _Tape()
    if kind == "dinov2":
        patches = embeddings.patch_embeddings(pixels[None])[0]
        token = tape.leaf(torch.cat([embeddings.cls_token[0], patches]), "token")
        position = embeddings.position_embeddings[0]
    else:
        patches = embeddings.patch_embedding(pixels[None])[0].flatten(1).T  # (h w, D)
        classes = [embeddings.class_embedding[None]] if kind == "clip_vision_model" else []
        token = tape.leaf(torch.cat([*classes, patches]), "token")
        position = embeddings.position_embedding.weight
    h = tape.add(token, tape.leaf(position, "other"))
    if kind == "clip_vision_model":
        h = tape.layer_norm(h, tower.pre_layrnorm)
    n, heads = tape.v(h).shape[0], model.config.num_attention_heads
    allowed = torch.ones(n, n, dtype=torch.bool)
    layers = tower.encoder.layer if kind == "dinov2" else tower.encoder.layers
    for layer in layers:
        dinov2 = kind == "dinov2"
        att = layer.attention if dinov2 else layer.self_attn
        a = tape.layer_norm(h, layer.norm1 if dinov2 else layer.layer_norm1)
        q, k, v = (tape.linear(a, m.weight, m.bias) for m in (att.q_proj, att.k_proj, att.v_proj))
        context = tape.attention(q, k, v, heads, heads, allowed, (model.config.hidden_size // heads) ** -0.5)
        out = att.o_proj if dinov2 else att.out_proj
        attention = tape.linear(context, out.weight, out.bias)
        h = tape.add(h, tape.affine(attention, layer.layer_scale1.lambda1, None) if dinov2 else attention)
        m = tape.layer_norm(h, layer.norm2 if dinov2 else layer.layer_norm2)
        mlp = layer.mlp
        inner = tape.identity(tape.linear(m, mlp.fc1.weight, mlp.fc1.bias), mlp.activation_fn)
        inner = tape.linear(inner, mlp.fc2.weight, mlp.fc2.bias)
        h = tape.add(h, tape.affine(inner, layer.layer_scale2.lambda1, None) if dinov2 else inner)
    if kind == "dinov2":
        pooled = tape.take(tape.layer_norm(h, model.layernorm), 0)
    elif kind == "clip_vision_model":
        pooled = tape.layer_norm(tape.take(h, 0), tower.post_layernorm)
    else:
        h = tape.layer_norm(h, tower.post_layernorm)
        head = tower.head
        attention = head.attention
        weights, biases = attention.in_proj_weight.chunk(3), attention.in_proj_bias.chunk(3)
        probe = tape.node(head.probe[0])  # a parameter: the relevance it receives stops there
        q = tape.linear(probe, weights[0], biases[0])
        k, v = (tape.linear(h, w, b) for w, b in zip(weights[1:], biases[1:]))
        context = tape.attention(q, k, v, heads, heads, torch.ones(1, n, dtype=torch.bool), attention.head_dim**-0.5)
        h = tape.linear(context, attention.out_proj.weight, attention.out_proj.bias)
        m = tape.layer_norm(h, head.layernorm)
        mlp = head.mlp
        inner = tape.identity(tape.linear(m, mlp.fc1.weight, mlp.fc1.bias), mlp.activation_fn)
        pooled = tape.take(tape.add(h, tape.linear(inner, mlp.fc2.weight, mlp.fc2.bias)), 0)
    return tape, tape.take(pooled, feature)


VISION_TOWERS = ("dinov2", "clip_vision_model", "siglip_vision_model")
ENCODERS = {"bert": _bert, "roberta": _bert, "deberta-v2": _deberta, "mpnet": _mpnet}
DECODERS = {"gpt2": _gpt2, "llama": _llama, "bloom": _bloom, "falcon": _falcon, "gemma2": _gemma2}


def _t5_stack(tape, stack, h, heads, causal, encoder=None):
    """A T5 stack's blocks and final norm on the tape, from its embedded tokens ``h``; a decoder
    (``encoder`` the encoder output's node) with its cross-attention over the encoder's outputs."""
    n = tape.v(h).shape[0]
    allowed = torch.ones(n, n, dtype=torch.bool)
    allowed = allowed.tril() if causal else allowed
    bias = stack.block[0].layer[0].SelfAttention.compute_bias(n, n)[0]
    for block in stack.block:
        layer = block.layer
        att = layer[0].SelfAttention
        a = tape.rms_norm(h, layer[0].layer_norm)
        q, k, v = (tape.linear(a, m.weight) for m in (att.q, att.k, att.v))
        h = tape.add(h, tape.linear(tape.attention(q, k, v, heads, heads, allowed, 1.0, bias), att.o.weight))
        if encoder is not None:
            att = layer[1].EncDecAttention
            a = tape.rms_norm(h, layer[1].layer_norm)
            q = tape.linear(a, att.q.weight)
            k, v = tape.linear(encoder, att.k.weight), tape.linear(encoder, att.v.weight)
            every = torch.ones(n, tape.v(encoder).shape[0], dtype=torch.bool)
            h = tape.add(h, tape.linear(tape.attention(q, k, v, heads, heads, every, 1.0), att.o.weight))
        feed = layer[-1].DenseReluDense
        m = tape.rms_norm(h, layer[-1].layer_norm)
        if hasattr(feed, "wi_1"):  # gated: act(wi_0 x) * wi_1 x
            inner = tape.product(tape.identity(tape.linear(m, feed.wi_0.weight), feed.act), tape.linear(m, feed.wi_1.weight))
        else:
            inner = tape.identity(tape.linear(m, feed.wi.weight), feed.act)
        h = tape.add(h, tape.linear(inner, feed.wo.weight))
    return tape.rms_norm(h, stack.final_layer_norm)


def _t5(model, source, decoder_inputs, position):
    """T5ForConditionalGeneration: the source and the decoder's inputs two token leaves (returned
    as the tape's nodes 0 and 1), the decoder's output at ``position`` through the LM head."""
    tape = _Tape()
    table = model.shared.weight
    source_leaf = tape.leaf(table[source], "token")
    target_leaf = tape.leaf(table[decoder_inputs], "token")
    heads = model.config.num_heads
    encoder = _t5_stack(tape, model.encoder, source_leaf, heads, causal=False)
    h = _t5_stack(tape, model.decoder, target_leaf, heads, causal=True, encoder=encoder)
    if model.config.tie_word_embeddings:  # the output rescaled before the tied head: a linear map
        h = tape.identity(h, lambda value: value * model.config.d_model**-0.5)
    return tape, tape.linear(tape.take(h, position), model.lm_head.weight)


def seq2seq_attnlrp_reference(model, source, decoder_inputs, target, attention_mask=None, decoder_attention_mask=None):
    """AttnLRP relevance of each decoder position of a T5ForConditionalGeneration over the source
    tokens and the decoder's inputs, (B, m, n_s + m) float64 (padding 0), each position for the
    logit of ``target[:, t]``; and per example and position the ledger (as :func:`attnlrp_reference`)."""
    model64 = copy.deepcopy(model).double().eval()
    batch, n_s = source.shape
    m = decoder_inputs.shape[1]
    rows = torch.zeros(batch, m, n_s + m, dtype=torch.float64)
    ledgers = []
    with torch.no_grad():
        for b in range(batch):
            real_s = torch.arange(n_s) if attention_mask is None else attention_mask[b].nonzero().flatten()
            real_t = torch.arange(m) if decoder_attention_mask is None else decoder_attention_mask[b].nonzero().flatten()
            for where, t in enumerate(real_t.tolist()):
                tape, logits = _t5(model64, source[b, real_s], decoder_inputs[b, real_t], where)
                explained = tape.take(logits, int(target[b, t]))
                R = tape.relevance(explained)
                rows[b, t, real_s] = R[0].sum(-1)
                rows[b, t, n_s + real_t] = R[1].sum(-1)
                ledgers.append({"token": float(R[0].sum() + R[1].sum()), "bias": sum(tape.ledger_bias),
                                "softmax": sum(tape.ledger_softmax), "other": sum(tape.ledger_other),
                                "logit": float(tape.v(explained))})
    return rows, ledgers


def attnlrp_reference(model, inputs, target, attention_mask=None, position=None):
    """AttnLRP relevance of every input token, float64 (B, n), and each example's ledger.

    Args:
        model: one of the supported models (copied to float64 here).
        inputs: (B, n) token ids, padded on either side, or (B, C, H, W) pixels.
        target: (B,) the explained class or token.
        attention_mask: (B, n) or None.
        position: (B,) the predicting position of a language model, in ``inputs``' columns.

    Returns:
        ``(relevance (B, n), ledger)``: padding 0; ``ledger[b]`` maps :data:`LEDGER` kinds and
        ``"logit"`` to floats with ``token + other + bias + softmax = logit``.
    """
    model64 = copy.deepcopy(model).double().eval()
    kind = model.config.model_type
    rows, ledgers = [], []
    with torch.no_grad():
        for b in range(inputs.shape[0]):
            if kind == "vit":
                tape, logits = _vit(model64, inputs[b].double())
                real = torch.arange(tape.v(0).shape[0])
            elif kind in VISION_TOWERS:  # the pooled output's feature ``target``
                tape, explained = _vision_tower(model64, inputs[b].double(), int(target[b]))
                real = torch.arange(tape.v(0).shape[0])
            else:
                real = torch.arange(inputs.shape[1]) if attention_mask is None else attention_mask[b].nonzero().flatten()
                ids = inputs[b, real]
                if kind in ENCODERS:
                    tape, logits = ENCODERS[kind](model64, ids)
                else:
                    where = int((real == int(position[b])).nonzero())
                    tape, logits = DECODERS[kind](model64, ids, where)
            if kind not in VISION_TOWERS:
                explained = tape.take(logits, int(target[b]))
            R = tape.relevance(explained)
            width = tape.v(0).shape[0] if kind == "vit" or kind in VISION_TOWERS else inputs.shape[1]
            row = torch.zeros(width, dtype=torch.float64)
            ledger = {name: 0.0 for name in LEDGER}
            for node, node_kind in enumerate(tape.kinds):
                if node_kind is not None and R[node] is not None:
                    ledger[node_kind] += float(R[node].sum())
                    if node_kind == "token":
                        row[real] = R[node].sum(-1)
            ledger["softmax"] = sum(tape.ledger_softmax)
            ledger["other"] += sum(tape.ledger_other)
            ledger["logit"] = float(tape.v(explained))
            ledger["bias"] = sum(tape.ledger_bias)
            rows.append(row)
            ledgers.append(ledger)
    return torch.stack(rows), ledgers
