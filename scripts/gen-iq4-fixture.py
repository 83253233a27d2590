#!/usr/bin/env python3
"""Write the IQ4_NL / IQ4_XS dequantization fixture that tests/test_quant.c
checks.

gguf-py can dequantize but not quantize the i-quants, so the blocks are
random bytes (fixed seed) with their fp16 scales drawn from a sane range,
plus a few chosen extremes: negative, subnormal and large scales, and for
IQ4_XS the sub-block scales 0, 32 and 63. gguf-py's NumPy dequantizer (an
implementation independent of ours) gives the values.

Usage: scripts/gen-iq4-fixture.py [OUT]
OUT defaults to tests/fixtures/dequant-iq4.txt beside this script.
"""
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

SEED = 20251

FORMAT_NOTE = """\
# q4khost IQ4 dequantization fixture, written by scripts/gen-iq4-fixture.py
# from gguf-py's dequantizers. Per tensor, three lines:
#   tensor TYPE NE0 ROWS
#   bytes HEX (the rows' blocks back to back, as GGUF stores them)
#   values V... (NE0 * ROWS float32 values, row after row, %.9g)
"""


def random_scales(rng, n):
    """fp16 scales of either sign, magnitudes 1e-3 .. 1e-1 (log-uniform)."""
    mag = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), n))
    sign = np.where(rng.integers(0, 2, n) == 1, -1.0, 1.0)
    return (mag * sign).astype(np.float16)


def extremes(d):
    """Put a negative, a subnormal and a large scale at the front."""
    d[:3] = np.array([-0.0371, 3.0e-6, 1.5], dtype=np.float16)
    return d


def iq4_nl(rng, ne0, rows):
    n = ne0 // 32 * rows
    blocks = np.zeros((n, 18), dtype=np.uint8)
    blocks[:, 0:2] = extremes(random_scales(rng, n)).view(np.uint8).reshape(n, 2)
    blocks[:, 2:] = rng.integers(0, 256, (n, 16), dtype=np.uint8)
    return blocks


def iq4_xs(rng, ne0, rows):
    n = ne0 // 256 * rows
    blocks = np.zeros((n, 136), dtype=np.uint8)
    blocks[:, 0:2] = extremes(random_scales(rng, n)).view(np.uint8).reshape(n, 2)
    ls = rng.integers(0, 64, (n, 8))
    ls[0, :3] = [0, 32, 63]
    high = np.zeros(n, dtype=np.uint16)
    for j in range(8):
        high |= ((ls[:, j] >> 4) & 3).astype(np.uint16) << (2 * j)
    blocks[:, 2:4] = high.view(np.uint8).reshape(n, 2)
    for j in range(0, 8, 2):
        blocks[:, 4 + j // 2] = (ls[:, j] & 15) | ((ls[:, j + 1] & 15) << 4)
    blocks[:, 8:] = rng.integers(0, 256, (n, 128), dtype=np.uint8)
    return blocks


def tensor_lines(qtype, blocks, ne0, rows):
    values = dequantize(blocks.reshape(rows, -1), qtype)
    flat = np.asarray(values, dtype=np.float32).reshape(-1)
    if flat.size != ne0 * rows:
        raise SystemExit(f"{qtype.name}: {flat.size} values, expected "
                         f"{ne0 * rows}")
    return ["tensor %s %d %d" % (qtype.name, ne0, rows),
            "bytes " + blocks.tobytes().hex(),
            "values " + " ".join("%.9g" % v for v in flat)]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        here, "..", "tests", "fixtures", "dequant-iq4.txt")
    rng = np.random.default_rng(SEED)
    lines = [FORMAT_NOTE.rstrip("\n"), "q4khost-iq4-fixture 1", "tensors 2"]
    lines += tensor_lines(GGMLQuantizationType.IQ4_NL, iq4_nl(rng, 256, 3),
                          256, 3)
    lines += tensor_lines(GGMLQuantizationType.IQ4_XS, iq4_xs(rng, 512, 2),
                          512, 2)
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{out}: IQ4_NL 256 x 3, IQ4_XS 512 x 2")


if __name__ == "__main__":
    main()
