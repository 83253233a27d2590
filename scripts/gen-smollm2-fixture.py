#!/usr/bin/env python3
"""Record llama.cpp's greedy text on SmolLM2-135M-Instruct's Q4_1 file
(scripts/fetch-smollm2.py) as the oracle of tests/test_smollm2.c.

tests/fixtures/smollm2-q4_1.json: per prompt (raw text, BOS as the
vocabulary asks), llama.cpp's prompt ids, its STEPS greedy tokens, the
top-2 margin of the logits at each greedy pick, and the text of the
tokens before the first end-of-generation token (what q4khost run
prints).

Oracle: llama-cpp-python (CPU, flash attention off, F16 KV cache: its
defaults), one batch for the prompt and one token per decode step.
Usage: scripts/gen-smollm2-fixture.py [MODEL [OUT]]
MODEL defaults to the path scripts/fetch-smollm2.py fills, OUT to
tests/fixtures/smollm2-q4_1.json beside this script.
"""
import json
import os
import sys

from scripthelp import answer_help
answer_help(__doc__)  # before what may be missing

import llama_cpp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wheelfetch import sha256  # noqa: E402

STEPS = 32
# Prompts whose 32 greedy tokens the exact float64 forward pass
# (scripts/oracle-f64.py's, on these ids) picks too. Not "The capital of
# France is": there llama.cpp, whose Q4_1 products take 8-bit activations,
# picks " United" at step 5 where the exact pass picks " answer" by 0.22.
PROMPTS = [
    "Once upon a time, in a land far away, there lived a small dragon who",
    "def fibonacci(n):\n",
]


def default_model():
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(cache, "q4khost", "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    model = sys.argv[1] if len(sys.argv) > 1 else default_model()
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
        here, "..", "tests", "fixtures", "smollm2-q4_1.json")
    llm = llama_cpp.Llama(model_path=model, n_ctx=512, n_batch=512, logits_all=True,
                          n_threads=os.cpu_count(), flash_attn=False, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    cases = []
    for text in PROMPTS:
        llm.reset()
        ids = llm.tokenize(text.encode(), add_bos=True, special=False)
        llm.eval(ids)
        gen, margins = [], []
        for _ in range(STEPS):
            z = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
            top = np.argsort(-z, kind="stable")[:2]
            gen.append(int(top[0]))
            margins.append(float(z[top[0]] - z[top[1]]))
            llm.eval([gen[-1]])
        # what q4khost run prints: the tokens before the first end of generation
        shown = next((i for i, t in enumerate(gen) if llama_cpp.llama_vocab_is_eog(vocab, t)),
                     len(gen))
        cases.append({"prompt": text, "tokens": [int(t) for t in ids], "greedy": gen,
                      "margins": margins,
                      "text": llm.detokenize(gen[:shown]).decode("utf-8", "replace")})
        print("%3d prompt tokens, min greedy margin %.3f: %r" % (
            len(ids), min(margins[:max(shown, 1)]), cases[-1]["text"]), file=sys.stderr)
    doc = {"source": "llama-cpp-python %s (CPU, flash attention off, F16 KV cache); "
                     "regenerate with scripts/gen-smollm2-fixture.py" % llama_cpp.__version__,
           "model": os.path.basename(model), "model_sha256": sha256(model),
           "steps": STEPS, "cases": cases}
    with open(out, "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"{out}: {len(cases)} prompts, {STEPS} greedy tokens each", file=sys.stderr)


if __name__ == "__main__":
    main()
