#!/usr/bin/env python3
"""Write a synthetic GGUF file with a real model's shapes and random
weights, for benchmarks (never committed: gigabytes).

  llama3-8b     "llama": 4096 hidden, 32 layers, 32/8 heads (128 each),
                14336 FFN, 128256 tokens, separate LM head; about 4.6 GiB
  qwen2.5-1.5b  "qwen2": 1536 hidden, 28 layers, 12/2 heads (128 each),
                8960 FFN, 151936 tokens, q/k/v biases, tied LM head;
                about 1.0 GiB
  gemma3-270m   "gemma3": 640 hidden, 18 layers, 4/1 heads (256 each),
                2048 FFN, 262144 tokens, q/k norms, post-attention and
                post-FFN norms, a sliding window of 512 on 5 layers of 6,
                tied LM head; about 0.24 GiB (the default model's shape:
                keys, tensor names, types and order as in
                gemma-3-270m-q4_k_m.gguf)
  qwen35-4b     "qwen35" (Qwen3.5-4B): 2560 hidden, 32 layers, 9216 FFN,
                gated full attention on every 4th layer (3, 7, .., 31: 16/4
                heads of 256, q/k norms, RoPE base 1e7 on 64 of the 256
                values, sections [11, 11, 10, 0]), gated delta-net linear
                attention on the other 24 (16 key and 32 value heads of 128,
                a 4-tap convolution), 248320 tokens, tied LM head; keys and
                tensors as llama.cpp's converter writes them, without the
                multi-token-prediction layer (its --no-mtp; q4khost does not
                run one); about 2.5 GiB (2,703,462,176 bytes)
  qwen3-30b-a3b "qwen3moe" (Qwen3-30B-A3B): 2048 hidden, 48 layers, 32/4
                heads (128 each), q/k norms, in every layer 128 SwiGLU
                experts of 768, 8 a token (a random F32 router: every
                expert about as busy), 151936 tokens, separate LM head;
                about 17 GiB

Types as in a Q4_K_M file: Q4_K for the matrices, Q6_K for attn_v and
ffn_down on the layers llama.cpp's Q4_K_M gives more bits to, Q6_K for the
LM head (token_embd when tied), F32 norms and biases; qwen35-4b as
llama-quantize of llama-cpp-python 0.3.36's llama.cpp makes it, which
counts each delta-net layer's attn_qkv as its attn_v (Q6_K on the same
layers), keeps ssm_conv1d F32 (as are the 1-D ssm_a, ssm_dt.bias and
ssm_norm), quantizes attn_gate, ssm_alpha, ssm_beta and ssm_out as any
matrix (Q4_K) and orders the tensors by layer, by name within one;
qwen3-30b-a3b's experts as
stacks {n_embd, 768, 128} (gate and up Q4_K, down Q6_K on the layers given
more bits, else Q4_K), its router ffn_gate_inp F32 as llama-quantize keeps
it; gemma3-270m as its
Q4_K_M file has them, where rows of 640 values cannot be k-quants: Q8_0
token_embd and Q5_0 attn_q, attn_k, ffn_gate and ffn_up, attn_v Q8_0 on
the layers given more bits and Q5_0 on the others, Q4_K attn_output,
ffn_down Q6_K or Q4_K. Weights are random
quantization blocks (scripts/synthgguf.py): the speed of a real file of
that shape, not its text. The vocabulary is synthetic but complete: the
256 byte tokens, the family's special tokens (Llama 3 headers, ChatML) and
unused padding tokens up to the real size, so q4khost run works on it
(prompts tokenize to bytes); gemma3-270m's is a SentencePiece vocabulary
with Gemma 3's special, user-defined and byte tokens at their ids and one
normal piece per printable ASCII character and the space (prompts of ASCII
text tokenize to one token per character).

Needs Python 3 and NumPy only (no gguf package, no registry), so it runs
on a GPU machine as it is. Same arguments, same bytes.

Usage: scripts/gen-bench-model.py MODEL OUT.gguf [--layers N] [--seed S]
(--layers: fewer layers, for a quick check of the script itself)
"""
import argparse
import os
import sys

from scripthelp import answer_help
answer_help(__doc__)  # before what may be missing

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import synthgguf  # noqa: E402

MODELS = {
    "llama3-8b": dict(
        shape=synthgguf.Shape("llama", 4096, 32, 14336, 32, 8, 128, 500000.0, 1e-5, 8192,
                              tied=False),
        n_vocab=128256, pre="llama-bpe", specials=synthgguf.LLAMA3_SPECIALS,
        bos="<|begin_of_text|>", eos="<|eot_id|>", add_bos=True,
        template=synthgguf.LLAMA3_TEMPLATE),
    "qwen2.5-1.5b": dict(
        shape=synthgguf.Shape("qwen2", 1536, 28, 8960, 12, 2, 128, 1000000.0, 1e-6, 32768,
                              tied=True, bias=True),
        n_vocab=151936, pre="qwen2", specials=synthgguf.QWEN_SPECIALS,
        bos="<|endoftext|>", eos="<|im_end|>", add_bos=False,
        template=synthgguf.CHATML_TEMPLATE),
    "gemma3-270m": dict(
        shape=synthgguf.Gemma3Shape(640, 18, 2048, 4, 1, 256, 1000000.0, 1e-6, 32768, 512),
        n_vocab=262144),
    # Qwen/Qwen3.5-4B's text config: linear attention 16 key heads and 32
    # value heads of 128, a 4-tap convolution; full attention every 4th
    # layer, 16/4 heads of 256, rope sections [11, 11, 10] (the converter
    # pads them to 4) over n_rot = 256 / 4
    "qwen35-4b": dict(
        shape=synthgguf.Qwen35Shape(2560, 32, 9216, 16, 4, 256, (11, 11, 10, 0), 16, 32, 128,
                                    4, 4, 10000000.0, 1e-6, 262144, tied=True),
        n_vocab=248320, pre="qwen35", specials=synthgguf.QWEN_SPECIALS,
        bos="<|endoftext|>", eos="<|im_end|>", add_bos=False,
        template=synthgguf.CHATML_TEMPLATE),
    # Qwen/Qwen3-30B-A3B's config: intermediate_size 6144 (the dense FFN
    # width the GGUF keeps as feed_forward_length), moe_intermediate_size
    # 768, 128 experts, 8 a token, 40960 positions
    "qwen3-30b-a3b": dict(
        shape=synthgguf.MoeShape(2048, 48, 6144, 32, 4, 128, 1000000.0, 1e-6, 40960, False,
                                 128, 8, 768),
        n_vocab=151936, pre="qwen2", specials=synthgguf.QWEN_SPECIALS,
        bos="<|endoftext|>", eos="<|im_end|>", add_bos=False,
        template=synthgguf.CHATML_TEMPLATE),
}


def vocabulary(n_vocab, specials):
    """Byte tokens, one merge (two spaces), unused padding, then specials
    at the end of the id range, where the real files keep them."""
    tokens = synthgguf.byte_tokens()
    space = tokens[ord(" ")]
    tokens.append(space + space)
    n_pad = n_vocab - len(tokens) - len(specials)
    tokens += ["[PAD%d]" % (len(tokens) + i) for i in range(n_pad)] + specials
    types = ([synthgguf.NORMAL] * 257 + [synthgguf.UNUSED] * n_pad +
             [synthgguf.CONTROL] * len(specials))
    return tokens, types, [space + " " + space]


def add_bpe_model_keys(w, model, m, add_hparams):
    """The architecture's keys (add_hparams: a function of synthgguf) and
    the byte-level BPE vocabulary of a model with one, into W."""
    add_hparams(w, m["shape"], "synthetic-" + model,
                "random weights in real shapes for benchmarks (scripts/gen-bench-model.py)")
    tokens, types, merges = vocabulary(m["n_vocab"], m["specials"])
    synthgguf.add_tokenizer(w, tokens, types, merges, m["pre"], m["bos"], m["eos"],
                            m["add_bos"], m["template"])


def llama_plan(w, model, m):
    """The keys of a llama-family model into W; its tensors' plan."""
    s = m["shape"]
    add_bpe_model_keys(w, model, m, synthgguf.add_hparams)
    plan = [("token_embd.weight", "Q6_K" if s.tied else "Q4_K", s.n_embd, m["n_vocab"], 1.0),
            ("output_norm.weight", "norm", s.n_embd, 1, 0)]
    if not s.tied:
        plan.append(("output.weight", "Q6_K", s.n_embd, m["n_vocab"], 0.25))
    for il in range(s.n_layer):
        plan += synthgguf.layer_tensors(s, il, 1.0)
    return plan


def qwen3moe_plan(w, model, m):
    """The keys of a qwen3moe model into W; its tensors' plan, llama's
    with each layer's FFN a mixture of experts: the experts' stacks carry
    their count as a sixth field (ne2), the router's values are N(0,
    n_embd^-1/2)."""
    s = m["shape"]
    add_bpe_model_keys(w, model, m, synthgguf.add_moe_hparams)
    w.add("general.quantization_version", 2)
    w.add("general.file_type", 15)  # Q4_K_M
    plan = [("token_embd.weight", "Q4_K", s.n_embd, m["n_vocab"], 1.0),
            ("output_norm.weight", "norm", s.n_embd, 1, 0),
            ("output.weight", "Q6_K", s.n_embd, m["n_vocab"], 0.25)]
    for il in range(s.n_layer):
        plan += [(name, qtype, ne0, ne1, s.n_embd ** -0.5 if std is None else std, ne2)
                 for name, qtype, ne0, ne1, std, ne2 in synthgguf.moe_layer_tensors(s, il, 1.0)]
    return plan


def gemma3_plan(w, model, m):
    """The keys of a gemma3 model into W, in the real file's order; its
    tensors' plan, in the real file's order. The token embedding (the LM
    head too) has a standard deviation of 0.25: scaled by sqrt(n_embd) it
    is about as large as what the 18 layers add to the residual stream."""
    s = m["shape"]
    synthgguf.add_gemma3_hparams(w, s, "synthetic-" + model,
                                 "random weights in real shapes for benchmarks (scripts/gen-bench-model.py)")
    tokens, scores, types = synthgguf.gemma_vocabulary(m["n_vocab"])
    synthgguf.add_spm_tokenizer(w, tokens, scores, types, "<bos>", "<eos>", "<unk>", "<pad>")
    w.add("general.quantization_version", 2)
    w.add("general.file_type", 15)  # Q4_K_M
    plan = [("output_norm.weight", "norm", s.n_embd, 1, 0),
            ("token_embd.weight", "Q8_0", s.n_embd, m["n_vocab"], 0.25)]
    for il in range(s.n_layer):
        plan += synthgguf.gemma3_layer_tensors(s, il)
    return plan


def qwen35_plan(w, model, m):
    """The keys of a qwen35 model into W; its tensors' plan in the order
    llama-quantize writes them (the output tensors, then layer by layer,
    by name within each)."""
    s = m["shape"]
    add_bpe_model_keys(w, model, m, synthgguf.add_qwen35_hparams)
    w.add("general.quantization_version", 2)
    w.add("general.file_type", 15)  # Q4_K_M
    plan = [("output_norm.weight", "norm", s.n_embd, 1, 0),
            ("token_embd.weight", "Q6_K" if s.tied else "Q4_K", s.n_embd, m["n_vocab"], 1.0)]
    if not s.tied:
        plan.insert(0, ("output.weight", "Q6_K", s.n_embd, m["n_vocab"], 0.25))
    for il in range(s.n_layer):
        plan += sorted(synthgguf.qwen35_layer_tensors(s, il, 1.0, wide_qkv=True))
    return plan


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", choices=sorted(MODELS))
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    m = MODELS[a.model]
    s = m["shape"]
    if a.layers:
        s.n_layer = a.layers
    w = synthgguf.Writer()
    plan = {"gemma3": gemma3_plan, "qwen35": qwen35_plan,
            "qwen3moe": qwen3moe_plan}.get(s.arch, llama_plan)(w, a.model, m)
    # a plan's entry: name, type, ne0, ne1, std, and ne2 for a stack
    for name, qtype, ne0, ne1, _, *ne2 in plan:
        synthgguf.declare(w, name, qtype, ne0, ne1, *ne2)
    by_name = {p[0]: p for p in plan}
    rng = np.random.default_rng(a.seed)

    def data(name):
        _, qtype, ne0, ne1, std, *ne2 = by_name[name]
        return synthgguf.tensor_data(rng, qtype, ne0, ne1 * (ne2[0] if ne2 else 1), std)

    # Tensors are asked for in declaration order: one rng stream, one at a
    # time in memory.
    w.write(a.out, data)
    print("%s: %s, %d layers, %.2f GiB" % (a.out, a.model, s.n_layer,
                                           os.path.getsize(a.out) / 2 ** 30))


if __name__ == "__main__":
    main()
