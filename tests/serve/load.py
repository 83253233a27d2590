"""A bounded load test of q4khost serve: REQUESTS requests (chat and
completions, streamed and not, over four prompts) from CLIENTS concurrent
keep-alive clients, a fixed count that ends by itself. Every answer must
be q4khost run's greedy answer, no request may fail, the server's
resident memory at the end must be within 10 % of what it was after the
first 50 requests, and its /metrics must show decode steps that batched
several requests (q4khost_batched_steps_total, with more tokens than
steps). Exit 0 when all of that holds. With BACKEND, the answers expected
are q4khost run's on that backend (the one serve was started with).
Usage: load.py URL PID Q4KHOST MODEL PLUGIN_PATH REQUESTS CLIENTS rss|no-rss [BACKEND]"""
import queue
import sys
import threading

from common import (Client, answer_text, model_id, rss_kib, run_answer, run_threads,
                    streamed_text)

PROMPTS = ["Hello, how are you?", "Once upon a time", "1, 2, 3, 4,",
           "The capital of France is"]
N = 8


def main():
    url, pid, q4khost, model, plugin_path = sys.argv[1:6]
    pid, total, clients = int(pid), int(sys.argv[6]), int(sys.argv[7])
    judge_rss = sys.argv[8] == "rss"
    backend = sys.argv[9] if len(sys.argv) > 9 else None
    mid = model_id(model)
    expect = {}
    for p in PROMPTS:
        for chat in (True, False):
            expect[p, chat] = run_answer(q4khost, model, plugin_path, p, N, chat,
                                         backend)[0]
    work = queue.Queue()
    for i in range(total):
        work.put((i, PROMPTS[(i // 4) % len(PROMPTS)], i % 2 == 0, (i // 2) % 2 == 1))
    lock = threading.Lock()
    state = {"done": 0, "rss50": None, "errors": []}

    def client(_):
        c = Client(url)
        while True:
            try:
                i, prompt, chat, stream = work.get_nowait()
            except queue.Empty:
                break
            body = {"model": mid, "max_tokens": N, "temperature": 0}
            if chat:
                path = "/v1/chat/completions"
                body["messages"] = [{"role": "user", "content": prompt}]
            else:
                path = "/v1/completions"
                body["prompt"] = prompt
            try:
                if stream:
                    body["stream"] = True
                    status, _, events = c.events(path, body)
                    text = streamed_text(events) if status == 200 else None
                else:
                    status, _, data = c.request("POST", path, body)
                    text = answer_text(data) if status == 200 else None
                if status != 200 or text != expect[prompt, chat]:
                    raise AssertionError("status %d, %r, expected %r"
                                         % (status, text, expect[prompt, chat]))
            except Exception as e:  # counted, never silent
                with lock:
                    state["errors"].append("request %d: %s" % (i, e))
            with lock:
                state["done"] += 1
                if state["done"] == 50:
                    state["rss50"] = rss_kib(pid)
        c.close()

    run_threads(client, clients)
    rss_end = rss_kib(pid)
    c = Client(url)
    status, _, text = c.request("GET", "/metrics")
    c.close()
    metrics = dict(line.split(" ", 1) for line in text.decode().splitlines()
                   if line.startswith("q4khost_batched_"))
    steps = int(metrics.get("q4khost_batched_steps_total", "0"))
    tokens = int(metrics.get("q4khost_batched_tokens_total", "0"))
    print("load: %d requests from %d clients, %d errors; RSS %d KiB after 50, %d KiB at the end;"
          " %d batched decode steps made %d tokens"
          % (state["done"], clients, len(state["errors"]), state["rss50"], rss_end, steps,
             tokens))
    for e in state["errors"][:10]:
        print("  " + e)
    if state["errors"] or state["done"] != total:
        sys.exit(1)
    if status != 200 or steps == 0 or tokens < 2 * steps:
        print("load: no decode step batched several requests (/metrics %d)" % status)
        sys.exit(1)
    if judge_rss and rss_end > state["rss50"] * 1.10:
        print("load: resident memory grew by more than 10 %")
        sys.exit(1)


if __name__ == "__main__":
    main()
