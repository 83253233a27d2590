#!/usr/bin/env python3
"""Write the block dequantization fixture that tests/test_quant.c,
tests/test_cpu_fast_ops.c and tests/test_cpu_simd.c check: a few rows of
every weight type q4khost multiplies (F32, F16, BF16, Q4_0, Q4_1, Q5_0,
Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS).

gguf-py cannot quantize most of these, so the blocks are random bytes
(fixed seed) with their fp16 scales and mins drawn from a sane range, plus
a few chosen extremes: a negative, a subnormal and a large scale in the
first blocks, and for IQ4_XS the sub-block scales 0, 32 and 63. The float
types hold random values of either sign over several octaves, a zero and a
negative zero. gguf-py's NumPy dequantizers (an implementation independent
of ours) give the values.

Usage: scripts/gen-blocks-fixture.py [OUT]
OUT defaults to tests/fixtures/dequant-blocks.txt beside this script.
"""
import os
import sys

from scripthelp import answer_help
answer_help(__doc__)  # before what may be missing

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

SEED = 20251

FORMAT_NOTE = """\
# q4khost block dequantization fixture, written by
# scripts/gen-blocks-fixture.py from gguf-py's dequantizers. Per tensor,
# three lines:
#   tensor TYPE NE0 ROWS
#   bytes HEX (the rows' blocks back to back, as GGUF stores them)
#   values V... (NE0 * ROWS float32 values, row after row, %.9g)
"""

# Byte offsets of each type's fp16 scale and min fields in its block
# (ggml-common.h; q4khost/quant.h).
HALF_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2],
    T.Q6_K: [208], T.IQ4_NL: [0], T.IQ4_XS: [0],
}

# Row lengths: several blocks a row, two super-blocks for the K-quants.
SHAPES = {
    T.F32: (96, 3), T.F16: (96, 3), T.BF16: (96, 3),
    T.Q4_0: (256, 3), T.Q4_1: (256, 3), T.Q5_0: (256, 3), T.Q5_1: (256, 3),
    T.Q8_0: (256, 3), T.IQ4_NL: (256, 3),
    T.Q2_K: (512, 2), T.Q3_K: (512, 2), T.Q4_K: (512, 2), T.Q5_K: (512, 2),
    T.Q6_K: (512, 2), T.IQ4_XS: (512, 2),
}


def random_halves(rng, n):
    """fp16 values of either sign, magnitudes 1e-3 .. 1e-1 (log-uniform),
    with a negative, a subnormal and a large one first."""
    mag = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), n))
    sign = np.where(rng.integers(0, 2, n) == 1, -1.0, 1.0)
    d = (mag * sign).astype(np.float16)
    d[:3] = np.array([-0.0371, 3.0e-6, 1.5], dtype=np.float16)[:n]
    return d


def float_values(rng, n):
    """Values of either sign over 2^-20 .. 2^6, a zero and a negative zero."""
    v = np.exp2(rng.uniform(-20, 6, n)) * np.where(rng.integers(0, 2, n) == 1, -1.0, 1.0)
    v[:2] = [0.0, -0.0]
    return v.astype(np.float32)


def float_blocks(rng, qtype, n):
    v = float_values(rng, n)
    if qtype == T.F32:
        return v.view(np.uint8)
    if qtype == T.F16:
        return v.astype(np.float16).view(np.uint8)
    # BF16: the high half of each float32, truncated (any bits are valid)
    return (v.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)


def quant_blocks(rng, qtype, n):
    _, size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (n, size), dtype=np.uint8)
    for off in HALF_FIELDS[qtype]:
        blocks[:, off:off + 2] = random_halves(rng, n).view(np.uint8).reshape(n, 2)
    if qtype == T.IQ4_XS:
        set_iq4_xs_scales(blocks[0], [0, 32, 63])
    return blocks


def set_iq4_xs_scales(block, first):
    """Sub-block scales FIRST at the front of one IQ4_XS block."""
    high = int(block[2]) | int(block[3]) << 8
    for j, ls in enumerate(first):
        high = high & ~(3 << 2 * j) | ((ls >> 4) & 3) << 2 * j
        shift = 4 * (j % 2)
        block[4 + j // 2] = int(block[4 + j // 2]) & (0xFF ^ 15 << shift) | (ls & 15) << shift
    block[2:4] = np.array([high & 0xFF, high >> 8], dtype=np.uint8)


def tensor_lines(rng, qtype):
    ne0, rows = SHAPES[qtype]
    block_elems, _ = GGML_QUANT_SIZES[qtype]
    n = ne0 // block_elems * rows
    if block_elems == 1:
        data = float_blocks(rng, qtype, n)
    else:
        data = quant_blocks(rng, qtype, n)
    data = np.ascontiguousarray(data).reshape(rows, -1)
    flat = np.asarray(dequantize(data, qtype), dtype=np.float32).reshape(-1)
    if flat.size != ne0 * rows or not np.all(np.isfinite(flat)):
        raise SystemExit(f"{qtype.name}: {flat.size} values, expected {ne0 * rows} finite")
    return ["tensor %s %d %d" % (qtype.name, ne0, rows),
            "bytes " + data.tobytes().hex(),
            "values " + " ".join("%.9g" % v for v in flat)]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        here, "..", "tests", "fixtures", "dequant-blocks.txt")
    rng = np.random.default_rng(SEED)
    lines = [FORMAT_NOTE.rstrip("\n"), "q4khost-blocks-fixture 1", "tensors %d" % len(SHAPES)]
    for qtype in SHAPES:
        lines += tensor_lines(rng, qtype)
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{out}: " + ", ".join(f"{t.name} {s[0]} x {s[1]}" for t, s in SHAPES.items()))


if __name__ == "__main__":
    main()
