#!/usr/bin/env python3
"""fp8 E4M3 ("e4m3fn": no infinities, largest finite 448) reference values for
tests/engine/base/test_dtype.cc, computed independently of engine/base/dtype.h: every finite value of the
format is enumerated from its definition as an exact fraction, and each float32 input is
mapped to the nearest one by exact comparison (ties to the even mantissa), magnitudes past
448 saturating to 448 as CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) does.

Writes tests/data/fp8/e4m3.json: {"decode": [256 values as strings, "nan" for NaN],
"encode": [[float32 bits, expected byte], ...]}.
"""
import json
import os
import random
import struct
from fractions import Fraction


def value(byte):
    s, e, m = byte >> 7, (byte >> 3) & 15, byte & 7
    if e == 15 and m == 7:
        return None  # NaN
    mag = Fraction(m, 8) * Fraction(1, 64) if e == 0 else (1 + Fraction(m, 8)) * Fraction(2) ** (e - 7)
    return -mag if s else mag


GRID = sorted((value(b), b) for b in range(128) if value(b) is not None)  # non-negative values


def encode(bits):
    f = struct.unpack('<f', struct.pack('<I', bits))[0]
    sign = 0x80 if bits >> 31 else 0
    if f != f:
        return sign | 0x7f
    if f in (float('inf'), float('-inf')):
        return sign | 0x7e
    a = abs(Fraction(f))
    if a >= 448:
        return sign | 0x7e
    # The two grid neighbours; the nearer wins, a tie goes to the even byte (even mantissa).
    lo = max((g for g in GRID if g[0] <= a), key=lambda g: g[0])
    hi = min((g for g in GRID if g[0] >= a), key=lambda g: g[0])
    if a - lo[0] < hi[0] - a:
        b = lo[1]
    elif a - lo[0] > hi[0] - a:
        b = hi[1]
    else:
        b = lo[1] if lo[1] % 2 == 0 else hi[1]
    return sign | b


def f32bits(x):
    return struct.unpack('<I', struct.pack('<f', x))[0]


def main():
    rng = random.Random(8)
    inputs = set()
    for b in range(256):  # every value, its neighbours and the midpoints between values
        v = value(b)
        if v is None:
            continue
        x = float(v)
        inputs.add(f32bits(x))
        bits = f32bits(x)
        inputs.update({(bits + 1) & 0xffffffff, (bits - 1) & 0xffffffff})
    for (a, _), (c, _) in zip(GRID, GRID[1:]):
        mid = f32bits(float((a + c) / 2))
        inputs.update({mid, mid + 1, mid - 1})
        for sign in (0, 0x80000000):
            inputs.update({mid | sign, (mid + 1) | sign, (mid - 1) | sign})
    for x in (448.0, 449.0, 463.99, 464.0, 465.0, 480.0, 1e6, 3.4e38, 2.0 ** -10, 2.0 ** -11, 1e-30, 0.0, -0.0):
        inputs.update({f32bits(x), f32bits(-x)})
    inputs.update({0x7f800000, 0xff800000, 0x7fc00000, 0xffc00001, 0x00000001, 0x80000001})
    for _ in range(3000):  # random magnitudes across the format's range and beyond
        inputs.add(f32bits(rng.choice((-1, 1)) * 2.0 ** rng.uniform(-12, 10)))
    encode_cases = [[bits, encode(bits)] for bits in sorted(inputs)]
    decode = ['nan' if value(b) is None else repr(float(value(b))) for b in range(256)]
    out = os.path.join(os.path.dirname(__file__), '..', 'data', 'fp8', 'e4m3.json')
    with open(out, 'w') as f:
        json.dump({'decode': decode, 'encode': encode_cases}, f, separators=(',', ':'))
    print('wrote', out, len(encode_cases), 'encode cases')


if __name__ == '__main__':
    main()
