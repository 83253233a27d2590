#!/usr/bin/env python3
"""Write the dequantization fixture that tests/test_quant.c checks.

For every tensor of the default model, gguf-py's NumPy dequantizers (an
implementation independent of ours) give the values; the fixture keeps
their float64 sum, sum of squares, sum of absolute values, min and max, and
the values at 64 pseudo-random flat indices (fixed seed).

Usage: scripts/gen-dequant-fixture.py [MODEL.gguf [OUT]]
MODEL defaults to $Q4KHOST_MODEL, else the cache path scripts/fetch-model.sh
fills; OUT to tests/fixtures/dequant-gemma3-270m.txt beside this script.
"""
import os
import sys

from scripthelp import answer_help
answer_help(__doc__)  # before what may be missing

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

SAMPLES = 64
SEED = 20250

FORMAT_NOTE = """\
# q4khost dequantization fixture, written by scripts/gen-dequant-fixture.py
# from gguf-py's dequantizers. Per tensor, one line
#   tensor NAME TYPE NE0 ROWS SUM SUMSQ SUMABS MIN MAX
# (float64 statistics over every value, ROWS = ne1 * ne2 * ne3), then one
# line of FLAT_INDEX:VALUE pairs, flat index = row * NE0 + column.
"""


def default_model():
    env = os.environ.get("Q4KHOST_MODEL")
    if env:
        return env
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(
        os.environ.get("HOME", "/root"), ".cache")
    return os.path.join(cache, "q4khost", "models",
                        "gemma-3-270m-q4_k_m.gguf")


def tensor_lines(tensor, rng):
    values = dequantize(tensor.data, tensor.tensor_type)
    flat = np.asarray(values, dtype=np.float32).reshape(-1)
    ne0 = int(tensor.shape[0])
    if flat.size != int(tensor.n_elements) or flat.size % ne0:
        raise SystemExit(f"{tensor.name}: {flat.size} values for shape "
                         f"{list(tensor.shape)}")
    v64 = flat.astype(np.float64)
    stats = (v64.sum(), (v64 * v64).sum(), np.abs(v64).sum(), v64.min(),
             v64.max())
    head = "tensor %s %s %d %d %s" % (
        tensor.name, tensor.tensor_type.name, ne0, flat.size // ne0,
        " ".join("%.17g" % s for s in stats))
    idx = np.sort(rng.integers(0, flat.size, SAMPLES))
    pairs = " ".join("%d:%.9g" % (i, flat[i]) for i in idx)
    return head, pairs


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    model = sys.argv[1] if len(sys.argv) > 1 else default_model()
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
        here, "..", "tests", "fixtures", "dequant-gemma3-270m.txt")
    reader = GGUFReader(model)
    rng = np.random.default_rng(SEED)
    lines = [FORMAT_NOTE.rstrip("\n"),
             "q4khost-dequant-fixture 1",
             "model %s %d" % (os.path.basename(model),
                              os.path.getsize(model)),
             "tensors %d" % len(reader.tensors),
             "samples %d" % SAMPLES]
    for tensor in reader.tensors:
        lines.extend(tensor_lines(tensor, rng))
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{out}: {len(reader.tensors)} tensors")


if __name__ == "__main__":
    main()
