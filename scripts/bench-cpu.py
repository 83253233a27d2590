#!/usr/bin/env python3
"""CPU benchmark: q4khost's fast cpu path (the cpu-fast backend with the
cpu-simd kernel variant), the reference cpu backend with cpu-simd, and,
with --reference, the reference alone (its built-in kernels), next to
llama.cpp on the same file, the same prompt and the same thread count, in
one run.

Prefill: one batched forward over the prompt (q4khost with --raw, so
both engines see the same tokens: no chat template); decode: N greedy
tokens, one at a time through the KV cache. q4khost's figures come from its own report
(`q4khost run --json`, which also names the kernel behind every weight
type); llama.cpp's from llama-cpp-python timed around eval(). Prints a
Markdown table row per engine for docs/perf.md.

With --repeat R each engine runs R times, interleaved, and the table
holds the median of each figure: a shared machine's load then weighs on
every engine alike. The load average (1 minute) is printed before and
after, and the table ends with each q4khost row's ratio to llama.cpp.

Usage: scripts/bench-cpu.py Q4KHOST-BINARY [MODEL] [--threads N] [--decode N]
                            [--repeat R] [--reference]
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


def bench_q4khost(binary, model, threads, decode, backend, kernel):
    env = dict(os.environ)
    cfg = os.path.join(os.environ.get("TMPDIR", "/tmp"), "q4khost-bench.ini")
    with open(cfg, "w") as f:
        for plugin in ("cpu", "cpu-simd", "cpu-fast"):
            f.write(f"[plugin.{plugin}]\nthreads = {threads}\n\n")
    out = subprocess.run([binary, "run", "-m", model, "-p", PROMPT, "-n", str(decode),
                          "--config", cfg, "--backend", backend, "--kernel", kernel,
                          "--raw", "--json"],
                         capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise SystemExit(f"bench-cpu.py: q4khost run --backend {backend} --kernel {kernel} "
                         f"exited {out.returncode}:\n{out.stderr.strip()}")
    r = json.loads(out.stdout)
    return (r["prefill"]["tokens"], r["prefill"]["tokens_per_second"],
            r["decode"]["tokens"], r["decode"]["tokens_per_second"])


def bench_llama(model, threads, decode):
    import llama_cpp
    import numpy as np
    llm = llama_cpp.Llama(model_path=model, n_ctx=512, n_batch=512, n_threads=threads,
                          n_threads_batch=threads, verbose=False)
    ids = llm.tokenize(PROMPT.encode(), add_bos=True, special=False)
    # The last token's logits, read in place: llama-cpp-python 0.3.36 keeps
    # them in llm.scores only with logits_all.
    n_vocab = llm.n_vocab()

    def greedy():
        return int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))))

    llm.eval(ids[:4])  # warm up
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    prefill = time.perf_counter() - t0
    tok = greedy()
    t0 = time.perf_counter()
    for _ in range(decode - 1):
        llm.eval([tok])
        tok = greedy()
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
    ap.add_argument("--reference", action="store_true",
                    help="also the reference cpu backend with its built-in kernels")
    a = ap.parse_args()

    def q4k(backend, kernel):
        return lambda: bench_q4khost(a.binary, a.model, a.threads, a.decode, backend, kernel)
    engines = [("q4khost cpu-fast + cpu-simd", q4k("cpu-fast", "cpu-simd")),
               ("q4khost cpu (reference) + cpu-simd", q4k("cpu", "cpu-simd"))]
    if a.reference:
        engines.append(("q4khost cpu (reference, built-in kernels)", q4k("cpu", "none")))
    llama = "llama.cpp (llama-cpp-python, CPU)"
    engines.append((llama, lambda: bench_llama(a.model, a.threads, a.decode)))
    runs = {name: [] for name, _ in engines}
    load = [os.getloadavg()[0]]
    for _ in range(a.repeat):
        for name, fn in engines:
            runs[name].append(fn())
    load.append(os.getloadavg()[0])
    med = {name: (statistics.median(r[1] for r in runs[name]),
                  statistics.median(r[3] for r in runs[name])) for name, _ in engines}
    print(f"load average (1 min): {load[0]:.2f} before, {load[1]:.2f} after")
    print("| engine | threads | prompt tokens | prefill tokens/s | decode tokens | decode tokens/s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, _ in engines:
        pt, _, dt, _ = runs[name][0]
        print(f"| {name} | {a.threads} | {pt} | {med[name][0]:.1f} | {dt} | {med[name][1]:.2f} |")
    for name, _ in engines[:-1]:
        print(f"{name}: prefill {med[name][0] / med[llama][0]:.2f}x, "
              f"decode {med[name][1] / med[llama][1]:.2f}x llama.cpp")


if __name__ == "__main__":
    main()
