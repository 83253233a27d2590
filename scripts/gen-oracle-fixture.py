#!/usr/bin/env python3
"""Record llama.cpp's outputs on the default model as the oracle fixture.

For each prompt: llama.cpp's token ids (BOS added, raw text: the model has no
chat template), its greedy 32-token continuation, and at every prompt
position and every teacher-forced decode step: the top-8 logits, the top-2
margin, and the final hidden state (after output_norm, the LM head's input).

The C test (tests/test_oracle.c) rebuilds llama.cpp's full logits vector as
dequant(token_embd) . hidden in double, so CI can measure full-vector cosine
without llama.cpp; this script records how close that rebuild is to
llama.cpp's own logits (rebuild_cosine) for every position.

Oracle: llama-cpp-python (CPU build, flash attention off), gguf-py for the
dequantized LM head. Writes tests/fixtures/oracle-gemma3.json and
oracle-gemma3.bin (hidden states, float32 little-endian, row-major); with
--new, oracle-gemma3-new.json and .bin: prompts no other fixture uses, 8
decode steps each, whose ids scripts/oracle-f64.py runs through the exact
float64 forward pass (rerun it after this).

Usage: scripts/gen-oracle-fixture.py [--new] [MODEL]
"""
import json
import os
import sys

from scripthelp import answer_help
answer_help(__doc__)  # before what may be missing

import numpy as np
import llama_cpp
from gguf import GGUFReader
from gguf.quants import dequantize

PROMPTS = [
    "The capital of France is",
    "1, 2, 3, 4, 5, 6,",  # wide top-2 margins on all 32 greedy steps
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Here is a list of the planets of the solar system, in order from the Sun:",
    ("The history of computing is longer than the history of computing hardware "
     "and modern computing technology and includes the history of methods intended "
     "for pen and paper or for chalk and slate, with or without the aid of tables. "
     "Digital computing is intimately tied to the representation of numbers. But long "
     "before abstractions like the number arose, there were mathematical concepts to "
     "serve the purposes of civilization. These concepts are implicit in concrete "
     "practices such as one-to-one correspondence, the basis of counting. In this "
     "article we summarize the main steps in the development of"),
]
STEPS = 32
# --new: prose, a question, code, German, French and numbers
NEW_PROMPTS = [
    "Water boils at sea level at a temperature of",
    "Q: Which planet is known as the Red Planet?\nA:",
    "SELECT name, email FROM customers WHERE",
    "Die Hauptstadt von Deutschland ist",
    "Le petit chat dort sur",
    "In 1969, Neil Armstrong became the first person to",
]
NEW_STEPS = 8
TOPK = 8


def main():
    args = sys.argv[1:]
    new = args[:1] == ["--new"]
    args = args[1:] if new else args
    name, prompts, steps = (("oracle-gemma3-new", NEW_PROMPTS, NEW_STEPS) if new
                            else ("oracle-gemma3", PROMPTS, STEPS))
    model = args[0] if args else os.path.expanduser(
        "~/.cache/q4khost/models/gemma-3-270m-q4_k_m.gguf")
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
    reader = GGUFReader(model)
    emb = next(t for t in reader.tensors if t.name == "token_embd.weight")
    n_vocab, n_embd = int(emb.shape[1]), int(emb.shape[0])
    lm_head = dequantize(emb.data, emb.tensor_type).reshape(n_vocab, n_embd).astype(np.float64)

    llm = llama_cpp.Llama(model_path=model, n_ctx=1024, n_batch=512, logits_all=True,
                          embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_NONE,
                          n_threads=os.cpu_count(), flash_attn=False, verbose=False)
    hidden_rows = []
    cases = []

    def record(n_tokens):
        """Rows for the last n_tokens evaluated: logits, hidden, checks."""
        logits = np.array(llm.scores[llm.n_tokens - n_tokens:llm.n_tokens], dtype=np.float64)
        ptr = llama_cpp.llama_get_embeddings(llm._ctx.ctx)
        hid = np.ctypeslib.as_array(ptr, shape=(n_tokens, n_embd)).astype(np.float32).copy()
        rows = []
        for i in range(n_tokens):
            z = logits[i]
            order = np.argsort(-z, kind="stable")[:TOPK]
            rebuilt = lm_head @ hid[i].astype(np.float64)
            cos = float(z @ rebuilt / (np.linalg.norm(z) * np.linalg.norm(rebuilt)))
            rows.append({
                "hidden_row": len(hidden_rows),
                "top_ids": [int(t) for t in order],
                "top_logits": [float(z[t]) for t in order],
                "margin": float(z[order[0]] - z[order[1]]),
                "rebuild_cosine": cos,
            })
            hidden_rows.append(hid[i])
        return rows

    for text in prompts:
        llm.reset()
        ids = llm.tokenize(text.encode(), add_bos=True, special=False)
        llm.eval(ids)
        positions = record(len(ids))
        gen = []
        for step in range(steps):
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            gen.append(tok)
            llm.eval([tok])
            positions += record(1)
        cases.append({
            "prompt": text,
            "tokens": [int(t) for t in ids],
            "greedy": gen,
            "text": llm.detokenize(gen).decode("utf-8", "replace"),
            "positions": positions,
        })
        print(f"{len(ids):4d} prompt tokens, min margin "
              f"{min(p['margin'] for p in positions):.3f}, "
              f"min rebuild cosine {min(p['rebuild_cosine'] for p in positions):.6f}: "
              f"{cases[-1]['text']!r}", file=sys.stderr)

    np.stack(hidden_rows).astype("<f4").tofile(os.path.join(out_dir, name + ".bin"))
    meta = {
        "source": f"llama-cpp-python {llama_cpp.__version__} (CPU, flash attention off), "
                  "gguf-py dequantizers; regenerate with scripts/gen-oracle-fixture.py",
        "model_sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        "n_embd": n_embd,
        "n_vocab": n_vocab,
        "hidden_rows": len(hidden_rows),
        "cases": cases,
    }
    with open(os.path.join(out_dir, name + ".json"), "w") as f:
        json.dump(meta, f, indent=1)


if __name__ == "__main__":
    main()
