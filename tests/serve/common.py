"""What the serve test scripts share: checks that stop at the first
failure, bounded waits, clients in threads, q4khost run's answers, plain
HTTP and server-sent events over http.client, a process's resident
memory."""
import http.client
import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse

CHECKS = []  # the names of the checks made, for a script's summary


def check(name, ok, detail=""):
    """Count check NAME; when not OK, print it with DETAIL and exit 1."""
    CHECKS.append(name)
    if not ok:
        print("FAILED: %s %s" % (name, detail))
        sys.exit(1)


def wait_for(name, state, bound=120):
    """Poll STATE() until it is true; fail NAME after BOUND seconds."""
    end = time.time() + bound
    while time.time() < end:
        if state():
            return
        time.sleep(0.05)
    check(name, False, "(not after %d s)" % bound)


def read_text(path):
    """A file's text (a server's log), bytes that are not UTF-8 replaced."""
    with open(path, errors="replace") as f:
        return f.read()


def run_threads(target, n):
    """TARGET(k) in N threads at once, k from 0 to N - 1; returns when all
    have ended."""
    threads = [threading.Thread(target=target, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def in_turns(url, clients, turns, ask):
    """CLIENTS clients of URL at once (started together), each on a
    keep-alive connection of its own asking its TURNS requests one after
    another: ASK(connection, k, turn) of client K, into {(k, turn): what
    it returned}."""
    start = threading.Barrier(clients)
    got = {}

    def client(k):
        mine = Client(url)
        start.wait()
        for turn in range(turns):
            got[k, turn] = ask(mine, k, turn)
        mine.close()

    run_threads(client, clients)
    return got


def run_answer(q4khost, model, plugin_path, prompt, n, chat, backend=None):
    """q4khost run's greedy answer to PROMPT (through the chat template
    when CHAT, else raw; on BACKEND when given) as serve must give it: the
    bytes it streams, less the newline it ends with, as UTF-8 with U+FFFD
    for ill-formed bytes; and the prompt's length in tokens (from
    --json)."""
    args = [q4khost, "run", "-m", model, "--plugin-path", plugin_path,
            "-p", prompt, "-n", str(n), "--temp", "0"]
    if backend:
        args += ["--backend", backend]
    if not chat:
        args.append("--raw")
    out = subprocess.run(args, check=True, capture_output=True).stdout
    assert out.endswith(b"\n"), out
    text = out[:-1].decode("utf-8", errors="replace")
    report = json.loads(subprocess.run(args + ["--json"], check=True,
                                       capture_output=True).stdout)
    return text, report["prefill"]["tokens"]


class Client:
    """One keep-alive connection to the server at URL."""

    def __init__(self, url, key=None, timeout=120):
        u = urllib.parse.urlsplit(url)
        self.host, self.port, self.key = u.hostname, u.port, key
        self.timeout = timeout
        self.conn = None

    def _headers(self, extra=None):
        h = {"Content-Type": "application/json"}
        if self.key:
            h["Authorization"] = "Bearer " + self.key
        h.update(extra or {})
        return h

    def request(self, method, path, body=None, headers=None):
        """(status, headers, body bytes); the connection is kept."""
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port,
                                                   timeout=self.timeout)
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        try:
            self.conn.request(method, path, data, self._headers(headers))
            r = self.conn.getresponse()
            return r.status, dict(r.getheaders()), r.read()
        except Exception:
            self.conn.close()
            self.conn = None
            raise

    def events(self, path, body):
        """POST BODY with stream true: (status, headers, [event payloads])."""
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port,
                                                   timeout=self.timeout)
        self.conn.request("POST", path, json.dumps(body).encode(), self._headers())
        r = self.conn.getresponse()
        if r.status != 200:
            return r.status, dict(r.getheaders()), [r.read()]
        out = []
        for line in r:
            line = line.rstrip(b"\r\n")
            if line.startswith(b"data: "):
                out.append(line[6:])
                if line == b"data: [DONE]":
                    break
        r.read()
        return r.status, dict(r.getheaders()), out

    def close(self):
        if self.conn:
            self.conn.close()
            self.conn = None


def streamed_text(events):
    """The text of a stream's events (chat deltas or completion texts);
    raises on an error event or a missing [DONE]."""
    assert events and events[-1] == b"[DONE]", events[-3:]
    text = []
    for e in events[:-1]:
        o = json.loads(e)
        assert "error" not in o, o
        for c in o["choices"]:
            text.append(c.get("delta", {}).get("content") or c.get("text") or "")
    return "".join(text)


def answer_text(body):
    o = json.loads(body)
    c = o["choices"][0]
    return c["message"]["content"] if "message" in c else c["text"]


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS for %d" % pid)


def model_id(model):
    return os.path.basename(model)
