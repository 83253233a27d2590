#!/usr/bin/env python3
"""CPU benchmark: q4khost's cpu plugin, alone (the reference's built-in
kernels) and with the cpu-simd kernel variant, next to llama.cpp on the same
file, the same prompt and the same thread count, in one run.

Prefill: one batched forward over the prompt; decode: N greedy tokens, one
at a time through the KV cache. q4khost's figures come from its own report
(`q4khost run --json`, which also names the kernel behind every weight
type); llama.cpp's from llama-cpp-python timed around eval(). Prints a
Markdown table row per engine for docs/perf.md.

With --repeat R each engine runs R times, interleaved, and the table
holds the median of each figure: a shared machine's load then weighs on
every engine alike.

Usage: scripts/bench-cpu.py Q4KHOST-BINARY [MODEL] [--threads N] [--decode N]
                            [--repeat R]
"""
import argparse
import json
import os
import statistics
import subprocess
import time

PROMPT = ("The history of computing is longer than the history of computing hardware "
          "and modern computing technology and includes the history of methods intended "
          "for pen and paper or for chalk and slate, with or without the aid of tables.")


def bench_q4khost(binary, model, threads, decode, kernel):
    env = dict(os.environ)
    cfg = os.path.join(os.environ.get("TMPDIR", "/tmp"), "q4khost-bench.ini")
    with open(cfg, "w") as f:
        f.write(f"[plugin.cpu]\nthreads = {threads}\n\n"
                f"[plugin.cpu-simd]\nthreads = {threads}\n")
    out = subprocess.run([binary, "run", "-m", model, "-p", PROMPT, "-n", str(decode),
                          "--config", cfg, "--kernel", kernel, "--json"],
                         check=True, capture_output=True, text=True, env=env).stdout
    r = json.loads(out)
    return (r["prefill"]["tokens"], r["prefill"]["tokens_per_second"],
            r["decode"]["tokens"], r["decode"]["tokens_per_second"])


def bench_llama(model, threads, decode):
    import llama_cpp
    import numpy as np
    llm = llama_cpp.Llama(model_path=model, n_ctx=512, n_batch=512, n_threads=threads,
                          n_threads_batch=threads, verbose=False)
    ids = llm.tokenize(PROMPT.encode(), add_bos=True, special=False)
    llm.eval(ids[:4])  # warm up
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    prefill = time.perf_counter() - t0
    tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    t0 = time.perf_counter()
    for _ in range(decode - 1):
        llm.eval([tok])
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    dec = time.perf_counter() - t0
    return len(ids), len(ids) / prefill, decode, (decode - 1) / dec


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("model", nargs="?", default=os.path.expanduser(
        "~/.cache/q4khost/models/gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=1)
    a = ap.parse_args()
    engines = [("q4khost cpu plugin (built-in kernels)",
                lambda: bench_q4khost(a.binary, a.model, a.threads, a.decode, "none")),
               ("q4khost cpu plugin + cpu-simd",
                lambda: bench_q4khost(a.binary, a.model, a.threads, a.decode, "cpu-simd")),
               ("llama.cpp (llama-cpp-python, CPU)",
                lambda: bench_llama(a.model, a.threads, a.decode))]
    runs = {name: [] for name, _ in engines}
    for _ in range(a.repeat):
        for name, fn in engines:
            runs[name].append(fn())
    print("| engine | threads | prompt tokens | prefill tokens/s | decode tokens | decode tokens/s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, _ in engines:
        pt, _, dt, _ = runs[name][0]
        pr = statistics.median(r[1] for r in runs[name])
        dr = statistics.median(r[3] for r in runs[name])
        print(f"| {name} | {a.threads} | {pt} | {pr:.1f} | {dt} | {dr:.2f} |")


if __name__ == "__main__":
    main()
