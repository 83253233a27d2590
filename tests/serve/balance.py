"""Replicas of q4khost serve behind HAProxy, with the configuration shipped
in packaging/haproxy (one server line added for a third replica, as its
header says to add more): the balancer sends nothing to a replica whose
/health is not ready (the third serves with F2 off, unverified), and when
the first replica is stopped with SIGTERM in the middle of a load, every
request is still answered, 200 with its answer: a request the draining
replica refused or answered 503 is retried on the other. The caller
started the replicas and checks that the first exits 0.
Usage: balance.py CONFIG URL1 PID1 LOG1 URL2 LOG2 URL3 LOG3"""
import atexit
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.parse

from common import (CHECKS, Client, answer_text, check, read_text, run_threads,
                    streamed_text, wait_for)

CLIENTS = 8
REQUESTS = 240       # in all, from the CLIENTS
SIGTERM_AFTER = 60   # requests answered before the first replica is stopped
BOUND = 60           # seconds any wait for the balancer may take
BODY = {"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}


def free_port():
    """A port nothing listens on now (the kernel's choice)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def address(url):
    u = urllib.parse.urlsplit(url)
    return "%s:%d" % (u.hostname, u.port)


def generations(log):
    """How many completions a replica's access log says it answered 200."""
    return len(re.findall(r"access: \S+ POST /v1/completions 200 ", read_text(log)))


def start_balancer(config, work, urls):
    """haproxy -db on CONFIG plus a server line for the third replica, on a
    free port; (its URL, the file of its log)."""
    cfg, log = os.path.join(work, "haproxy.cfg"), os.path.join(work, "haproxy.log")
    with open(cfg, "w") as f:
        f.write(read_text(config) + "\tserver replica3 %s\n" % address(urls[2]))
    bind = "127.0.0.1:%d" % free_port()
    env = dict(os.environ, Q4KHOST_LB_BIND=bind, Q4KHOST_REPLICA_1=address(urls[0]),
               Q4KHOST_REPLICA_2=address(urls[1]))
    with open(log, "w") as out:
        lb = subprocess.Popen(["haproxy", "-db", "-f", cfg], env=env, stdout=out,
                              stderr=subprocess.STDOUT)
    atexit.register(lambda: (lb.terminate(), lb.wait()))
    wait_for("the balancer marks the replica with F2 off down (its /health: 503)",
             lambda: "replica3 is DOWN" in read_text(log) or lb.poll() is not None, BOUND)
    check("haproxy runs", lb.poll() is None, read_text(log))
    return "http://" + bind, log


def main():
    config, url1, pid1, log1, url2, log2, url3, log3 = sys.argv[1:9]
    work = os.path.dirname(log1)
    lb, lb_log = start_balancer(config, work, [url1, url2, url3])
    want = answer_text(Client(url2).request("POST", "/v1/completions", BODY)[2])
    before2 = generations(log2)
    lock = threading.Lock()
    state = {"next": 0, "done": 0, "errors": [], "stopped_at": None}

    def client(_):
        c = Client(lb, timeout=BOUND)
        while True:
            with lock:
                i = state["next"]
                state["next"] += 1
            if i >= REQUESTS:
                break
            try:
                if i % 2:
                    st, _, events = c.events("/v1/completions", dict(BODY, stream=True))
                    text = streamed_text(events) if st == 200 else events
                else:
                    st, _, b = c.request("POST", "/v1/completions", BODY)
                    text = answer_text(b) if st == 200 else b
                if st != 200 or text != want:
                    raise AssertionError("status %d: %r" % (st, text))
            except Exception as e:  # counted, never silent
                c.close()
                with lock:
                    state["errors"].append("request %d: %r" % (i, e))
            with lock:
                state["done"] += 1
                if state["done"] == SIGTERM_AFTER:
                    os.kill(int(pid1), signal.SIGTERM)
                    state["stopped_at"] = generations(log1)
        c.close()

    run_threads(client, CLIENTS)
    lines = read_text(lb_log).splitlines()
    retried = [l for l in lines if re.search(r" \d+/\d+/\d+/\d+/\+?[1-9]\d* \d+/\d+ ", l)]
    print("balance: %d requests from %d clients through %s, %d errors; the first replica "
          "answered %d before SIGTERM (%d in all), the second %d; %d retried by the balancer"
          % (state["done"], CLIENTS, lb, len(state["errors"]), state["stopped_at"] or 0,
             generations(log1), generations(log2) - before2, len(retried)))
    for e in state["errors"][:10]:
        print("  " + e)
    for l in retried[:5]:
        print("  " + l)
    check("every request through the balancer answered 200 with its answer, across "
          "the SIGTERM", not state["errors"] and state["done"] == REQUESTS)
    check("the replica with F2 off got no request", generations(log3) == 0)
    check("both ready replicas served", state["stopped_at"] and generations(log2) > before2)
    check("the first replica drained (its log)", "stopping: no new connections" in read_text(log1))
    check("the balancer retried a request the draining replica did not take", retried,
          "\n".join(lines[-20:]))
    print("balance: %d checks passed" % len(CHECKS))


if __name__ == "__main__":
    main()
