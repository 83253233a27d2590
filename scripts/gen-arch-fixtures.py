#!/usr/bin/env python3
"""Record llama.cpp's outputs on the tiny llama/qwen2/qwen3/qwen35/qwen3moe models
(scripts/gen-tiny-models.py) as the oracle of tests/test_archs.c and
tests/test_bpe.c, so CI needs no llama.cpp.

tests/fixtures/arch-ARCH.json + arch-ARCH.bin, for each architecture: per
prompt, llama.cpp's prompt ids, its 16 greedy tokens, their text up to the
first end-of-generation token (where q4khost run stops) and, at every
prompt position and teacher-forced decode step, the top-8 logits, the top-2
margin and the final hidden state (after output_norm; float32 rows in the
.bin).
The C test rebuilds the full logits as dequant(LM head) . hidden in double;
rebuild_cosine records how close that is to llama.cpp's own logits.
scripts/oracle-f64.py runs the same ids through the exact float64 forward
pass (tests/fixtures/oracle-f64-NAME.json and .bin); rerun it after this.

tests/fixtures/tokenizer-bpe.json: for the llama ("llama-bpe"
pre-tokenizer) and qwen2 ("qwen2") vocabularies, and qwen2's with the "gpt-2"
pre-tokenizer, llama.cpp's ids and
detokenization of a corpus of tricky strings (the Gemma corpus of
scripts/gen-tokenizer-fixture.py plus cases for these vocabularies), pieces,
and end-of-generation sets. (Chat formatting: scripts/gen-chat-fixture.py.)

Oracle: llama-cpp-python (CPU, flash attention off, F16 KV cache: its
defaults), gguf-py for the dequantized LM head. For qwen35 llama.cpp runs
the whole prompt as one batch (its chunked or fused form of the delta
rule) and every decode step through its one-token form.
Usage: scripts/gen-arch-fixtures.py [FIXTURES_DIR [NAME...]]
(NAME...: only those models' fixtures, not the tokenizer's; all by
default. A model NAME is tests/fixtures/tiny-NAME.gguf.)
"""
import ctypes
import importlib.util
import json
import os
import sys
import tempfile

from scripthelp import answer_help
answer_help(__doc__)  # before what may be missing

import llama_cpp
import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 16
TOPK = 8
# Each model's file is tests/fixtures/tiny-NAME.gguf (scripts/gen-tiny-models.py).
ARCHS = ["llama", "qwen2", "qwen3", "qwen35", "llama-ropefreqs", "qwen2-yarn", "qwen3moe"]
PROMPTS = [
    "The capital of France is",
    "1, 2, 3, 4, 5, 6,",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "Once upon a time, in a land far away, there lived a small dragon who",
    ("The history of computing is longer than the history of computing hardware and "
     "modern computing technology and includes the history of methods intended for pen "
     "and paper or for chalk and slate, with or without the aid of tables."),
]


def load_gemma_corpus():
    """corpus() and random_corpus() of the Gemma tokenizer fixture."""
    spec = importlib.util.spec_from_file_location(
        "gen_tokenizer_fixture", os.path.join(HERE, "gen-tokenizer-fixture.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def bpe_corpus():
    """Cases that matter to byte-level BPE and these vocabularies."""
    c = []

    def add(name, text, add_bos=True, special=False):
        c.append((name, text.encode("utf-8") if isinstance(text, str) else text, add_bos, special))

    add("contractions_upper", "I'M HE'S THEY'LL WE'D YOU'RE IT'S CAN'T Don'T")
    add("apostrophes", "'s 's's ''s rock'n'roll l'été")
    add("digits_grouping", "1 12 123 1234 12345 123456 1234567 x12345y 3.14159265358979")
    add("digits_unicode", "٠١٢٣٤٥٦٧٨٩ ①②③ ²³ ½ Ⅻ 𝟘𝟙𝟚")
    add("whitespace_unicode", "a\u00a0b\u2003c\u3000d\u2028e\u0085f\u200bg")
    add("spaces_newlines", "a \n b  \n\n  c   \r\n   d\n \n")
    add("trailing_ws_runs", "x   \t\t  ")
    add("punct_newlines", "end.\n\n\nNext!!!\r\n\r\n?")
    add("letters_after_punct", "(hello)[world]{foo}<bar>\"baz\" 'qux'")
    add("cjk_mixed", "中文English混合123テスト")
    add("emoji_mixed", "ok👍🏽yes🎉🎉 fine")
    add("chatml_plain", "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")
    add("chatml_special", "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n", special=True)
    add("llama3_special",
        "<|start_header_id|>user<|end_header_id|>\n\nhello<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n", special=True)
    add("llama3_plain", "<|start_header_id|>user<|end_header_id|>")
    add("bos_in_text", "<|begin_of_text|>hi<|endoftext|>", special=True)
    add("user_defined", "<think>\nhmm\n</think>\n\n<tool_call>{}</tool_call>")
    add("user_defined_special", "<think>x</think>", special=True)
    add("fim_special", "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>", special=True)
    add("near_special", "<|im_start <|im_end| |im_start|> <|eot_id|", special=True)
    add("long_word", "Pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism")
    add("code_indent", "\tif (x) {\n\t\treturn y;\n\t}\n        spaces\n")
    return c


def piece(vocab, tok, special):
    buf = ctypes.create_string_buffer(512)
    n = llama_cpp.llama_token_to_piece(vocab, tok, buf, len(buf), 0, special)
    if n < 0:
        raise RuntimeError("piece of %d needs %d bytes" % (tok, -n))
    return buf.raw[:n]


def gpt2_vocab(qwen2):
    """A temporary copy of tiny-qwen2.gguf whose tokenizer.ggml.pre is
    "gpt-2" (the same length as "qwen2": the test patches it alike)."""
    with open(qwen2, "rb") as f:
        data = bytearray(f.read())
    key = b"tokenizer.ggml.pre"
    at = data.index(key) + len(key) + 12
    assert data[at:at + 5] == b"qwen2"
    data[at:at + 5] = b"gpt-2"
    fd, path = tempfile.mkstemp(suffix=".gguf")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def tokenizer_doc(fixtures, gemma):
    doc = {"generator": "scripts/gen-arch-fixtures.py",
           "oracle": "llama.cpp via llama-cpp-python %s" % llama_cpp.__version__,
           "vocabularies": {}}
    corpus = gemma.corpus() + bpe_corpus() + gemma.random_corpus(200)
    for arch in ("llama", "qwen2", "gpt2"):
        model = os.path.join(fixtures, "tiny-%s.gguf" % arch)
        if arch == "gpt2":
            model = gpt2_vocab(os.path.join(fixtures, "tiny-qwen2.gguf"))
        llm = llama_cpp.Llama(model_path=model, vocab_only=True, verbose=False)
        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        cases = []
        for name, text, add_bos, special in corpus:
            ids = llm.tokenize(text, add_bos=add_bos, special=special)
            case = {"name": name}
            case.update(gemma.text_fields("text", text))
            case.update({"add_bos": add_bos, "parse_special": special, "ids": ids,
                         "detok_hex": b"".join(piece(vocab, t, False) for t in ids).hex()})
            cases.append(case)
        pieces = [[t, piece(vocab, t, False).hex(), piece(vocab, t, True).hex()]
                  for t in range(n_vocab)]
        doc["vocabularies"][arch] = {
            "model": "tiny-%s.gguf" % ("qwen2" if arch == "gpt2" else arch),
            "n_vocab": n_vocab,
            "bos": llama_cpp.llama_vocab_bos(vocab),
            "eos": llama_cpp.llama_vocab_eos(vocab),
            "eog": [t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)],
            "cases": cases,
            "pieces": pieces,
        }
        if arch == "gpt2":
            os.remove(model)
        print("tokenizer %s: %d cases" % (arch, len(cases)), file=sys.stderr)
    return doc


def oracle(fixtures, arch):
    model = os.path.join(fixtures, "tiny-%s.gguf" % arch)
    reader = GGUFReader(model)
    names = {t.name: t for t in reader.tensors}
    head = names.get("output.weight", names["token_embd.weight"])
    n_vocab, n_embd = int(head.shape[1]), int(head.shape[0])
    lm_head = dequantize(head.data, head.tensor_type).reshape(n_vocab, n_embd).astype(np.float64)
    llm = llama_cpp.Llama(model_path=model, n_ctx=512, n_batch=512, logits_all=True,
                          embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_NONE,
                          n_threads=os.cpu_count(), flash_attn=False, verbose=False)
    hidden, cases = [], []

    def record(n):
        logits = np.array(llm.scores[llm.n_tokens - n:llm.n_tokens], dtype=np.float64)
        ptr = llama_cpp.llama_get_embeddings(llm._ctx.ctx)
        hid = np.ctypeslib.as_array(ptr, shape=(n, n_embd)).astype(np.float32).copy()
        rows = []
        for i in range(n):
            z = logits[i]
            order = np.argsort(-z, kind="stable")[:TOPK]
            rebuilt = lm_head @ hid[i].astype(np.float64)
            rows.append({
                "hidden_row": len(hidden),
                "top_ids": [int(t) for t in order],
                "top_logits": [float(z[t]) for t in order],
                "margin": float(z[order[0]] - z[order[1]]),
                "rebuild_cosine": float(z @ rebuilt / (np.linalg.norm(z) * np.linalg.norm(rebuilt))),
            })
            hidden.append(hid[i])
        return rows

    for text in PROMPTS:
        llm.reset()
        ids = llm.tokenize(text.encode(), add_bos=True, special=False)
        llm.eval(ids)
        positions = record(len(ids))
        gen = []
        for _ in range(STEPS):
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            gen.append(tok)
            llm.eval([tok])
            positions += record(1)
        # what q4khost run prints: the tokens before the first end of generation
        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        shown = next((i for i, t in enumerate(gen) if llama_cpp.llama_vocab_is_eog(vocab, t)),
                     len(gen))
        cases.append({"prompt": text, "tokens": [int(t) for t in ids], "greedy": gen,
                      "text": llm.detokenize(gen[:shown]).decode("utf-8", "replace"),
                      "positions": positions})
        greedy_margins = [p["margin"] for p in positions[len(ids) - 1:-1]]
        print("%s: %3d prompt tokens, min greedy margin %.3f, min rebuild cosine %.6f: %r" % (
            arch, len(ids), min(greedy_margins), min(p["rebuild_cosine"] for p in positions),
            cases[-1]["text"]), file=sys.stderr)
    np.stack(hidden).astype("<f4").tofile(os.path.join(fixtures, "arch-%s.bin" % arch))
    return {"source": "llama-cpp-python %s (CPU, flash attention off, F16 KV cache), gguf-py "
                      "dequantizers; regenerate with scripts/gen-arch-fixtures.py" % llama_cpp.__version__,
            "model": os.path.basename(model), "n_embd": n_embd, "n_vocab": n_vocab,
            "hidden_rows": len(hidden), "cases": cases}


def main():
    fixtures = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "tests", "fixtures")
    archs = sys.argv[2:] or ARCHS
    for arch in archs:
        if arch not in ARCHS:
            sys.exit("gen-arch-fixtures: unknown model %s (known: %s)" % (arch, ", ".join(ARCHS)))
        with open(os.path.join(fixtures, "arch-%s.json" % arch), "w") as f:
            json.dump(oracle(fixtures, arch), f, indent=0)
            f.write("\n")
    if sys.argv[2:]:
        return
    with open(os.path.join(fixtures, "tokenizer-bpe.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_doc(fixtures, load_gemma_corpus()), f, ensure_ascii=False, indent=0)
        f.write("\n")


if __name__ == "__main__":
    main()
