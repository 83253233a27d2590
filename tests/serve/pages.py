"""q4khost serve on a paged KV cache (--kv-pages POOL, pages of 16 tokens
shared by --parallel CLIENTS slots): CLIENTS clients at once share one
system prompt, each asking two questions of its own in turn, greedy (and
with EXACT, on the exact cpu backend, odd clients sampled with a seed).
Every request must be answered 200, and each answer must be, byte for
byte, the one URL_PLAIN (a cache per slot, --prefix-cache off) gives the
same request sent alone. The pool holds one request's pages but not two
whole prompts' (checked from the plain server's token counts): requests
wait for pages, /metrics says so, and none is lost. Prefix hits share
pages: the tokens reused from another slot are counted shared, none
copied. /health and /metrics show the pool. A request whose prompt and
max_tokens need more pages than the pool has is refused with 400, naming
the pages it needs and --kv-pages. With GRAPH (cuda) every step of URL
went through the backend's graph entry, and most were replays of its
recordings (q4khost_steps_total{path}): the batched steps over pages are
recorded once per shape and replayed with new tables and positions.
With "auto" URL has the default pool (--kv-pages auto), POOL pages that
hold every slot's whole context: the same answers, shared prefixes and
pool, but no request waits for pages and none is refused for them.
Usage: pages.py URL URL_PLAIN POOL CLIENTS exact|fast|graph [auto]"""
import json
import sys

from common import CHECKS, Client, answer_text, check, in_turns

N = 10  # answer tokens
PAGE = 16  # tokens a page
SYSTEM = " ".join(("You answer questions about the harbour, the lighthouse keeper, the "
                   "boats that come in at dusk and the nets the fishermen mend on the "
                   "quay, in plain words, briefly; when you do not know, you say so.")
                  .split() * 3)
WORDS = SYSTEM.split()


def question(k, turn):
    """Client K's question of TURN: its own words."""
    return "Tell me, for the %s time, about %s and %s." % (
        ("first", "second")[turn], WORDS[(5 * k + turn) % len(WORDS)],
        WORDS[(13 * k + 3 * turn + 2) % len(WORDS)])


def body(k, turn, exact, max_tokens=N):
    """Client K's request of TURN: greedy, or with EXACT sampled with a
    seed on odd clients."""
    b = {"messages": [{"role": "system", "content": SYSTEM},
                      {"role": "user", "content": question(k, turn)}],
         "max_tokens": max_tokens}
    sampled = exact and k % 2 == 1
    b.update({"temperature": 1.0, "seed": 1000 + k} if sampled else {"temperature": 0})
    return b


def ask(c, b):
    """The answer's text and its prompt's tokens."""
    status, _, data = c.request("POST", "/v1/chat/completions", b)
    check("a chat completion is answered 200", status == 200, data[:300])
    return answer_text(data), json.loads(data)["usage"]["prompt_tokens"]


def pages_for(tokens):
    return (tokens + PAGE - 1) // PAGE


def metrics(url):
    status, _, data = Client(url).request("GET", "/metrics")
    check("/metrics answers 200", status == 200)
    out = {}
    for line in data.decode().splitlines():
        if line.startswith("q4khost_") and not line.startswith("q4khost_requests_total"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def health(url):
    status, _, data = Client(url).request("GET", "/health")
    check("/health answers 200", status == 200, data[:300])
    return json.loads(data)


def main():
    url, url_plain, pool, clients = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    exact = sys.argv[5] == "exact"
    auto = sys.argv[6:] == ["auto"]
    plain = Client(url_plain)
    want, tokens = {}, {}
    for k in range(clients):
        for turn in range(2):
            want[k, turn], tokens[k, turn] = ask(plain, body(k, turn, exact))
    need = sorted(pages_for(t + N) for t in tokens.values())
    check("the pool holds every request's pages", need[-1] <= pool, (need, pool))
    if auto:
        check("the default pool holds every slot's request at once",
              sum(need[-clients:]) <= pool, (need, pool))
    else:
        check("the pool does not hold two whole prompts' pages", need[0] + need[1] > pool,
              (need, pool))

    h = health(url)
    check("/health shows the pool, all free", h["kv_pages"] == {
        "total": pool, "free": pool, "shared": 0, "page_tokens": PAGE}, h["kv_pages"])
    check("/health of a server without pages shows none", health(url_plain)["kv_pages"] is None)

    got = in_turns(url, clients, 2, lambda c, k, turn: ask(c, body(k, turn, exact))[0])
    for k in range(clients):
        for turn in range(2):
            check("client %d, question %d (%s): the answer on pages is the one without"
                  % (k, turn, "sampled" if exact and k % 2 else "greedy"),
                  got[k, turn] == want[k, turn], "%r != %r" % (got[k, turn], want[k, turn]))

    m = metrics(url)
    check("every request took a slot once", m["q4khost_prefix_lookups_total"] == 2 * clients, m)
    if auto:
        check("no request waited for pages", m["q4khost_kv_page_waits_total"] == 0, m)
    else:
        check("requests waited for pages", m["q4khost_kv_page_waits_total"] >= 1, m)
    check("/metrics shows the pool", m["q4khost_kv_pages_total"] == pool, m)
    check("the pages free are at most the pool's",
          0 <= m["q4khost_kv_pages_free"] <= pool, m)
    check("prefix hits took pages from other slots",
          m["q4khost_prefix_tokens_shared_total"] >= len(WORDS) // PAGE * PAGE, m)
    check("no prefix token was copied", m["q4khost_prefix_tokens_copied_total"] == 0, m)
    steps = {p: m['q4khost_steps_total{path="%s"}' % p]
             for p in ("op_by_op", "replay", "graph_nodes", "graph_replay", "graph_persistent")}
    check("the steps are counted by path, the batched ones among them",
          sum(steps.values()) >= max(1, m["q4khost_batched_steps_total"]), (steps, m))
    if sys.argv[5] == "graph":
        check("every step went through the backend's graph entry",
              steps["op_by_op"] + steps["replay"] == 0, steps)
        check("most steps were replays of the backend's recordings",
              steps["graph_replay"] > steps["graph_nodes"], steps)
    mp = metrics(url_plain)
    check("a server without pages has no pool", mp["q4khost_kv_pages_total"] == 0 and
          mp["q4khost_kv_page_waits_total"] == 0, mp)

    if auto:
        print("pages: %d clients, %d requests on the default %d pages: %d prompt tokens "
              "shared" % (clients, 2 * clients, pool, m["q4khost_prefix_tokens_shared_total"]))
        print("pages: %d checks passed" % len(CHECKS))
        return
    # more than the pool: refused at once, the pages it needs named
    big = (pool + 1) * PAGE - tokens[0, 0]  # a page more than the pool, within --ctx
    status, _, data = Client(url).request("POST", "/v1/chat/completions",
                                          body(0, 0, False, max_tokens=big))
    pages = pages_for(tokens[0, 0] + big)
    err = json.loads(data).get("error", {}) if data.startswith(b"{") else {}
    msg = err.get("message", "")
    check("a request bigger than the pool is refused with 400", status == 400, data[:400])
    check("the refusal names the pages needed and --kv-pages",
          ("needs %d KV pages of %d tokens" % (pages, PAGE)) in msg and
          ("more than the %d this server has" % pool) in msg and "--kv-pages" in msg, msg)
    check("the refusal names max_tokens", err.get("param") == "max_tokens", err)
    print("pages: %d clients, %d requests on %d pages: %d waits for pages, %d prompt tokens "
          "shared, %d pages shared at the end" % (
              clients, 2 * clients, pool, m["q4khost_kv_page_waits_total"],
              m["q4khost_prefix_tokens_shared_total"], m["q4khost_kv_pages_shared"]))
    print("pages: %d checks passed" % len(CHECKS))


if __name__ == "__main__":
    main()
