#!/usr/bin/env python3
"""Write the committed GGUF seeds of the gguf fuzz target
(tests/fuzz/seeds/gguf): the smallest complete models the loader accepts,
so the fuzzer reaches the architecture loaders, the tokenizers and the chat
formats at once instead of through megabytes of real vocabulary
(scripts/fuzz.sh adds the real files at run time).

 - mini-llama.gguf: architecture llama, a byte-level BPE ("gpt2",
   pre-tokenizer llama-bpe) vocabulary of the 256 byte stand-ins, a few
   merges and Llama 3's special tokens, the Llama 3 chat template;
 - mini-gemma3.gguf: architecture gemma3, a SentencePiece ("llama")
   vocabulary of <0xXX> byte tokens, a few pieces and Gemma's turn tokens.
Both: hidden size 8, one layer, F32 weights of zeros (weights are not
what the target reads).

Usage: scripts/gen-fuzz-seeds.py [OUT_DIR]
"""
import os
import sys

from scripthelp import answer_help
answer_help(__doc__)  # before what may be missing

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import synthgguf  # noqa: E402

N_EMBD, N_FF, N_HEAD = 8, 16, 2


def layer(w, arch):
    b = "blk.0."
    names = [("attn_norm", N_EMBD, 1), ("attn_q", N_EMBD, N_EMBD), ("attn_k", N_EMBD, N_EMBD // N_HEAD),
             ("attn_v", N_EMBD, N_EMBD // N_HEAD), ("attn_output", N_EMBD, N_EMBD),
             ("ffn_norm", N_EMBD, 1), ("ffn_gate", N_EMBD, N_FF), ("ffn_up", N_EMBD, N_FF),
             ("ffn_down", N_FF, N_EMBD)]
    if arch == "gemma3":
        names += [("attn_q_norm", N_EMBD // N_HEAD, 1), ("attn_k_norm", N_EMBD // N_HEAD, 1),
                  ("post_attention_norm", N_EMBD, 1), ("post_ffw_norm", N_EMBD, 1)]
    for name, ne0, ne1 in names:
        w.tensor(b + name + ".weight", "F32", ne0, ne1)


def write(path, arch, tokens, types, extra):
    w = synthgguf.Writer()
    p = arch + "."
    w.add("general.architecture", arch)
    w.add(p + "context_length", 64)
    w.add(p + "embedding_length", N_EMBD)
    w.add(p + "block_count", 1)
    w.add(p + "feed_forward_length", N_FF)
    w.add(p + "attention.head_count", N_HEAD)
    w.add(p + "attention.head_count_kv", 1)
    w.add(p + "attention.layer_norm_rms_epsilon", 1e-6)
    for key, value in extra:
        w.add(key, value)
    w.add("tokenizer.ggml.tokens", tokens)
    w.add("tokenizer.ggml.token_type", types)
    w.tensor("token_embd.weight", "F32", N_EMBD, len(tokens))
    w.tensor("output_norm.weight", "F32", N_EMBD, 1)
    layer(w, arch)
    sizes = {name: synthgguf.tensor_bytes(q, ne0, ne1, ne2) for name, q, ne0, ne1, ne2 in w.tensors}
    w.write(path, lambda name: bytes(sizes[name]))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "tests", "fuzz", "seeds", "gguf")
    os.makedirs(out, exist_ok=True)

    specials = ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]
    pieces = ["\u0120t", "he", "\u0120the", "in"]
    tokens = synthgguf.byte_tokens() + pieces + specials
    types = [synthgguf.NORMAL] * (len(tokens) - len(specials)) + [synthgguf.CONTROL] * len(specials)
    write(os.path.join(out, "mini-llama.gguf"), "llama", tokens, types, [
        ("llama.rope.dimension_count", N_EMBD // N_HEAD),
        ("tokenizer.ggml.model", "gpt2"), ("tokenizer.ggml.pre", "llama-bpe"),
        ("tokenizer.ggml.merges", ["\u0120 t", "h e", "\u0120t he", "i n"]),
        ("tokenizer.ggml.bos_token_id", tokens.index("<|begin_of_text|>")),
        ("tokenizer.ggml.eos_token_id", tokens.index("<|eot_id|>")),
        ("tokenizer.ggml.add_bos_token", True),
        ("tokenizer.chat_template", synthgguf.LLAMA3_TEMPLATE)])

    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    pieces = ["\u2581", "\u2581the", "he", "\u2581t", "in"]
    byte_toks = ["<0x%02X>" % b for b in range(256)]
    tokens = specials + byte_toks + pieces
    types = [synthgguf.CONTROL] * 3 + [2] + [synthgguf.CONTROL] * 2 + [6] * 256 + \
        [synthgguf.NORMAL] * len(pieces)
    write(os.path.join(out, "mini-gemma3.gguf"), "gemma3", tokens, types, [
        ("gemma3.attention.key_length", N_EMBD // N_HEAD),
        ("gemma3.attention.value_length", N_EMBD // N_HEAD),
        ("gemma3.attention.sliding_window", 16),
        ("gemma3.rope.freq_base", 1000000.0),
        ("tokenizer.ggml.model", "llama"),
        ("tokenizer.ggml.scores", [0.0] * (len(tokens) - len(pieces)) + [-1.0, -2.0, -3.0, -4.0, -5.0]),
        ("tokenizer.ggml.bos_token_id", 2), ("tokenizer.ggml.eos_token_id", 1),
        ("tokenizer.ggml.add_space_prefix", False),
        ("tokenizer.chat_template", "{{ bos_token }}<start_of_turn>user\n")])


if __name__ == "__main__":
    main()
