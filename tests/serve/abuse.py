"""q4khost serve under bad input, each answered with a clean 4xx/5xx (a JSON
error body) or a closed connection while the server lives on: malformed
JSON, wrong types, invalid UTF-8, an unknown endpoint or method, any
model name (taken for the one model),
bodies too large or cut short, slow-loris clients, a client that leaves
mid-stream (its generation must stop), requests without the API key
(drain.py has SIGTERM). The caller started the server with --max-body
65536 --idle-timeout 2, the API key KEY and its log in LOG.
Usage: abuse.py URL KEY LOG MODEL"""
import http.client
import json
import socket
import sys
import time
import urllib.parse

from common import CHECKS, Client, check, model_id

def error_body(body):
    o = json.loads(body)
    return isinstance(o.get("error", {}).get("message"), str)


def raw(host, port, data, read=True, timeout=10):
    """Send DATA on a new connection; what came back until it closed."""
    s = socket.create_connection((host, port), timeout=timeout)
    s.sendall(data)
    out = b""
    if read:
        try:
            while True:
                b = s.recv(65536)
                if not b:
                    break
                out += b
        except socket.timeout:
            pass
    s.close()
    return out


def closed_within(s, seconds):
    """1 when the server closes S (having read it) within SECONDS."""
    s.settimeout(0.25)
    end = time.time() + seconds
    while time.time() < end:
        try:
            if s.recv(4096) == b"":
                return True
        except socket.timeout:
            continue
        except OSError:
            return True
    return False


def access_lines(log, path, seconds=5):
    """The access lines of LOG for PATH that are there within SECONDS."""
    end = time.time() + seconds
    while True:
        with open(log, errors="replace") as f:
            lines = [l for l in f if " access: " in l and (" %s " % path) in l]
        if lines or time.time() > end:
            return lines
        time.sleep(0.1)


def main():
    url, key, log, model = sys.argv[1:5]
    mid = model_id(model)
    u = urllib.parse.urlsplit(url)
    host, port = u.hostname, u.port
    c = Client(url, key)
    chat = "/v1/chat/completions"
    msg = [{"role": "user", "content": "Hello"}]

    st, _, b = c.request("GET", "/health", headers={"Authorization": ""})
    check("health needs no key", st == 200)
    for hdr in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic " + key}):
        st, h, b = Client(url).request("POST", chat, {"messages": msg, "max_tokens": 1}, hdr)
        check("no or wrong key: 401", st == 401 and error_body(b) and
              h.get("WWW-Authenticate") == "Bearer", (st, b))
    st, _, b = c.request("POST", chat, {"messages": msg, "max_tokens": 2})
    check("the key: 200", st == 200, b)

    bad = [
        b"{", b"[1, 2]", b'{"messages": "hi"}', b'{"messages": []}',
        b'{"messages": [{"role": "user", "content": 1}]}',
        b'{"messages": [{"role": "robot", "content": "x"}]}',
        b'{"messages": [{"role": "user"}], "temperature": "hot"}',
        b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}',
        b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 1e9}',
        b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 99999999}',
        b'{"messages": [{"role": "user", "content": "x"}], "top_k": 1.5}',
        b'{"messages": [{"role": "user", "content": "x"}], "stop": 5}',
        b'{"messages": [{"role": "user", "content": "x"}], "stop": ["a","b","c","d","e"]}',
        b'{"messages": [{"role": "user", "content": "x"}], "stream": "yes"}',
        b'{"messages": [{"role": "user", "content": "x"}], "n": 2}',
        b'{"messages": [{"role": "user", "content": "x"}], "model": 7}',
        b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}',
        b'{"messages": [{"role": "user", "content": "\xed\xa0\x80"}]}',
        b'{"messages": [{"role": "user", "content": "a\\u0000b"}]}',
        b'{"prompt": "x"}',
    ]
    for body in bad:
        st, _, b = c.request("POST", chat, body)
        check("bad body: 400", st == 400 and error_body(b), (body, st, b))
    st, _, b = c.request("POST", "/v1/completions", b'{"prompt": ["a", "b"]}')
    check("prompt array of two: 400", st == 400 and error_body(b))
    # OpenAI's API requires a user's (system's, developer's) content; only an
    # assistant's may be null (a message that only called tools).
    for body, k, role in ((b'{"messages": [{"role": "user", "content": null}]}', 0, "user"),
                          (b'{"messages": [{"role": "system", "content": "Be brief"}, '
                           b'{"role": "user"}]}', 1, "user"),
                          (b'{"messages": [{"role": "system", "content": null}, '
                           b'{"role": "user", "content": "x"}]}', 0, "system")):
        st, _, b = c.request("POST", chat, body)
        check("a %s message without content: 400 naming messages[%d].content" % (role, k),
              st == 400 and json.loads(b)["error"]["message"].startswith(
                  "messages[%d].content is required for a %s message" % (k, role)), (st, b))
    st, _, b = c.request("POST", chat, {"messages": [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": None},
        {"role": "user", "content": "Hi again"}], "max_tokens": 1})
    check("an assistant message with null content: 200", st == 200, (st, b))
    # The body is JSON: a Content-Type that says otherwise is refused (415,
    # with the fix for curl -d's form type); none at all is taken as JSON.
    for ctype in ("text/plain", "application/x-www-form-urlencoded",
                  "multipart/form-data; boundary=x"):
        st, _, b = c.request("POST", chat, {"messages": msg, "max_tokens": 1},
                             {"Content-Type": ctype})
        check("Content-Type %s: 415 naming it and the fix" % ctype,
              st == 415 and error_body(b) and ctype.split(";")[0] in
              json.loads(b)["error"]["message"] and
              "-H 'Content-Type: application/json'" in json.loads(b)["error"]["message"],
              (st, b))
    st, _, b = c.request("POST", chat, {"messages": msg, "max_tokens": 1},
                         {"Content-Type": "application/json; charset=utf-8"})
    check("Content-Type application/json with a charset: 200", st == 200, (st, b))
    plain = http.client.HTTPConnection(host, port, timeout=60)
    plain.putrequest("POST", chat)
    body = json.dumps({"messages": msg, "max_tokens": 1}).encode()
    plain.putheader("Authorization", "Bearer " + key)
    plain.putheader("Content-Length", str(len(body)))
    plain.endheaders(body)
    r = plain.getresponse()
    check("no Content-Type: taken as JSON, 200", r.status == 200, (r.status, r.read()))
    plain.close()
    # OpenAI clients send a fixed name: any is taken for the one model loaded
    st, _, b = c.request("POST", chat, {"model": "gpt-4", "messages": msg, "max_tokens": 1})
    check("another model name: 200, answered as the served id",
          st == 200 and json.loads(b)["model"] == mid, (st, b))
    st, _, b = c.request("GET", "/v1/nothing")
    check("unknown endpoint: 404", st == 404 and error_body(b))
    st, h, b = c.request("GET", chat)
    check("wrong method: 405", st == 405 and h.get("Allow") == "POST")
    st, _, b = c.request("POST", chat, {"model": mid, "messages": msg,
                                        "max_tokens": 1, "stop": "\n"})
    check("a good request after them: 200", st == 200, b)

    reply = raw(host, port, b"POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                b"Content-Length: 10000000\r\n\r\n" % (chat.encode(), key.encode()) + b"{" * 4096)
    check("a body larger than --max-body: 413", reply.startswith(b"HTTP/1.1 413"), reply[:80])
    check("the 413 names the limit and the option that raises it",
          b"65536 bytes at most (q4khost serve --max-body BYTES raises the limit)" in reply,
          reply[-300:])
    chunk = b"8000\r\n" + b" " * 0x8000 + b"\r\n"
    reply = raw(host, port, b"POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n" % (chat.encode(), key.encode())
                + chunk * 3 + b"0\r\n\r\n")
    check("a chunked body larger than --max-body: 413", reply.startswith(b"HTTP/1.1 413"),
          reply[:80])
    # Malformed HTTP that libmicrohttpd answers itself, before q4khost reads
    # the request: an honest 400 and one access line each.
    for what, path, head, body in (
            ("a Content-Length that is not a number", "/v1/bad-length",
             b"Content-Length: abc\r\n", b"{}"),
            ("a malformed chunked body", "/v1/bad-chunk",
             b"Transfer-Encoding: chunked\r\n", b"zz\r\nabc\r\n0\r\n\r\n")):
        reply = raw(host, port, b"POST %s HTTP/1.1\r\nHost: x\r\n%s\r\n%s"
                    % (path.encode(), head, body))
        check("%s: 400" % what, reply.startswith(b"HTTP/1.1 400 "), reply[:80])
        lines = access_lines(log, path)
        check("%s: one access line, 400, with libmicrohttpd's reason" % what,
              len([l for l in lines if " 400 " in l and "refused by libmicrohttpd" in l]) == 1
              and not [l for l in lines if " 499 " in l], lines)
    raw(host, port, b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"mess"
        % chat.encode(), read=False)
    s = socket.create_connection((host, port))
    s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"mess" % chat.encode())
    check("a body cut short is closed after the idle timeout", closed_within(s, 15))
    s.close()

    lorises = []
    for _ in range(8):
        s = socket.create_connection((host, port))
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        lorises.append(s)
    st, _, b = Client(url, key).request("POST", chat, {"messages": msg, "max_tokens": 2})
    check("served while slow-loris clients hold connections", st == 200, b)
    check("slow-loris clients are closed after the idle timeout",
          all(closed_within(s, 15) for s in lorises))
    for s in lorises:
        s.close()

    # A client that leaves mid-stream: its generation stops (log line).
    s = socket.create_connection((host, port))
    body = json.dumps({"messages": msg, "max_tokens": 1500, "stream": True,
                       "temperature": 0}).encode()
    s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
              b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
              % (chat.encode(), key.encode(), len(body)) + body)
    got = b""
    while got.count(b"data: ") < 3:
        got += s.recv(4096)
    ident = json.loads(got[got.index(b"data: ") + 6:].split(b"\n", 1)[0])["id"]
    s.close()
    stopped = False
    for _ in range(300):
        with open(log, errors="replace") as f:
            lines = [l for l in f if l.startswith("q4khost serve: %s:" % ident)]
        if lines:
            stopped = "(cancelled)" in lines[-1]
            break
        time.sleep(0.1)
    check("a client that left mid-stream stops its generation", stopped, lines)
    c = Client(url, key)  # the old connection idled past --idle-timeout
    st, _, b = c.request("GET", "/health")
    check("alive after all of that", st == 200 and json.loads(b)["status"] == "ok")
    with open(log, errors="replace") as f:
        check("the API key is never logged", key not in f.read())

    print("abuse: %d checks passed" % len(CHECKS))


if __name__ == "__main__":
    main()
