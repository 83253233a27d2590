"""Many clients at once against q4khost serve: CLIENTS threads, released
together, each sending REQUESTS short completions one after the other,
each on a connection of its own (a client that reconnects for its next
request, as load tools and many SDKs do). Every request must get an HTTP
response: 200 with an answer, or 503 with a Retry-After of whole seconds
and a JSON error, after which the client waits that long and sends it
again (up to RETRIES times). A connection refused, reset or closed
without a response (a broken pipe) is a lost request and fails the run.
With "503" as MODE at least one 503 must have come (the caller made the
queue small), so that the path of a full queue was taken.
Usage: crowd.py URL CLIENTS REQUESTS any|503"""
import http.client
import json
import sys
import threading
import time
import urllib.parse

from common import CHECKS, check, run_threads

BODY = {"prompt": "Hi", "max_tokens": 2, "temperature": 0}
RETRIES = 60
TIMEOUT = 120  # seconds a request may take before it counts as lost


def error_message(body):
    """The message of an OpenAI error body, or None when it is not one."""
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return None
    return message if isinstance(message, str) else None


def post(host, port):
    """(status, Retry-After header or None, body) of one completion on a
    new connection; raises on a connection that got no response."""
    conn = http.client.HTTPConnection(host, port, timeout=TIMEOUT)
    try:
        conn.request("POST", "/v1/completions", json.dumps(BODY).encode(),
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, r.getheader("Retry-After"), r.read()
    finally:
        conn.close()


def main():
    url, clients, requests, mode = sys.argv[1:5]
    clients, requests = int(clients), int(requests)
    u = urllib.parse.urlsplit(url)
    start = threading.Barrier(clients)
    lock = threading.Lock()
    seen = {"ok": 0, "503": 0, "lost": [], "wrong": []}

    def client(k):
        start.wait()
        for i in range(requests):
            for _ in range(RETRIES + 1):
                try:
                    status, after, body = post(u.hostname, u.port)
                except (OSError, http.client.HTTPException) as e:
                    with lock:
                        seen["lost"].append("client %d, request %d: %r" % (k, i, e))
                    return
                if status == 200 and b'"choices"' in body:
                    with lock:
                        seen["ok"] += 1
                    break
                good_503 = status == 503 and after is not None and after.isdigit() and \
                    error_message(body) is not None
                with lock:
                    if not good_503:
                        seen["wrong"].append("client %d, request %d: %d, Retry-After %r: %r"
                                             % (k, i, status, after, body[:200]))
                        return
                    seen["503"] += 1
                time.sleep(int(after))

    run_threads(client, clients)
    print("crowd: %d clients x %d requests: %d answered, %d times 503 with Retry-After, "
          "%d lost, %d other" % (clients, requests, seen["ok"], seen["503"],
                                 len(seen["lost"]), len(seen["wrong"])))
    for line in (seen["lost"] + seen["wrong"])[:10]:
        print("  " + line)
    check("no request lost: every one got a response", not seen["lost"])
    check("every response is 200, or 503 with Retry-After and a JSON error", not seen["wrong"])
    check("every request answered in the end", seen["ok"] == clients * requests, seen["ok"])
    if mode == "503":
        check("a full queue answered 503", seen["503"] > 0)
    print("crowd: %d checks passed" % len(CHECKS))


if __name__ == "__main__":
    main()
