"""Prefix reuse across requests in q4khost serve: CLIENTS clients at once
share one long system prompt, each asking two questions of its own in turn
(the second after its first answer, so that blocks computed for some
requests are there for others), greedy and sampled with a seed. Every
answer must be, byte for byte, the one a server with --prefix-cache off
gives the same request sent alone (whose prompt is computed whole: on the
exact cpu backend the reused keys and values are the same bits, and so are
the logits and every sampled token), and /metrics must count a lookup per
request, a hit for at least every second question, and at least the
system prompt's whole blocks reused per hit (its words are at least a
token each).
Usage: prefix.py URL URL_OFF CLIENTS"""
import sys

from common import CHECKS, Client, answer_text, check, in_turns

N = 10  # answer tokens
SYSTEM = " ".join(("You answer questions about the river, the old mill, the miller who kept "
                   "his grain there, the children who played beside the water and the "
                   "evening bell, in the plain words of the village, briefly and kindly; "
                   "when you do not know, you say so and suggest whom to ask.").split() * 4)
WORDS = SYSTEM.split()


def question(k, turn):
    """Client K's question of TURN: its own words."""
    return "Tell me, for the %s time, about %s and %s." % (
        ("first", "second")[turn], WORDS[(7 * k + turn) % len(WORDS)],
        WORDS[(11 * k + 3 * turn + 5) % len(WORDS)])


def body(k, turn):
    """Client K's request of TURN: greedy on even clients, sampled with a
    seed on odd ones."""
    b = {"messages": [{"role": "system", "content": SYSTEM},
                      {"role": "user", "content": question(k, turn)}],
         "max_tokens": N}
    b.update({"temperature": 0} if k % 2 == 0 else {"temperature": 1.0, "seed": 1000 + k})
    return b


def ask(c, b):
    status, _, data = c.request("POST", "/v1/chat/completions", b)
    check("a chat completion is answered 200", status == 200, data[:300])
    return answer_text(data)


def metrics(url):
    status, _, data = Client(url).request("GET", "/metrics")
    check("/metrics answers 200", status == 200)
    out = {}
    for line in data.decode().splitlines():
        if line.startswith("q4khost_prefix_"):
            name, value = line.split()
            out[name] = float(value)
    check("/metrics has the prefix cache's counters", len(out) == 6, out)
    return out


def main():
    url, url_off, clients = sys.argv[1], sys.argv[2], int(sys.argv[3])
    got = in_turns(url, clients, 2, lambda c, k, turn: ask(c, body(k, turn)))
    off = Client(url_off)
    for k in range(clients):
        for turn in range(2):
            want = ask(off, body(k, turn))
            check("client %d, question %d (%s): the answer with reuse is the one without"
                  % (k, turn, "greedy" if k % 2 == 0 else "sampled"),
                  got[k, turn] == want, "%r != %r" % (got[k, turn], want))
    off.close()
    m = metrics(url)
    hits = m["q4khost_prefix_hits_total"]
    tokens = m["q4khost_prefix_tokens_reused_total"]
    check("a lookup per request", m["q4khost_prefix_lookups_total"] == 2 * clients, m)
    check("every second question reused blocks, at least", hits >= clients, m)
    check("the blocks reused are the tokens reused, 16 a block",
          m["q4khost_prefix_blocks_reused_total"] * 16 == tokens, m)
    check("each hit reused at least the system prompt's whole blocks",
          tokens >= hits * (len(WORDS) // 16 * 16), m)
    check("the server without reuse reused nothing",
          metrics(url_off)["q4khost_prefix_lookups_total"] == 0)
    print("prefix: %d clients, %d requests: %d hits, %d tokens reused (%d copied from "
          "another slot)" % (clients, 2 * clients, hits, tokens,
                             m["q4khost_prefix_tokens_copied_total"]))
    print("prefix: %d checks passed" % len(CHECKS))


if __name__ == "__main__":
    main()
