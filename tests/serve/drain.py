"""SIGTERM drains q4khost serve as docs/serve.md section 6 says: the drain
begins (its log line), a request already running finishes whole within
--shutdown-timeout, requests on connections opened before the signal get
503 with a JSON error, /health answers 503 (not ready, for a balancer),
and new connections are refused or get 503. The
caller started the server on a kernel variant whose every product waits
while the file HOLD exists (tests/plugins/cpu_q8act.c, -DQ8ACT_GATE),
with its log in LOG, a --shutdown-timeout that outlasts this script's
waits, and checks that it exits 0. Every wait is for a state, bounded.
Usage: drain.py URL PID LOG HOLD"""
import http.client
import json
import os
import signal
import sys
import threading

from common import CHECKS, Client, check, read_text, streamed_text, wait_for

BOUND = 120  # seconds any wait for the server may take before it fails
KEPT = 4     # connections opened before SIGTERM, each to get a 503
REQUEST = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "stream": True}

def health(client, status=200):
    """/health's JSON; fails unless it came with STATUS (200 while the
    server is ready, 503 once it drains) and says ready as that does."""
    st, _, b = client.request("GET", "/health")
    o = json.loads(b)
    if st != status or o["ready"] != (status == 200):
        check("/health answers %d" % status, False, (st, b))
    return o


def text_of(events, what):
    """The text of a stream's EVENTS; fails WHAT on an error event or no [DONE]."""
    try:
        return streamed_text(events)
    except (AssertionError, ValueError, KeyError) as e:
        check(what, False, "%r: %s" % (e, events[-3:]))


def finish_reason(events):
    o = json.loads(events[-2])
    return o["choices"][0]["finish_reason"]


def main():
    url, pid, log, hold = sys.argv[1:5]
    pid = int(pid)
    path = "/v1/completions"

    # The whole answer, with nothing held: what the drained request must give.
    st, _, want = Client(url).events(path, REQUEST)
    check("the request answered before SIGTERM", st == 200, want)
    kept = [Client(url) for _ in range(KEPT)]
    for c in kept:
        health(c)
    watch = Client(url)

    # The request in flight: it takes a slot, and its products wait.
    open(hold, "w").close()
    got = {}

    def stream():
        try:
            got["status"], _, got["events"] = Client(url).events(path, REQUEST)
        except (OSError, http.client.HTTPException) as e:
            got["error"] = repr(e)

    t = threading.Thread(target=stream, daemon=True)  # a failed check exits at once
    t.start()
    wait_for("the held request takes a slot", lambda: health(watch)["slots"]["busy"] == 1)

    os.kill(pid, signal.SIGTERM)
    wait_for("the drain begins after SIGTERM (its log line)",
             lambda: "stopping: no new connections" in read_text(log))
    check("/health on a kept-alive connection says draining, not ready (503)",
          health(watch, 503)["status"] == "draining")
    for i, c in enumerate(kept):
        try:
            st, _, b = c.request("POST", path, dict(REQUEST, stream=False))
        except (OSError, http.client.HTTPException) as e:
            check("a connection kept alive across SIGTERM gets 503", False,
                  "(connection %d: %r instead)" % (i, e))
        check("a connection kept alive across SIGTERM gets 503 with a JSON error",
              st == 503 and isinstance(json.loads(b)["error"]["message"], str), (i, st, b))
    refused = answered = 0
    for _ in range(1000):
        try:
            st, _, b = Client(url, timeout=30).request("POST", path, dict(REQUEST, stream=False))
        except (OSError, http.client.HTTPException):
            refused += 1
            continue
        check("a new connection after SIGTERM is refused or gets 503", st == 503, (st, b))
        answered += 1
    check("the request in flight still runs", t.is_alive(), got)

    os.remove(hold)
    t.join(BOUND)
    check("the request in flight ends", not t.is_alive())
    events = got.get("events", [])
    check("the request in flight at SIGTERM is answered", got.get("status") == 200, got)
    whole = "the request in flight at SIGTERM finishes whole: its text, its finish " \
        "reason, [DONE] and a closed body"
    check(whole, text_of(events, whole) == text_of(want, "the answer before SIGTERM") and
          finish_reason(events) == finish_reason(want), (events, want))
    ident = json.loads(events[0])["id"]
    line = [l for l in read_text(log).splitlines() if l.startswith("q4khost serve: %s:" % ident)]
    check("the log says it finished, not cancelled",
          len(line) == 1 and "(cancelled)" not in line[0], line)
    print("drain: %d checks passed; after SIGTERM %d kept-alive connections got 503; of 1000 "
          "new ones %d were refused, %d got 503" % (len(CHECKS), KEPT, refused, answered))


if __name__ == "__main__":
    main()
