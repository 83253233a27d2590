"""Continuous batching in q4khost serve: prompts of different lengths sent
at once by concurrent clients, so that steps carry some requests' prompt
chunks beside other requests' answer tokens, and requests join and leave
the running batch between steps. Each greedy answer must be, byte for byte,
q4khost run's for its prompt and the answer the same server gave it alone
(one request at a time, before the crowd), and /metrics must show steps
that carried prompt chunks with other sequences
(q4khost_mixed_steps_total) and more answer tokens than batched steps.
With BACKEND, q4khost run's answers are taken on that backend (the one
serve was started with).
Usage: mixed.py URL Q4KHOST MODEL PLUGIN_PATH CLIENTS [BACKEND]"""
import sys
import threading

from common import CHECKS, Client, answer_text, check, run_answer, run_threads

N = 12  # answer tokens
WORDS = ("the river ran past the old mill where the miller kept his grain "
         "and the children played beside the water until the evening bell ").split()


def prompt(k):
    """Client K's prompt: its own length, from a few tokens to a few
    hundred, so that prompts take from one to many steps' chunks."""
    return " ".join(WORDS[(k + i) % len(WORDS)] for i in range(3 + 37 * k))


def complete(c, text):
    status, _, body = c.request("POST", "/v1/completions",
                                {"prompt": text, "max_tokens": N, "temperature": 0})
    check("a completion is answered 200", status == 200, body[:300])
    return answer_text(body)


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    check("/metrics has " + name, False, text[-2000:])
    return None


def main():
    url, q4khost, model, plugin_path, clients = sys.argv[1:6]
    clients = int(clients)
    backend = sys.argv[6] if len(sys.argv) > 6 else None
    prompts = [prompt(k) for k in range(clients)]
    c = Client(url)
    alone = [complete(c, p) for p in prompts]
    for k, p in enumerate(prompts):
        want, n_prompt = run_answer(q4khost, model, plugin_path, p, N, False, backend)
        check("served alone, prompt %d (%d tokens) is answered as q4khost run answers it"
              % (k, n_prompt), alone[k] == want, "%r != %r" % (alone[k], want))
    start = threading.Barrier(clients)
    got = [None] * clients

    def client(k):
        mine = Client(url)
        start.wait()
        got[k] = complete(mine, prompts[k])
        mine.close()

    run_threads(client, clients)
    for k in range(clients):
        check("served with %d others, prompt %d is answered as when served alone"
              % (clients - 1, k), got[k] == alone[k], "%r != %r" % (got[k], alone[k]))
    c.close()  # it idled past --idle-timeout, maybe, while the crowd ran
    status, _, body = Client(url).request("GET", "/metrics")
    check("/metrics answers 200", status == 200)
    text = body.decode()
    mixed = metric(text, "q4khost_mixed_steps_total")
    steps = metric(text, "q4khost_batched_steps_total")
    tokens = metric(text, "q4khost_batched_tokens_total")
    check("steps carried prompt chunks beside other sequences", mixed > 0, text[-1500:])
    check("batched steps made more tokens than there were steps", tokens > steps,
          (tokens, steps))
    print("mixed: %d clients, prompts of %d to %d words: %d batched steps, %d of them with "
          "prompt chunks, %d tokens made in them" % (clients, len(prompts[0].split()),
                                                   len(prompts[-1].split()), steps, mixed,
                                                   tokens))
    print("mixed: %d checks passed" % len(CHECKS))


if __name__ == "__main__":
    main()
