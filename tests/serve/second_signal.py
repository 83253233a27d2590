"""A second SIGINT stops q4khost serve at once (interrupt.h, docs/serve.md
section 6): the first begins the drain (its log line) while a stream is
held in flight, and a second one a second later ends the process without
waiting out --shutdown-timeout, which the caller set far beyond every
bound here; the held stream's connection is closed. The caller started
the server on a kernel variant whose every product waits while the file
HOLD exists (tests/plugins/cpu_q8act.c, -DQ8ACT_GATE), with its log in
LOG, and checks how it exited (by SIGINT). Every wait is for a state,
bounded.
Usage: second_signal.py URL PID LOG HOLD"""
import http.client
import json
import os
import signal
import sys
import threading
import time

from common import CHECKS, Client, check, read_text, wait_for

REQUEST = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "stream": True}


def main():
    url, pid, log, hold = sys.argv[1:5]
    pid = int(pid)
    watch = Client(url)
    open(hold, "w").close()
    got = {}

    def stream():
        try:
            got["status"], _, got["events"] = Client(url).events("/v1/completions", REQUEST)
        except (OSError, http.client.HTTPException) as e:
            got["error"] = repr(e)

    t = threading.Thread(target=stream, daemon=True)
    t.start()
    wait_for("the held stream takes a slot", lambda: json.loads(
        watch.request("GET", "/health")[2])["slots"]["busy"] == 1)

    os.kill(pid, signal.SIGINT)
    wait_for("the drain begins after the first SIGINT (its log line)",
             lambda: "stopping: no new connections" in read_text(log))
    check("the held stream still runs after the first SIGINT", t.is_alive(), got)
    time.sleep(1.0)  # a second Ctrl-C, not one that came with the first
    os.kill(pid, signal.SIGINT)
    # The hold file stays: only a stop at once ends the stream.
    t.join(120)
    check("the held stream's connection ends after the second SIGINT", not t.is_alive())
    check("the held stream did not finish: serve stopped under it",
          "events" not in got or b"[DONE]" not in got["events"], got)
    os.remove(hold)
    print("second_signal: %d checks passed" % len(CHECKS))


if __name__ == "__main__":
    main()
