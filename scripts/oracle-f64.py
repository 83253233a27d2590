#!/usr/bin/env python3
"""The cpu reference's own oracle: an exact float64 forward pass in NumPy.

For each llama.cpp fixture (tests/fixtures/oracle-gemma3*.json from
scripts/gen-oracle-fixture.py, arch-NAME.json from scripts/gen-arch-fixtures.py)
this runs the model of that fixture on the fixture's own token ids (the
prompt followed by llama.cpp's greedy tokens, teacher-forced: one causal pass
over the whole sequence is the prefill and the decode steps at once) in
float64 throughout, the weights dequantised by gguf-py's NumPy dequantizers,
and writes tests/fixtures/oracle-f64-NAME.json and .bin:
  - .bin: the final hidden state (after output_norm, the LM head's input) of
    every recorded row, float32 little-endian, row-major. tests/test_oracle.c
    rebuilds the exact logits from it as W h in double (float32 storage
    moves 1 - cosine by about 1e-15, far under the test's 1e-9);
  - .json: per case the ids and, per row, the exact top-8 logits (float64),
    the top-2 margin and the sum of squares of the exact logits, so the test
    can check that its rebuild is the exact result.
The text-to-ids step is llama.cpp's (the ids come from its fixtures), so
this script needs no tokenizer.

Formulas: llama.cpp's graphs (src/models/llama.cpp, qwen2.cpp, qwen3.cpp,
gemma3.cpp, qwen35.cpp with delta-net-base.cpp, qwen3moe.cpp with
llama-graph.cpp's build_moe_ffn) and ggml's ops (rope_yarn, rms_norm,
l2_norm, ssm_conv, gated_delta_net, soft_max, top_k, mul_mat_id), computed
in float64 with no quantised activations and an exact (float64) KV cache.
For a mixture of experts it prints the narrowest routing gap it met: the
least difference, in probability, between the last chosen expert and the
first one left out (a choice the rounding of llama.cpp or of q4khost could
flip when it is near zero).

Usage: scripts/oracle-f64.py [FIXTURE...]
(FIXTURE: a llama.cpp fixture's name without .json, e.g. oracle-gemma3 or
arch-qwen2-yarn; every one by default.)
"""
import json
import math
import os
import sys

from scripthelp import answer_help
answer_help(__doc__)  # before what may be missing

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "tests", "fixtures")
DEFAULT_MODEL = os.path.expanduser("~/.cache/q4khost/models/gemma-3-270m-q4_k_m.gguf")
TOPK = 8
# fixture -> (model file, decode steps kept per case: None for all).
# Gemma 3 270M's rows are 640 floats: its fixtures keep every prompt
# position and the first 8 decode steps, a few hundred KB.
SOURCES = {
    "oracle-gemma3": (DEFAULT_MODEL, 8),
    "oracle-gemma3-new": (DEFAULT_MODEL, 8),
    "arch-llama": ("tiny-llama.gguf", None),
    "arch-llama-ropefreqs": ("tiny-llama-ropefreqs.gguf", None),
    "arch-qwen2": ("tiny-qwen2.gguf", None),
    "arch-qwen2-yarn": ("tiny-qwen2-yarn.gguf", None),
    "arch-qwen3": ("tiny-qwen3.gguf", None),
    "arch-qwen35": ("tiny-qwen35.gguf", None),
    "arch-qwen3moe": ("tiny-qwen3moe.gguf", None),
}


class Model:
    """A GGUF file's hyperparameters and its weights, dequantised to float64."""

    def __init__(self, path):
        self.path = path
        self.reader = GGUFReader(path)
        self.tensors = {t.name: t for t in self.reader.tensors}
        self.arch = self.value("general.architecture")

    def value(self, key, default=None):
        """Metadata KEY; without a DEFAULT the key is required."""
        field = self.reader.fields.get(key)
        if field is None:
            if default is None:
                sys.exit("%s: required key %s is missing" % (self.path, key))
            return default
        return field.contents()

    def hp(self, key, default=None):
        return self.value("%s.%s" % (self.arch, key), default)

    def has(self, name):
        return name in self.tensors

    def w(self, name):
        """Tensor NAME as float64, numpy order: a matrix is (ne1, ne0)."""
        t = self.tensors.get(name)
        if t is None:
            sys.exit("%s: tensor %s is missing" % (self.path, name))
        shape = [int(n) for n in reversed(t.shape)]
        return dequantize(t.data, t.tensor_type).astype(np.float64).reshape(shape)


def rms_norm(x, w, eps):
    """ggml_rms_norm over the last axis, then times w (None: no weight)."""
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if w is None else y * w


def rope(x, pos, r):
    """ggml_rope_ext on x (T, heads, head_dim): the first n_rot values of
    each head rotate, pairs (2i, 2i+1) (NORM) or (i, i + n_rot/2) (NEOX),
    by theta with YaRN's ramp and magnitude scaling (ops.cpp rope_yarn)."""
    n_rot = r["n_rot"]
    half = n_rot // 2
    i = np.arange(half, dtype=np.float64)
    extrap = pos[:, None].astype(np.float64) * r["base"] ** (-2.0 * i / n_rot)[None, :]
    extrap = extrap / r["freq_factors"][None, :]
    theta = r["freq_scale"] * extrap
    mscale = r["attn_factor"]
    if r["ext_factor"] != 0.0:
        def corr_dim(beta):
            return n_rot * math.log(r["n_ctx_orig"] / (beta * 2 * math.pi)) / (2 * math.log(r["base"]))
        lo = max(0.0, math.floor(corr_dim(r["beta_fast"])))
        hi = min(n_rot - 1.0, math.ceil(corr_dim(r["beta_slow"])))
        ramp = 1 - np.clip((i - lo) / max(0.001, hi - lo), 0, 1)
        mix = ramp * r["ext_factor"]
        theta = theta * (1 - mix) + extrap * mix
        mscale *= 1.0 + 0.1 * math.log(1.0 / r["freq_scale"])
    cos = (np.cos(theta) * mscale)[:, None, :]
    sin = (np.sin(theta) * mscale)[:, None, :]
    out = x.copy()
    if r["neox"]:
        a, b = x[..., :half], x[..., half:n_rot]
        out[..., :half] = a * cos - b * sin
        out[..., half:n_rot] = a * sin + b * cos
    else:
        a, b = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        out[..., 0:n_rot:2] = a * cos - b * sin
        out[..., 1:n_rot:2] = a * sin + b * cos
    return out


def attention(q, k, v, scale, window=0):
    """Causal softmax attention, q (T, H, D), k and v (T, H_kv, D); head h
    reads kv head h // (H / H_kv); a window > 0 masks keys window or more
    positions back (llama.cpp's LLAMA_SWA_TYPE_STANDARD)."""
    T, H, _ = q.shape
    group = H // k.shape[1]
    k = np.repeat(k, group, axis=1)
    v = np.repeat(v, group, axis=1)
    s = np.einsum("thd,uhd->htu", q, k) * scale
    t, u = np.arange(T)[:, None], np.arange(T)[None, :]
    masked = u > t
    if window > 0:
        masked |= t - u >= window
    s = np.where(masked[None], -np.inf, s)
    s = np.exp(s - s.max(axis=-1, keepdims=True))
    s /= s.sum(axis=-1, keepdims=True)
    return np.einsum("htu,uhd->thd", s, v)


def silu(x):
    return x / (1 + np.exp(-x))


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def llama_rope(m, neox):
    """RoPE settings as llama.cpp's loader and context read them for the
    llama family: linear or YaRN scaling, rope_freqs.weight factors."""
    n_rot = int(m.hp("rope.dimension_count", 0)) or m.head_dim
    kind = m.hp("rope.scaling.type", "none")
    factor = float(m.hp("rope.scaling.factor", 0.0))
    scale = 1.0 if factor == 0.0 or kind == "none" else 1.0 / factor
    r = {"n_rot": n_rot, "neox": neox, "base": float(m.hp("rope.freq_base", 10000.0)),
         "freq_scale": scale, "ext_factor": 0.0, "attn_factor": float(m.hp("rope.scaling.attn_factor", 1.0)),
         "beta_fast": 32.0, "beta_slow": 1.0,
         "n_ctx_orig": int(m.hp("rope.scaling.original_context_length", 0)) or int(m.hp("context_length")),
         "freq_factors": m.w("rope_freqs.weight") if m.has("rope_freqs.weight") else np.ones(n_rot // 2)}
    if kind == "yarn":
        def mscale(f, mul):
            return 1.0 if f <= 1.0 else 0.1 * mul * math.log(f) + 1.0
        fac = 1.0 / scale
        mul = float(m.hp("rope.scaling.yarn_log_multiplier", 0.0))
        r["ext_factor"] = 1.0
        r["attn_factor"] *= (mscale(fac, 1.0) / mscale(fac, mul) if mul else mscale(fac, 1.0)) \
            / (1.0 + 0.1 * math.log(fac))
    return r


def attention_scale(m):
    """The scale of q . k: 1 / sqrt(head_dim). llama.cpp 0.3.36 reads
    ARCH.attention.scale only for its granite architectures (and dflash),
    none of those here: for these it keeps 1 / sqrt(head_dim) whatever the
    file says, as q4khost's loaders do. A file that sets another is run as
    llama.cpp runs it, with a note."""
    scale = 1 / math.sqrt(m.head_dim)
    given = m.hp("attention.scale", 0.0)
    if given and not math.isclose(given, scale, rel_tol=1e-6):
        print("%s: %s.attention.scale %g ignored, as llama.cpp ignores it for %s: the "
              "scale is 1/sqrt(%d)" % (m.path, m.arch, given, m.arch, m.head_dim),
              file=sys.stderr)
    return scale


def set_dims(m):
    m.n_embd = int(m.hp("embedding_length"))
    m.n_head = int(m.hp("attention.head_count"))
    m.n_head_kv = int(m.hp("attention.head_count_kv", m.n_head))
    m.head_dim = int(m.hp("attention.key_length", 0)) or m.n_embd // m.n_head
    m.eps = float(m.hp("attention.layer_norm_rms_epsilon"))
    m.n_layer = int(m.hp("block_count")) - int(m.hp("nextn_predict_layers", 0))


def self_attention(m, il, h, pos, r, scale, window=0, gated=False):
    """q, k, v, per-head q/k norms where the file has them, RoPE,
    attention, (Qwen3.5: times sigmoid of the gate half of Wq h), Wo."""
    T, hd = h.shape[0], m.head_dim
    p = "blk.%d." % il

    def proj(name):
        y = h @ m.w(p + name + ".weight").T
        return y + m.w(p + name + ".bias") if m.has(p + name + ".bias") else y

    q = proj("attn_q").reshape(T, m.n_head, -1)
    gate = None
    if gated:
        q, gate = q[..., :hd], 1 / (1 + np.exp(-q[..., hd:]))
    k = proj("attn_k").reshape(T, m.n_head_kv, hd)
    v = proj("attn_v").reshape(T, m.n_head_kv, hd)
    if m.has(p + "attn_q_norm.weight"):
        q = rms_norm(q, m.w(p + "attn_q_norm.weight"), m.eps)
        k = rms_norm(k, m.w(p + "attn_k_norm.weight"), m.eps)
    o = attention(rope(q, pos, r), rope(k, pos, r), v, scale, window)
    if gated:
        o = o * gate
    return o.reshape(T, -1) @ m.w(p + "attn_output.weight").T


def ffn(m, il, h, act):
    p = "blk.%d." % il
    g = h @ m.w(p + "ffn_gate.weight").T
    u = h @ m.w(p + "ffn_up.weight").T
    return (act(g) * u) @ m.w(p + "ffn_down.weight").T


def forward_llama(m, ids):
    """llama, qwen2 (q/k/v biases, NeoX), qwen3 (per-head q/k norms, NeoX),
    qwen3moe (qwen3 with a mixture of experts for every FFN)."""
    r = llama_rope(m, neox=m.arch != "llama")
    pos = np.arange(len(ids))
    x = m.w("token_embd.weight")[ids]
    for il in range(m.n_layer):
        p = "blk.%d." % il
        h = rms_norm(x, m.w(p + "attn_norm.weight"), m.eps)
        x = x + self_attention(m, il, h, pos, r, attention_scale(m))
        h = rms_norm(x, m.w(p + "ffn_norm.weight"), m.eps)
        x = x + (moe(m, il, h) if m.arch == "qwen3moe" else ffn(m, il, h, silu))
    return x


def forward_gemma3(m, ids):
    """Gemma 3: embeddings times sqrt(n_embd); every 6th layer global, the
    others sliding-window with their own RoPE base; post-norms on each
    block's output; GELU-gated FFN."""
    n_swa = int(m.hp("attention.sliding_window", 0))
    if n_swa == 0:
        sys.exit("%s: gemma3 without a sliding window is not supported here" % m.path)
    factor = float(m.hp("rope.scaling.factor", 0.0))
    base = {"n_rot": m.head_dim, "neox": True, "ext_factor": 0.0, "attn_factor": 1.0,
            "beta_fast": 32.0, "beta_slow": 1.0, "n_ctx_orig": int(m.hp("context_length")),
            "freq_factors": np.ones(m.head_dim // 2)}
    glob = dict(base, base=float(m.hp("rope.freq_base", 10000.0)),
                freq_scale=1.0 / factor if factor else 1.0)
    local = dict(base, base=float(m.hp("rope.freq_base_swa", 10000.0)), freq_scale=1.0)
    # 27B (62 layers) scales q by 1/sqrt(n_embd / n_head), the others by 1/sqrt(head_dim)
    scale = 1 / math.sqrt(m.n_embd / m.n_head if m.n_layer == 62 else m.head_dim)
    pos = np.arange(len(ids))
    x = m.w("token_embd.weight")[ids] * math.sqrt(m.n_embd)
    for il in range(m.n_layer):
        p = "blk.%d." % il
        swa = il % 6 < 5
        h = rms_norm(x, m.w(p + "attn_norm.weight"), m.eps)
        a = self_attention(m, il, h, pos, local if swa else glob, scale, n_swa if swa else 0)
        x = x + rms_norm(a, m.w(p + "post_attention_norm.weight"), m.eps)
        h = rms_norm(x, m.w(p + "ffn_norm.weight"), m.eps)
        x = x + rms_norm(ffn(m, il, h, gelu_tanh), m.w(p + "post_ffw_norm.weight"), m.eps)
    return x


def l2_norm(x, eps):
    """models.h build_gdn_l2_norm: rms_norm with eps / n, times 1 / sqrt(n)."""
    n = x.shape[-1]
    return rms_norm(x, None, eps / n) / math.sqrt(n)


def linear_attention(m, il, h):
    """Qwen3.5's gated delta-net layer, token by token from a zero state."""
    p = "blk.%d." % il
    T = h.shape[0]
    sd = int(m.hp("ssm.state_size"))
    hk, hv = int(m.hp("ssm.group_count")), int(m.hp("ssm.time_step_rank"))
    qkv = h @ m.w(p + "attn_qkv.weight").T
    z = (h @ m.w(p + "attn_gate.weight").T).reshape(T, hv, sd)
    beta = 1 / (1 + np.exp(-(h @ m.w(p + "ssm_beta.weight").T)))
    g = np.log1p(np.exp(h @ m.w(p + "ssm_alpha.weight").T + m.w(p + "ssm_dt.bias"))) * m.w(p + "ssm_a")
    w = m.w(p + "ssm_conv1d.weight")          # (channels, K)
    K = w.shape[1]
    u = np.concatenate([np.zeros((K - 1, qkv.shape[1])), qkv])
    c = silu(sum(w[:, j] * u[j:j + T] for j in range(K)))
    q = l2_norm(c[:, :sd * hk].reshape(T, hk, sd), m.eps)
    k = l2_norm(c[:, sd * hk:2 * sd * hk].reshape(T, hk, sd), m.eps)
    v = c[:, 2 * sd * hk:].reshape(T, hv, sd)
    S = np.zeros((hv, sd, sd))                # S[h][value i][key j]
    o = np.zeros((T, hv, sd))
    for t in range(T):
        for hh in range(hv):
            kh = hh % hk
            S[hh] *= math.exp(g[t, hh])
            d = beta[t, hh] * (v[t, hh] - S[hh] @ k[t, kh])
            S[hh] += np.outer(d, k[t, kh])
            o[t, hh] = S[hh] @ q[t, kh] / math.sqrt(sd)
    o = rms_norm(o, m.w(p + "ssm_norm.weight"), m.eps) * silu(z)
    return o.reshape(T, -1) @ m.w(p + "ssm_out.weight").T


def recurrent_layers(m):
    flags = m.hp("attention.recurrent_layers", [])
    if flags:
        return [bool(f) for f in flags]
    interval = int(m.hp("full_attention_interval", 4))
    return [(il + 1) % interval != 0 for il in range(m.n_layer)]


def check_sections(m, n_rot):
    """rope.dimension_sections as host/lib/arch_qwen35.c checks them: four
    integers >= 0 that give every rotated pair a text position. llama.cpp's
    interleaved multi-section RoPE gives pair i the position of section
    (i mod sum) mod 3 while i mod sum stays under 3 times that section's
    size, else the fourth section's, which is 0 for text: such a pair would
    not rotate, and NeoX RoPE (below) would no longer be llama.cpp's."""
    key = "%s.rope.dimension_sections" % m.arch
    sec = [int(v) for v in m.value(key)]
    total = sum(sec)
    if len(sec) != 4 or min(sec) < 0 or not total or \
            any(i % total >= 3 * sec[(i % total) % 3] for i in range(n_rot // 2)):
        sys.exit("%s: %s is %s: expected four sections that give each of the %d rotated "
                 "pairs a text position" % (m.path, key, sec, n_rot // 2))


def forward_qwen35(m, ids):
    """Qwen3.5: gated attention and gated delta-net layers. Text tokens have
    one position in every RoPE section, so its multi-section RoPE is NeoX
    RoPE over rope.dimension_count values (when the sections rotate every
    pair: check_sections)."""
    r = llama_rope(m, neox=True)
    check_sections(m, r["n_rot"])
    pos = np.arange(len(ids))
    recurrent = recurrent_layers(m)
    x = m.w("token_embd.weight")[ids]
    for il in range(m.n_layer):
        p = "blk.%d." % il
        h = rms_norm(x, m.w(p + "attn_norm.weight"), m.eps)
        if recurrent[il]:
            x = x + linear_attention(m, il, h)
        else:
            x = x + self_attention(m, il, h, pos, r, attention_scale(m), gated=True)
        h = rms_norm(x, m.w(p + "post_attention_norm.weight"), m.eps)
        x = x + ffn(m, il, h, silu)
    return x


def moe(m, il, h):
    """build_moe_ffn with softmax gating and norm_w (qwen3moe): each
    token's expert_used_count most probable experts (the lower index first
    among equal probabilities, as a stable descending sort), their
    probabilities over their sum (clamped to 2^-14), each chosen expert's
    SwiGLU, weighted, summed."""
    p = "blk.%d." % il
    k = int(m.hp("expert_used_count"))
    logits = h @ m.w(p + "ffn_gate_inp.weight").T
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    gate, up, down = (m.w(p + "ffn_%s_exps.weight" % n) for n in ("gate", "up", "down"))
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        order = np.argsort(-probs[t], kind="stable")
        m.route_gap = min(m.route_gap, probs[t, order[k - 1]] - probs[t, order[k]])
        chosen = order[:k]
        w = probs[t, chosen] / max(probs[t, chosen].sum(), 2.0 ** -14)
        for e, we in zip(chosen, w):
            out[t] += we * (down[e] @ (silu(gate[e] @ h[t]) * (up[e] @ h[t])))
    return out


FORWARD = {"llama": forward_llama, "qwen2": forward_llama, "qwen3": forward_llama,
           "gemma3": forward_gemma3, "qwen35": forward_qwen35, "qwen3moe": forward_llama}


def run(name):
    model_file, steps = SOURCES[name]
    src_path = os.path.join(FIXTURES, name + ".json")
    with open(src_path) as f:
        src = json.load(f)
    path = model_file if os.path.isabs(model_file) else os.path.join(FIXTURES, model_file)
    m = Model(path)
    if m.arch not in FORWARD:
        sys.exit("%s: architecture %s has no exact forward here (known: %s)" %
                 (path, m.arch, ", ".join(sorted(FORWARD))))
    set_dims(m)
    m.route_gap = math.inf
    head = m.w("output.weight" if m.has("output.weight") else "token_embd.weight")
    norm = m.w("output_norm.weight")
    hidden, cases = [], []
    for ci, case in enumerate(src["cases"]):
        greedy = case["greedy"] if steps is None else case["greedy"][:steps]
        h = rms_norm(FORWARD[m.arch](m, np.array(case["tokens"] + greedy)), norm, m.eps)
        rows = []
        for hrow in h:
            z = head @ hrow
            order = np.argsort(-z, kind="stable")[:TOPK]
            rows.append({"hidden_row": len(hidden), "top_ids": [int(t) for t in order],
                         "top_logits": [float(z[t]) for t in order],
                         "margin": float(z[order[0]] - z[order[1]]),
                         "sumsq": float(z @ z)})
            hidden.append(hrow)
        cases.append({"source_case": ci, "tokens": case["tokens"], "greedy": greedy, "rows": rows})
        print("%s case %d: %d rows, min margin %.4f" % (name, ci, len(rows),
              min(r["margin"] for r in rows)), file=sys.stderr)
    if m.route_gap < math.inf:
        print("%s: narrowest routing gap %.3g" % (name, m.route_gap), file=sys.stderr)
    out = os.path.join(FIXTURES, "oracle-f64-%s" % name.replace("oracle-", "").replace("arch-", ""))
    np.stack(hidden).astype("<f4").tofile(out + ".bin")
    with open(out + ".json", "w") as f:
        json.dump({"source": "exact float64 forward pass (NumPy, gguf-py dequantizers) on the ids of "
                             "%s.json; regenerate with scripts/oracle-f64.py" % name,
                   "model": os.path.basename(path), "architecture": m.arch,
                   "n_embd": m.n_embd, "n_vocab": int(head.shape[0]),
                   "hidden_rows": len(hidden), "cases": cases}, f, indent=0)
        f.write("\n")


def main():
    names = sys.argv[1:] or [n for n in SOURCES if os.path.exists(os.path.join(FIXTURES, n + ".json"))]
    for name in names:
        if name not in SOURCES:
            sys.exit("oracle-f64: unknown fixture %s (known: %s)" % (name, ", ".join(SOURCES)))
        run(name)


if __name__ == "__main__":
    main()
