#!/usr/bin/env python3
"""Load an OpenAI-compatible server as C concurrent clients and measure what
they get: aggregate generated tokens per second, time to first token, and
each request's decode speed. The same client for q4khost serve and
llama-server (scripts/bench-engines.sh --serve runs both on one file).

Each client sends N streamed POST /v1/completions requests one after the
other, greedy, of a P-token prompt (one token per character on the
benchmark vocabularies of scripts/gen-bench-model.py) that differs per
request at its start, so that no server can reuse another request's
prompt; "ignore_eos": true makes every answer GEN tokens long on both
servers (an end-of-generation token does not end it), and "cache_prompt":
false asks llama-server for the same prefill as q4khost (which ignores
fields it does not know). With
--shared-tokens S the first S tokens are the same in every request (a
system prompt all clients share) and the request's own part comes after
them, with "cache_prompt": true: what prefix reuse saves (q4khost serve's
--prefix-cache, docs/serve.md section 5; llama-server's slot cache). Tokens
are counted from the final usage chunk, else one per streamed chunk; the
first token's time is that of the first chunk with a choice, text or not
(a server holds back bytes that do not yet make a UTF-8 character, and
the benchmark models' random weights produce many such bytes).

    serve-load.py URL --clients C [--requests N] [--prompt-tokens P]
                  [--shared-tokens S] [--max-tokens G] [--label NAME] [--json]

Prints one line (or one JSON object): label, clients, requests, errors
(requests lost: no 200, or a stream that broke off), the mean tokens of
an answer (GEN unless a server stopped early), aggregate tokens/s
over the run's wall time, time to first token (p50 and p99, nearest rank;
the JSON also the mean and p90), mean per-request decode tokens/s; the
JSON also has each request's time to first token in the order the
requests finished (with one client, the order they were sent:
scripts/bench-ttft.sh's first and later request). Exit 1 when a request
failed.
"""
import argparse
import http.client
import json
import math
import statistics
import sys
import threading
import time
import urllib.parse


def one_request(url, body):
    """(ttft_s, total_s, tokens) of one streamed completion, or raises."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    start = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError("HTTP %d: %s" % (resp.status, resp.read()[:300]))
    ttft, chunks, usage = None, 0, None
    for raw in resp:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        msg = json.loads(data)
        if msg.get("usage"):
            usage = msg["usage"].get("completion_tokens")
        if msg.get("choices"):
            chunks += 1
            if ttft is None:
                ttft = time.perf_counter() - start
    total = time.perf_counter() - start
    conn.close()
    if ttft is None:
        raise RuntimeError("the stream ended without a choice (%s usage tokens)" % usage)
    return ttft, total, usage if usage else chunks


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("url")
    ap.add_argument("--clients", type=int, required=True)
    ap.add_argument("--requests", type=int, default=4, help="per client (default 4)")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--shared-tokens", type=int, default=0,
                    help="the prompt's first S tokens, the same in every request (default 0)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--label", default="")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    base = ("the quick brown fox " * a.prompt_tokens)
    results, errors, lock = [], [], threading.Lock()

    def client(c):
        for r in range(a.requests):
            tag = "%d %d " % (c, r)
            shared = base[:a.shared_tokens]
            body = {"prompt": (shared + tag + base)[:a.prompt_tokens - 1],
                    "max_tokens": a.max_tokens, "temperature": 0, "stream": True,
                    "stream_options": {"include_usage": True},
                    "cache_prompt": a.shared_tokens > 0, "ignore_eos": True}
            try:
                got = one_request(a.url, body)
                with lock:
                    results.append(got)
            except Exception as e:  # noqa: BLE001 - every failure is counted and shown
                with lock:
                    errors.append(str(e))

    threads = [threading.Thread(target=client, args=(c,)) for c in range(a.clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0

    ttfts = sorted(r[0] for r in results)

    def ttft_ms(q):
        """The q-quantile of the times to first token, nearest rank, in ms."""
        return 1000 * ttfts[max(0, math.ceil(q * len(ttfts)) - 1)] if ttfts else None

    decode = [(r[2] - 1) / (r[1] - r[0]) for r in results if r[2] > 1 and r[1] > r[0]]
    out = {
        "label": a.label, "clients": a.clients, "requests": len(results) + len(errors),
        "errors": len(errors),
        "answer_tokens_mean": statistics.mean(r[2] for r in results) if results else None,
        "aggregate_tokens_per_second": sum(r[2] for r in results) / wall if wall > 0 else 0.0,
        "ttft_mean_ms": 1000 * statistics.mean(ttfts) if ttfts else None,
        "ttft_p50_ms": ttft_ms(0.5),
        "ttft_p90_ms": ttft_ms(0.9),
        "ttft_p99_ms": ttft_ms(0.99),
        "ttft_each_ms": [1000 * r[0] for r in results],
        "decode_tokens_per_second_mean": statistics.mean(decode) if decode else None,
        "first_error": errors[0] if errors else None,
    }
    if a.json:
        print(json.dumps(out))
    else:
        fmt = lambda v, f: f % v if v is not None else "-"  # noqa: E731
        print("%s | %d clients | %d requests, %d errors, %s tokens an answer | "
              "%.1f tok/s aggregate | TTFT %s ms p50, %s ms p99 | %s tok/s per request" % (
                  a.label, a.clients, out["requests"], out["errors"],
                  fmt(out["answer_tokens_mean"], "%.1f"),
                  out["aggregate_tokens_per_second"], fmt(out["ttft_p50_ms"], "%.1f"),
                  fmt(out["ttft_p99_ms"], "%.1f"),
                  fmt(out["decode_tokens_per_second_mean"], "%.1f")))
        if errors:
            print("first error: %s" % errors[0], file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
