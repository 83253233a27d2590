"""Synthetic GGUF files: a streaming GGUF v3 writer and random quantized
weights, for scripts/gen-tiny-models.py and scripts/gen-bench-model.py.

Needs only Python 3 and NumPy, so the benchmark generator runs on a GPU
machine without a package registry (the gguf package needs PyYAML at import).

Random weights are random quantization blocks, not quantized floats: every
block is valid data of its type (block layouts: sdk/include/q4khost/quant.h),
its scales chosen so the dequantized values have mean about 0 and the
standard deviation asked for. Same seed, same bytes.
"""
import os
import struct
import sys

try:
    import numpy as np
except ImportError:  # one line, not a traceback, for the scripts that import this
    sys.exit("%s: needs NumPy, which %s lacks: run it with /usr/bin/python3 after "
             "scripts/install-deps.sh (Debian's python3-numpy), or pip install numpy"
             % (os.path.basename(sys.argv[0]), sys.executable))

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
ALIGNMENT = 32

# ggml tensor types used here: (id, values per block, bytes per block)
TYPES = {
    "F32": (0, 1, 4),
    "Q5_0": (6, 32, 22),
    "Q8_0": (8, 32, 34),
    "Q4_K": (12, 256, 144),
    "Q6_K": (14, 256, 210),
}

# GGUF metadata value types
_U32, _I32, _F32, _BOOL, _STR, _ARR = 4, 5, 6, 7, 8, 9


def _str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _value(v):
    """(type id, bytes) of a Python value; ints are uint32, floats float32."""
    if isinstance(v, bool):
        return _BOOL, struct.pack("<B", v)
    if isinstance(v, int):
        return (_U32, struct.pack("<I", v)) if v >= 0 else (_I32, struct.pack("<i", v))
    if isinstance(v, float):
        return _F32, struct.pack("<f", v)
    if isinstance(v, str):
        return _STR, _str(v)
    if isinstance(v, (list, tuple)):
        if not v:
            raise ValueError("empty arrays have no element type")
        if isinstance(v[0], str):
            return _ARR, struct.pack("<IQ", _STR, len(v)) + b"".join(_str(s) for s in v)
        if isinstance(v[0], bool):
            return _ARR, struct.pack("<IQ", _BOOL, len(v)) + bytes(int(x) for x in v)
        if isinstance(v[0], float):
            return _ARR, struct.pack("<IQ", _F32, len(v)) + np.asarray(v, "<f4").tobytes()
        return _ARR, struct.pack("<IQ", _I32, len(v)) + np.asarray(v, "<i4").tobytes()
    raise TypeError("unsupported metadata value %r" % (v,))


# bytes of a scalar of each metadata value type (strings and arrays vary)
_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def read_header_kvs(data):
    """The key/value pairs of GGUF v3 bytes DATA as [(key, raw)], raw being
    the pair's bytes as stored (key, type, value): a file cut anywhere after
    its header will do."""
    if data[:4] != GGUF_MAGIC or struct.unpack_from("<I", data, 4)[0] != GGUF_VERSION:
        raise ValueError("not a GGUF v3 file")
    n_kv, = struct.unpack_from("<Q", data, 16)
    at, out = 24, []

    def skip_string(at):
        n, = struct.unpack_from("<Q", data, at)
        return at + 8 + n

    for _ in range(n_kv):
        start = at
        n, = struct.unpack_from("<Q", data, at)
        key = data[at + 8:at + 8 + n].decode("utf-8")
        at += 8 + n
        t, = struct.unpack_from("<I", data, at)
        at += 4
        if t == _STR:
            at = skip_string(at)
        elif t == _ARR:
            et, count = struct.unpack_from("<IQ", data, at)
            at += 12
            if et == _STR:
                for _ in range(count):
                    at = skip_string(at)
            else:
                at += _SCALAR[et] * count
        else:
            at += _SCALAR[t]
        out.append((key, data[start:at]))
    return out


def kv_raw(key, value):
    """The stored bytes of one key/value pair (value as for Writer.add)."""
    vtype, raw = _value(value)
    return _str(key) + struct.pack("<I", vtype) + raw


def write_header_only(path, kvs):
    """A GGUF v3 file of the pairs KVS ([(key, raw)]) and no tensors: what
    llama.cpp loads with vocab_only, and q4khost's tokenizer reads."""
    head = GGUF_MAGIC + struct.pack("<IQQ", GGUF_VERSION, 0, len(kvs)) + b"".join(r for _, r in kvs)
    with open(path, "wb") as f:
        f.write(head + b"\0" * (-len(head) % ALIGNMENT))


def tensor_bytes(qtype, ne0, ne1, ne2=1):
    _, per_block, block_bytes = TYPES[qtype]
    if ne0 % per_block:
        raise ValueError("%s rows of %d values: not a multiple of %d" % (qtype, ne0, per_block))
    return ne0 // per_block * block_bytes * ne1 * ne2


class Writer:
    """Metadata and tensor shapes first; then write() streams the file,
    asking data(name) for each tensor's bytes (in declaration order)."""

    def __init__(self):
        self.kv = []
        self.tensors = []  # (name, qtype, ne0, ne1, ne2)

    def add(self, key, value):
        self.kv.append((key, value))

    def tensor(self, name, qtype, ne0, ne1=1, ne2=1):
        """A tensor {ne0, ne1, ne2}: ne2 > 1 stacks ne2 matrices (experts)."""
        self.tensors.append((name, qtype, ne0, ne1, ne2))

    def write(self, path, data):
        with open(path, "wb") as f:
            f.write(GGUF_MAGIC + struct.pack("<IQQ", GGUF_VERSION, len(self.tensors), len(self.kv)))
            for key, value in self.kv:
                vtype, raw = _value(value)
                f.write(_str(key) + struct.pack("<I", vtype) + raw)
            offset = 0
            for name, qtype, ne0, ne1, ne2 in self.tensors:
                dims = [ne0] if ne1 == ne2 == 1 else [ne0, ne1] if ne2 == 1 else [ne0, ne1, ne2]
                f.write(_str(name) + struct.pack("<I", len(dims)))
                f.write(struct.pack("<%dQ" % len(dims), *dims))
                f.write(struct.pack("<IQ", TYPES[qtype][0], offset))
                offset += -(-tensor_bytes(qtype, ne0, ne1, ne2) // ALIGNMENT) * ALIGNMENT
            f.write(b"\0" * (-f.tell() % ALIGNMENT))
            for name, qtype, ne0, ne1, ne2 in self.tensors:
                raw = data(name)
                size = tensor_bytes(qtype, ne0, ne1, ne2)
                if len(raw) != size:
                    raise ValueError("%s: %d bytes, expected %d" % (name, len(raw), size))
                f.write(raw)
                f.write(b"\0" * (-len(raw) % ALIGNMENT))


def _fp16(x, n):
    return np.full(n, x, dtype="<f2").view(np.uint8).reshape(n, 2)


def random_blocks(rng, qtype, ne0, ne1, std):
    """Bytes of a {ne0, ne1} tensor of random blocks of QTYPE whose values
    have about the standard deviation STD (F32: normal values)."""
    if qtype == "F32":
        return rng.normal(0.0, std, ne0 * ne1).astype("<f4").tobytes()
    n = ne0 // TYPES[qtype][1] * ne1
    if qtype == "Q5_0":
        # x = d (q - 16), 5-bit q uniform in [0, 31] (its high bits in qh,
        # its low nibbles in qs): std 9.23 d, mean -0.5 d
        qh = rng.integers(0, 256, (n, 4), dtype=np.uint8)
        qs = rng.integers(0, 256, (n, 16), dtype=np.uint8)
        return np.hstack([_fp16(std / 9.23, n), qh, qs]).tobytes()
    if qtype == "Q8_0":
        # x = d q, q uniform in [-127, 127]: std 73.6 d
        q = rng.integers(-127, 128, (n, 32), dtype=np.int8).view(np.uint8)
        return np.hstack([_fp16(std / 73.6, n), q]).tobytes()
    if qtype == "Q4_K":
        # x = d sc q - dmin m per 32-value sub-block, 6-bit sc and m, 4-bit q.
        # With dmin = 7.5 d and m = sc every sub-block has mean 0 (E q = 7.5)
        # and x = d sc (q - 7.5): std sqrt(E sc^2 Var q) d = 168.3 d. In the
        # 12 scale bytes (llama.cpp's get_scale_min_k4), m = sc means bytes
        # 4-7 repeat bytes 0-3 and bytes 8-11 repeat their low nibble.
        d = std / 168.3
        lo = rng.integers(0, 256, (n, 4), dtype=np.uint8)
        nib = rng.integers(0, 16, (n, 4), dtype=np.uint8)
        qs = rng.integers(0, 256, (n, 128), dtype=np.uint8)
        return np.hstack([_fp16(d, n), _fp16(7.5 * d, n), lo, lo, nib | (nib << 4), qs]).tobytes()
    if qtype == "Q6_K":
        # x = d sc (q - 32), 8-bit signed sc in [-127, 127], 6-bit q:
        # std 73.6 * 18.5 d
        ql = rng.integers(0, 256, (n, 128), dtype=np.uint8)
        qh = rng.integers(0, 256, (n, 64), dtype=np.uint8)
        sc = rng.integers(-127, 128, (n, 16), dtype=np.int8).view(np.uint8)
        return np.hstack([ql, qh, sc, _fp16(std / (73.6 * 18.5), n)]).tobytes()
    raise ValueError("no random blocks for %s" % qtype)


# --- models of the llama family (llama, qwen2, qwen3) ------------------------

# tokenizer.ggml.token_type values (llama.cpp's)
NORMAL, CONTROL, USER, UNUSED, BYTE = 1, 3, 4, 5, 6

LLAMA3_SPECIALS = [
    "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>",
    "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>",
    "<|eom_id|>", "<|eot_id|>", "<|python_tag|>",
]
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Our own short Jinja templates in the two formats (q4khost recognises
# them by their markers, llama.cpp likewise).
CHATML_TEMPLATE = (
    "{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
    "'<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}{%- endif %}")
LLAMA3_TEMPLATE = (
    "{{- bos_token }}{%- for m in messages %}{{- '<|start_header_id|>' + m['role'] + "
    "'<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}")


def byte_tokens():
    """GPT-2's printable stand-ins for the 256 bytes, in byte order
    (Radford et al. 2019, encoder.py bytes_to_unicode)."""
    printable = [c for c in range(256)
                 if ord("!") <= c <= ord("~") or 0xa1 <= c <= 0xac or 0xae <= c <= 0xff]
    out, extra = [], 256
    for c in range(256):
        if c in printable:
            out.append(chr(c))
        else:
            out.append(chr(extra))
            extra += 1
    return out


class Shape:
    """Hyper-parameters of a llama-family model; bias: q/k/v biases (qwen2),
    qk_norm: per-head q/k norms and explicit key/value lengths (qwen3)."""

    def __init__(self, arch, n_embd, n_layer, n_ff, n_head, n_head_kv, head_dim,
                 rope_base, eps, ctx, tied, bias=False, qk_norm=False):
        self.__dict__.update(locals())
        del self.__dict__["self"]


def _first_hparams(w, s, name, description):
    """The keys every architecture's file starts with, up to the number of
    query heads; the prefix."""
    w.add("general.architecture", s.arch)
    w.add("general.name", name)
    w.add("general.description", description)
    p = s.arch + "."
    w.add(p + "context_length", s.ctx)
    w.add(p + "embedding_length", s.n_embd)
    w.add(p + "block_count", s.n_layer)
    w.add(p + "feed_forward_length", s.n_ff)
    w.add(p + "attention.head_count", s.n_head)
    return p


def add_base_hparams(w, s, name, description):
    """The keys every llama-family file starts with; the prefix."""
    p = _first_hparams(w, s, name, description)
    w.add(p + "attention.head_count_kv", s.n_head_kv)
    return p


def add_hparams(w, s, name, description):
    p = add_base_hparams(w, s, name, description)
    w.add(p + "attention.layer_norm_rms_epsilon", s.eps)
    w.add(p + "rope.freq_base", s.rope_base)
    if s.qk_norm:
        w.add(p + "attention.key_length", s.head_dim)
        w.add(p + "attention.value_length", s.head_dim)
    else:
        w.add(p + "rope.dimension_count", s.head_dim)


def add_tokenizer(w, tokens, types, merges, pre, bos, eos, add_bos, template):
    """A "gpt2" (byte-level BPE) vocabulary; bos and eos given by text."""
    w.add("tokenizer.ggml.model", "gpt2")
    w.add("tokenizer.ggml.pre", pre)
    w.add("tokenizer.ggml.tokens", tokens)
    w.add("tokenizer.ggml.token_type", types)
    w.add("tokenizer.ggml.merges", merges)
    w.add("tokenizer.ggml.bos_token_id", tokens.index(bos))
    w.add("tokenizer.ggml.eos_token_id", tokens.index(eos))
    w.add("tokenizer.ggml.add_bos_token", add_bos)
    w.add("tokenizer.chat_template", template)


def q4_k_m_more_bits(il, n_layer):
    """Layers whose attn_v and ffn_down a Q4_K_M file keeps at Q6_K
    (llama.cpp's use_more_bits: the first and last eighth, and every third
    layer between)."""
    return il < n_layer // 8 or il >= 7 * n_layer // 8 or (il - n_layer // 8) % 3 == 2


def layer_tensors(s, il, gain):
    """(name, type, ne0, ne1, std) of layer il as in a Q4_K_M file; type
    "norm" is an F32 vector of about 1. gain scales what the layer adds to
    the residual stream (attn_output, ffn_down)."""
    b = "blk.%d." % il
    qd, kvd, e = s.head_dim * s.n_head, s.head_dim * s.n_head_kv, s.n_embd
    wide = "Q6_K" if q4_k_m_more_bits(il, s.n_layer) else "Q4_K"
    out = [(b + "attn_norm.weight", "norm", e, 1, 0),
           (b + "attn_q.weight", "Q4_K", e, qd, e ** -0.5),
           (b + "attn_k.weight", "Q4_K", e, kvd, e ** -0.5),
           (b + "attn_v.weight", wide, e, kvd, e ** -0.5)]
    if s.bias:
        out += [(b + "attn_%s.bias" % t, "F32", n, 1, 0.5)
                for t, n in (("q", qd), ("k", kvd), ("v", kvd))]
    if s.qk_norm:
        out += [(b + "attn_q_norm.weight", "norm", s.head_dim, 1, 0),
                (b + "attn_k_norm.weight", "norm", s.head_dim, 1, 0)]
    return out + [(b + "attn_output.weight", "Q4_K", qd, e, gain * qd ** -0.5),
                  (b + "ffn_norm.weight", "norm", e, 1, 0),
                  (b + "ffn_gate.weight", "Q4_K", e, s.n_ff, e ** -0.5),
                  (b + "ffn_up.weight", "Q4_K", e, s.n_ff, e ** -0.5),
                  (b + "ffn_down.weight", wide, s.n_ff, e, gain * s.n_ff ** -0.5)]


# --- Qwen3-MoE (qwen3moe): qwen3's attention, a mixture of experts ------------

class MoeShape(Shape):
    """A qwen3moe model: qwen3's attention, and in every layer n_expert
    SwiGLU experts of n_ff_exp, n_expert_used of them per token."""

    def __init__(self, n_embd, n_layer, n_ff, n_head, n_head_kv, head_dim, rope_base, eps,
                 ctx, tied, n_expert, n_expert_used, n_ff_exp):
        super().__init__("qwen3moe", n_embd, n_layer, n_ff, n_head, n_head_kv, head_dim,
                         rope_base, eps, ctx, tied, qk_norm=True)
        self.n_expert, self.n_expert_used, self.n_ff_exp = n_expert, n_expert_used, n_ff_exp


def add_moe_hparams(w, s, name, description):
    """qwen3's keys and the experts' (llama.cpp's convert_hf_to_gguf.py)."""
    add_hparams(w, s, name, description)
    p = s.arch + "."
    w.add(p + "expert_count", s.n_expert)
    w.add(p + "expert_used_count", s.n_expert_used)
    w.add(p + "expert_feed_forward_length", s.n_ff_exp)


def moe_layer_tensors(s, il, gain):
    """(name, type, ne0, ne1, std, ne2) of a qwen3moe layer as in a Q4_K_M
    file: the attention of layer_tensors, the router ffn_gate_inp in F32
    (llama-quantize leaves it so; std None: the caller writes its values),
    the experts' stacks {ne0, ne1, n_expert} in Q4_K, down in Q6_K on the
    layers that get more bits."""
    b = "blk.%d." % il
    e, f, n = s.n_embd, s.n_ff_exp, s.n_expert
    wide = "Q6_K" if q4_k_m_more_bits(il, s.n_layer) else "Q4_K"
    attn = [t + (1,) for t in layer_tensors(s, il, gain)
            if not t[0].startswith(b + "ffn_") or t[0] == b + "ffn_norm.weight"]
    return attn + [(b + "ffn_gate_inp.weight", "F32", e, n, None, 1),
                   (b + "ffn_gate_exps.weight", "Q4_K", e, f, e ** -0.5, n),
                   (b + "ffn_up_exps.weight", "Q4_K", e, f, e ** -0.5, n),
                   (b + "ffn_down_exps.weight", wide, f, e, gain * f ** -0.5, n)]


def tensor_data(rng, qtype, ne0, ne1, std):
    """Bytes of one planned tensor (a "norm" is 1 plus N(0, 0.1) noise; a
    "decay" is Qwen3.5's ssm_a, -exp(A_log), here per head from -0.02, a
    memory of about a hundred tokens, to -0.5)."""
    if qtype == "norm":
        return (1.0 + rng.normal(0.0, 0.1, ne0 * ne1)).astype("<f4").tobytes()
    if qtype == "decay":
        return (-np.exp(rng.uniform(np.log(0.02), np.log(0.5), ne0 * ne1))).astype("<f4").tobytes()
    return random_blocks(rng, qtype, ne0, ne1, std)


def declare(w, name, qtype, ne0, ne1, ne2=1):
    w.tensor(name, "F32" if qtype in ("norm", "decay") else qtype, ne0, ne1, ne2)


# --- Qwen3.5 (qwen35): gated attention and gated delta-net layers -------------

class Qwen35Shape:
    """Hyper-parameters of a qwen35 model as llama.cpp's converter writes
    them: full attention every full_attention_interval-th layer, with
    n_rot = head_dim / 4 rotated in the rope sections; linear attention
    with ssm_k_heads key heads, ssm_v_heads value heads of ssm_state values
    and a conv_kernel-tap convolution."""

    def __init__(self, n_embd, n_layer, n_ff, n_head, n_head_kv, head_dim, sections,
                 ssm_k_heads, ssm_v_heads, ssm_state, conv_kernel, interval, rope_base,
                 eps, ctx, tied):
        self.__dict__.update(locals())
        del self.__dict__["self"]
        self.arch = "qwen35"
        self.n_rot = head_dim // 4

    def recurrent(self, il):
        return (il + 1) % self.interval != 0

    def conv_channels(self):
        return (2 * self.ssm_k_heads + self.ssm_v_heads) * self.ssm_state


def add_qwen35_hparams(w, s, name, description):
    p = add_base_hparams(w, s, name, description)
    w.add(p + "rope.freq_base", s.rope_base)
    w.add(p + "attention.layer_norm_rms_epsilon", s.eps)
    w.add(p + "attention.key_length", s.head_dim)
    w.add(p + "attention.value_length", s.head_dim)
    w.add(p + "ssm.conv_kernel", s.conv_kernel)
    w.add(p + "ssm.state_size", s.ssm_state)
    w.add(p + "ssm.group_count", s.ssm_k_heads)
    w.add(p + "ssm.time_step_rank", s.ssm_v_heads)
    w.add(p + "ssm.inner_size", s.ssm_state * s.ssm_v_heads)
    w.add(p + "attention.recurrent_layers", [s.recurrent(il) for il in range(s.n_layer)])
    w.add(p + "full_attention_interval", s.interval)
    w.add(p + "rope.dimension_count", s.n_rot)
    w.add(p + "rope.dimension_sections", list(s.sections))


def qwen35_layer_tensors(s, il, gain, wide_qkv=False):
    """(name, type, ne0, ne1, std) of layer il as in a Q4_K_M file.
    wide_qkv: attn_qkv takes attn_v's type, as in llama.cpp's Q4_K_M
    (llama-cpp-python 0.3.36's src/llama-quant.cpp counts attn_qkv among
    the attn_v-like tensors; one per layer in qwen35, so the layers given
    more bits are by layer index); tests/fixtures/tiny-qwen35.gguf was
    written with Q4_K there and keeps it."""
    b = "blk.%d." % il
    e = s.n_embd
    wide = "Q6_K" if q4_k_m_more_bits(il, s.n_layer) else "Q4_K"
    out = [(b + "attn_norm.weight", "norm", e, 1, 0)]
    if s.recurrent(il):
        vd, ch, hv = s.ssm_state * s.ssm_v_heads, s.conv_channels(), s.ssm_v_heads
        out += [(b + "attn_qkv.weight", wide if wide_qkv else "Q4_K", e, ch, e ** -0.5),
                (b + "attn_gate.weight", "Q4_K", e, vd, e ** -0.5),
                (b + "ssm_conv1d.weight", "F32", s.conv_kernel, ch, 0.5),
                (b + "ssm_dt.bias", "F32", hv, 1, 0.5),
                (b + "ssm_a", "decay", hv, 1, 0),
                (b + "ssm_beta.weight", "Q4_K", e, hv, e ** -0.5),
                (b + "ssm_alpha.weight", "Q4_K", e, hv, e ** -0.5),
                (b + "ssm_norm.weight", "norm", s.ssm_state, 1, 0),
                (b + "ssm_out.weight", "Q4_K", vd, e, gain * vd ** -0.5)]
    else:
        qd, kvd = s.head_dim * s.n_head, s.head_dim * s.n_head_kv
        out += [(b + "attn_q.weight", "Q4_K", e, 2 * qd, e ** -0.5),
                (b + "attn_k.weight", "Q4_K", e, kvd, e ** -0.5),
                (b + "attn_v.weight", wide, e, kvd, e ** -0.5),
                (b + "attn_output.weight", "Q4_K", qd, e, gain * qd ** -0.5),
                (b + "attn_q_norm.weight", "norm", s.head_dim, 1, 0),
                (b + "attn_k_norm.weight", "norm", s.head_dim, 1, 0)]
    return out + [(b + "post_attention_norm.weight", "norm", e, 1, 0),
                  (b + "ffn_gate.weight", "Q4_K", e, s.n_ff, e ** -0.5),
                  (b + "ffn_up.weight", "Q4_K", e, s.n_ff, e ** -0.5),
                  (b + "ffn_down.weight", wide, s.n_ff, e, gain * s.n_ff ** -0.5)]


# --- Gemma 3 (gemma3): SentencePiece vocabulary, q/k norms, post-norms --------

class Gemma3Shape:
    """Hyper-parameters of a gemma3 model as its GGUF files give them (the
    sliding-window pattern, 5 local layers to 1 global, and the local
    layers' RoPE base 10000 are not in the file: readers know them)."""

    def __init__(self, n_embd, n_layer, n_ff, n_head, n_head_kv, head_dim, rope_base,
                 eps, ctx, window):
        self.__dict__.update(locals())
        del self.__dict__["self"]
        self.arch = "gemma3"


def add_gemma3_hparams(w, s, name, description):
    """The architecture's keys of a gemma3 file, in the order its converter
    writes them (the number of KV heads last)."""
    p = _first_hparams(w, s, name, description)
    for key, value in (("attention.layer_norm_rms_epsilon", s.eps),
                       ("attention.key_length", s.head_dim),
                       ("attention.value_length", s.head_dim),
                       ("rope.freq_base", s.rope_base),
                       ("attention.sliding_window", s.window),
                       ("attention.head_count_kv", s.n_head_kv)):
        w.add(p + key, value)


# Gemma 3's HTML tags among its user-defined tokens: each group's opening
# tags, then its closing ones.
_GEMMA_TAGS = [
    ["table", "caption", "thead", "tbody", "tfoot", "tr", "th", "td"],
    ["h1", "h2", "h3", "h4", "h5", "h6", "blockquote"],
    ["strong", "em", "b", "i", "u", "s", "sub", "sup", "code"],
    ["a", "html", "body", "img", "span", "bbox", "ul", "li", "div", "iframe", "footer"],
]


def gemma_vocabulary(n_vocab):
    """(tokens, scores, types) with the layout of Gemma 3's 262144-token
    SentencePiece vocabulary: <pad> <eos> <bos> <unk> <mask> [multimodal],
    <unused0..98>, <start_of_turn> <end_of_turn> (105, 106), the runs of
    newlines and spaces and the HTML tags (user-defined), the 256 byte
    tokens <0x00>..<0xFF> (238..493), normal pieces, the runs of tabs,
    <start_of_image> <end_of_image>, <unused99..> to the end. The normal
    pieces are U+2581 (SentencePiece's space) and the printable ASCII
    characters, one each, then placeholders no text forms: a prompt
    tokenizes to one token per character (bytes beyond ASCII to byte
    tokens)."""
    head = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "[multimodal]"]
    head += ["<unused%d>" % i for i in range(99)] + ["<start_of_turn>", "<end_of_turn>"]
    user = ["\n" * n for n in range(1, 32)] + [" " * n for n in range(2, 32)]
    for group in _GEMMA_TAGS:
        user += ["<%s>" % t for t in group] + ["</%s>" % t for t in group]
    tail_user = ["\t" * n for n in range(1, 32)] + ["<start_of_image>", "<end_of_image>"]
    byte = ["<0x%02X>" % b for b in range(256)]
    pieces = ["\u2581"] + [chr(c) for c in range(0x21, 0x7f)]
    first_normal = len(head) + len(user) + len(byte)
    n_unused = n_vocab - 256001
    n_normal = n_vocab - first_normal - len(tail_user) - n_unused
    pieces += ["<fill%d>" % (first_normal + i) for i in range(len(pieces), n_normal)]
    tokens = head + user + byte + pieces + tail_user
    tokens += ["<unused%d>" % (99 + i) for i in range(n_unused)]
    types = ([CONTROL] * 5 + [USER] + [CONTROL] * 101 + [USER] * len(user) +
             [BYTE] * 256 + [NORMAL] * n_normal + [USER] * len(tail_user) +
             [CONTROL] * n_unused)
    scores = ([-1000.0] * (len(head) + len(user)) + [0.0] * 256 +
              [-float(i) for i in range(n_normal)] +
              [-1000.0] * (len(tail_user) + n_unused))
    return tokens, scores, types


def add_spm_tokenizer(w, tokens, scores, types, bos, eos, unk, pad):
    """A "llama" (SentencePiece) vocabulary as Gemma's files carry it:
    BOS added, no space prefix, no chat template."""
    w.add("tokenizer.ggml.model", "llama")
    w.add("tokenizer.ggml.pre", "default")
    w.add("tokenizer.ggml.tokens", tokens)
    w.add("tokenizer.ggml.scores", scores)
    w.add("tokenizer.ggml.token_type", types)
    w.add("tokenizer.ggml.bos_token_id", tokens.index(bos))
    w.add("tokenizer.ggml.eos_token_id", tokens.index(eos))
    w.add("tokenizer.ggml.unknown_token_id", tokens.index(unk))
    w.add("tokenizer.ggml.padding_token_id", tokens.index(pad))
    w.add("tokenizer.ggml.add_bos_token", True)
    w.add("tokenizer.ggml.add_sep_token", False)
    w.add("tokenizer.ggml.add_eos_token", False)
    w.add("tokenizer.ggml.add_space_prefix", False)


def gemma3_layer_tensors(s, il):
    """(name, type, ne0, ne1, std) of layer il as in a Q4_K_M file, in its
    order (by name). Rows of n_embd values (not a multiple of 256 in the
    small models) take llama.cpp's fallbacks: Q5_0 for Q4_K, Q8_0 for
    Q6_K; attn_output and ffn_down keep the k-quants."""
    b = "blk.%d." % il
    qd, kvd, e, f = s.head_dim * s.n_head, s.head_dim * s.n_head_kv, s.n_embd, s.n_ff

    def kq(kind):
        if e % 256 == 0:
            return kind
        return {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}[kind]
    more = q4_k_m_more_bits(il, s.n_layer)
    return [(b + "attn_k.weight", kq("Q4_K"), e, kvd, e ** -0.5),
            (b + "attn_k_norm.weight", "norm", s.head_dim, 1, 0),
            (b + "attn_norm.weight", "norm", e, 1, 0),
            (b + "attn_output.weight", "Q4_K", qd, e, qd ** -0.5),
            (b + "attn_q.weight", kq("Q4_K"), e, qd, e ** -0.5),
            (b + "attn_q_norm.weight", "norm", s.head_dim, 1, 0),
            (b + "attn_v.weight", kq("Q6_K" if more else "Q4_K"), e, kvd, e ** -0.5),
            (b + "ffn_down.weight", "Q6_K" if more else "Q4_K", f, e, f ** -0.5),
            (b + "ffn_gate.weight", kq("Q4_K"), e, f, e ** -0.5),
            (b + "ffn_norm.weight", "norm", e, 1, 0),
            (b + "ffn_up.weight", kq("Q4_K"), e, f, e ** -0.5),
            (b + "post_attention_norm.weight", "norm", e, 1, 0),
            (b + "post_ffw_norm.weight", "norm", e, 1, 0)]
