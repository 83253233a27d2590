#!/usr/bin/env python3
"""Requantize a GGUF model's matrices to the 4-bit i-quants.

Every 2-D weight matrix becomes IQ4_XS when its rows (ne0) are a multiple
of 256 values, else IQ4_NL (rows a multiple of 32); everything else (norms,
vectors) and every metadata key is copied unchanged, except
general.file_type (MOSTLY_IQ4_XS). The source values are gguf-py's
dequantization of the input. gguf-py cannot quantize these types, so the
quantizer is ours:

  IQ4_NL, per block of 32: for scales that put the block's largest value
    on either end of the 16-value codebook, stretched by a few factors, take
    the nearest code for each value, refit the scale by least squares, round
    it to fp16, re-pick the codes for that scale, and keep the scale with the
    smallest squared error.
  IQ4_XS, per 256 values: each block of 32 gets its best scale as above; the
    super-block scale d maps the largest of them to -32 (a few stretches
    tried), each block's 6-bit scale is round(s / d) + 32 clamped to 0..63,
    and the codes are re-picked for d * (ls - 32).

Every quantized tensor is checked by gguf-py's dequantizer, which must give
exactly the values the quantizer chose; the script then prints the relative
RMS error (||q - x|| / ||x|| over all values) per output type and the worst
tensor of each.

Usage: scripts/convert-iq4.py [IN.gguf [OUT.gguf]]
IN defaults to $Q4KHOST_MODEL, else the default model's cache path; OUT to
gemma-3-270m-iq4_xs.gguf beside it (never inside the source tree).
"""
import os
import sys

from scripthelp import answer_help
answer_help(__doc__)  # before what may be missing

import numpy as np
from gguf import (GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter,
                  LlamaFileType)
from gguf.quants import dequantize

KVALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10,
                    1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float32)
# Decision points between neighbouring codebook values.
MIDPOINTS = (KVALUES[1:] + KVALUES[:-1]) / 2
# Block scales tried: the largest value on either codebook end, stretched.
STRETCH = np.array([0.85, 0.9, 0.95, 1.0, 1.05, 1.1], dtype=np.float32)
# Super-block scales tried for IQ4_XS.
XS_STRETCH = np.array([0.96, 1.0, 1.04], dtype=np.float32)
ROWS_PER_CHUNK = 4096
IQ4_NL, IQ4_XS = GGMLQuantizationType.IQ4_NL, GGMLQuantizationType.IQ4_XS


def default_model():
    env = os.environ.get("Q4KHOST_MODEL")
    if env:
        return env
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(
        os.environ.get("HOME", "/root"), ".cache")
    return os.path.join(cache, "q4khost", "models",
                        "gemma-3-270m-q4_k_m.gguf")


# --- quantization ----------------------------------------------------------

def nearest_codes(x, scale):
    """Codes (0..15) nearest to x / scale; scale 0 gives the code of 1."""
    safe = np.where(scale == 0, 1.0, scale)
    return np.searchsorted(MIDPOINTS, x / safe).astype(np.uint8)


def fp16(v):
    return v.astype(np.float16).astype(np.float32)


def best_scales(x, rounded):
    """Per row of x (blocks of 32): the scale with the least squared error
    and its error. rounded: round the refitted scale to fp16."""
    amax_at = np.argmax(np.abs(x), axis=1)
    peak = np.take_along_axis(x, amax_at[:, None], axis=1)[:, 0]
    best = np.zeros(len(x), dtype=np.float32)
    best_err = np.full(len(x), np.inf, dtype=np.float32)
    for end in (KVALUES[0], KVALUES[-1]):
        for s in STRETCH:
            scale = (peak / (end * s)).astype(np.float32)
            k = KVALUES[nearest_codes(x, scale[:, None])]
            kk = (k * k).sum(axis=1)
            fit = np.where(kk > 0, (x * k).sum(axis=1) / np.maximum(kk, 1e-30),
                           0).astype(np.float32)
            if rounded:
                fit = fp16(fit)
            k = KVALUES[nearest_codes(x, fit[:, None])]
            err = ((x - fit[:, None] * k) ** 2).sum(axis=1)
            better = err < best_err
            best[better] = fit[better]
            best_err[better] = err[better]
    return best, best_err


def pack_codes(codes):
    """(n, 32) codes -> (n, 16) bytes: value i low nibble of byte i, value
    i + 16 high nibble (quant.h)."""
    return codes[:, :16] | (codes[:, 16:] << 4)


def quantize_nl(x):
    """x: (rows, ne0) float32 -> (bytes of the rows, dequantized values)."""
    blocks = x.reshape(-1, 32)
    d, _ = best_scales(blocks, rounded=True)
    codes = nearest_codes(blocks, d[:, None])
    out = np.empty((len(blocks), 18), dtype=np.uint8)
    out[:, :2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = pack_codes(codes)
    values = d[:, None] * KVALUES[codes]
    return out.reshape(x.shape[0], -1), values.reshape(x.shape)


def xs_candidate(sub, s, dsb):
    """One super-block scale per row of sub (8 blocks of 32 each): the
    6-bit block scales, codes, values and squared error."""
    dsb = fp16(dsb)
    safe = np.where(dsb == 0, 1.0, dsb)
    ls = np.clip(np.rint(s / safe[:, None]), -32, 31).astype(np.int32)
    scale = dsb[:, None] * ls
    codes = nearest_codes(sub, scale[:, :, None])
    values = scale[:, :, None] * KVALUES[codes]
    err = ((sub - values) ** 2).sum(axis=(1, 2))
    return ls + 32, codes, values, err, dsb


def quantize_xs(x):
    """x: (rows, ne0), ne0 % 256 == 0 -> (bytes of the rows, values)."""
    sub = x.reshape(-1, 8, 32)
    s, _ = best_scales(sub.reshape(-1, 32), rounded=False)
    s = s.reshape(-1, 8)
    peak = np.take_along_axis(s, np.argmax(np.abs(s), axis=1)[:, None],
                              axis=1)[:, 0]
    best = None
    for f in XS_STRETCH:
        cand = xs_candidate(sub, s, peak / (-32.0 * f))
        if best is None:
            best = list(cand)
            continue
        better = cand[3] < best[3]
        for i, part in enumerate(cand):
            best[i][better] = part[better]
    ls, codes, values, _, dsb = best
    n = len(sub)
    out = np.empty((n, 136), dtype=np.uint8)
    out[:, :2] = dsb.astype(np.float16).view(np.uint8).reshape(n, 2)
    high = np.zeros(n, dtype=np.uint16)
    for j in range(8):
        high |= ((ls[:, j] >> 4) & 3).astype(np.uint16) << (2 * j)
    out[:, 2:4] = high.view(np.uint8).reshape(n, 2)
    out[:, 4:8] = (ls[:, 0::2] & 15) | ((ls[:, 1::2] & 15) << 4)
    out[:, 8:] = pack_codes(codes.reshape(-1, 32).astype(np.uint8)).reshape(
        n, 128)
    return out.reshape(x.shape[0], -1), values.reshape(x.shape)


# --- the file ----------------------------------------------------------------

def copy_metadata(reader, writer):
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or \
           field.name == "general.architecture":
            continue
        vtype = field.types[0]
        if field.name == "general.file_type":
            writer.add_key_value(field.name, int(LlamaFileType.MOSTLY_IQ4_XS),
                                 vtype)
            continue
        if vtype == GGUFValueType.ARRAY:
            sub = field.types[-1]
            items = [field.parts[i] for i in field.data]
            if sub == GGUFValueType.STRING:
                val = [bytes(p) for p in items]
            else:
                val = [p[0].item() for p in items]
            writer.add_key_value(field.name, val, vtype, sub_type=sub)
        elif vtype == GGUFValueType.STRING:
            writer.add_key_value(field.name, bytes(field.parts[field.data[0]]),
                                 vtype)
        else:
            writer.add_key_value(field.name,
                                 field.parts[field.data[0]][0].item(), vtype)


def is_matrix(tensor):
    shape = [int(v) for v in tensor.shape]
    return len(shape) >= 2 and int(np.prod(shape[1:])) > 1 and \
        shape[0] % 32 == 0


def requantize(tensor, stats):
    ne0 = int(tensor.shape[0])
    qtype = IQ4_XS if ne0 % 256 == 0 else IQ4_NL
    source = np.asarray(dequantize(tensor.data, tensor.tensor_type),
                        dtype=np.float32).reshape(-1, ne0)
    parts, err2, ref2 = [], 0.0, 0.0
    for r0 in range(0, len(source), ROWS_PER_CHUNK):
        x = source[r0:r0 + ROWS_PER_CHUNK]
        raw, values = (quantize_xs if qtype == IQ4_XS else quantize_nl)(x)
        check = np.asarray(dequantize(raw, qtype), dtype=np.float32)
        if not np.array_equal(check.reshape(values.shape), values):
            raise SystemExit(f"{tensor.name}: gguf-py dequantizes our "
                             f"{qtype.name} blocks to other values")
        err2 += float(((values.astype(np.float64) - x) ** 2).sum())
        ref2 += float((x.astype(np.float64) ** 2).sum())
        parts.append(raw)
    rel = (err2 / ref2) ** 0.5 if ref2 > 0 else 0.0
    s = stats.setdefault(qtype.name, {"tensors": 0, "values": 0, "err2": 0.0,
                                      "ref2": 0.0, "worst": (0.0, "")})
    s["tensors"] += 1
    s["values"] += source.size
    s["err2"] += err2
    s["ref2"] += ref2
    s["worst"] = max(s["worst"], (rel, tensor.name))
    print(f"  {tensor.name:32s} {tensor.tensor_type.name:>6s} -> "
          f"{qtype.name:6s} relative RMS error {rel:.5f}", flush=True)
    return np.concatenate(parts), qtype


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else default_model()
    dst = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
        os.path.dirname(os.path.abspath(src)), "gemma-3-270m-iq4_xs.gguf")
    reader = GGUFReader(src)
    arch = bytes(reader.fields["general.architecture"].parts[
        reader.fields["general.architecture"].data[0]]).decode()
    writer = GGUFWriter(dst, arch)
    copy_metadata(reader, writer)
    stats = {}
    print(f"{src} -> {dst}")
    for tensor in reader.tensors:
        if is_matrix(tensor):
            raw, qtype = requantize(tensor, stats)
            outer = tuple(int(v) for v in reversed(tensor.shape[1:]))
            writer.add_tensor(tensor.name, raw.reshape(outer + (-1,)),
                              raw_dtype=qtype)
        else:
            writer.add_tensor(tensor.name, tensor.data,
                              raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print("relative RMS error against the source's values, per type:")
    for name, s in sorted(stats.items()):
        print(f"  {name:6s} {s['tensors']:3d} tensors {s['values']:11d} values"
              f"  {(s['err2'] / s['ref2']) ** 0.5:.5f}  (worst "
              f"{s['worst'][1]}: {s['worst'][0]:.5f})")


if __name__ == "__main__":
    main()
