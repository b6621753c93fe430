#!/usr/bin/env python3
"""Produces tests/data/json-object/cases.json: byte strings and whether Python's json module
reads each as one JSON object (json.loads of the bytes decoded as strict UTF-8, so that encoded
surrogates, which json.loads of bytes lets through, are refused; and NaN/Infinity refused, which
it would take and JSON has not), the reference for kvpr's JSON recognizer
(engine/constrain/json_object.h). Valid documents are random values written by json.dumps in several
styles (compact, spaced, indented, ASCII-escaped or not) and hand-made edge cases; invalid ones
are those documents with a byte deleted, inserted or replaced (classified by json.loads, so some
stay valid) and hand-made near misses. Bytes are stored as hex. Run offline:
  python3 tests/scripts/make_json_object_fixtures.py
"""
import json
import os
import random

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "json-object")


def reject_constant(name):
    raise ValueError(name)


def is_object(b):
    try:
        return isinstance(json.loads(b.decode("utf-8"), parse_constant=reject_constant), dict)
    except (ValueError, UnicodeDecodeError):
        return False


def rand_string(rng):
    pools = ["abc xyz", "\"\\/\b\f\n\r\t", "\u00e9\u00df\u4e1c\u4eac", "\U0001f600\U00010348", "\x01\x1f\x7f",
             "\u2028\ud7ff\ue000\uffff"]
    return "".join(rng.choice(rng.choice(pools)) for _ in range(rng.randint(0, 8)))


def rand_value(rng, depth):
    k = rng.randint(0, 9 if depth < 4 else 5)
    if k == 0:
        return rng.choice([True, False, None])
    if k in (1, 2):
        return rng.choice([0, -0.0, 1, -7, 123456789012, 2.5, -1e-7, 6.02e23, 1e300, rng.randint(-10**6, 10**6),
                           rng.uniform(-1e3, 1e3)])
    if k in (3, 4, 5):
        return rand_string(rng)
    if k in (6, 7):
        return [rand_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rand_string(rng): rand_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def dumps(rng, v):
    style = rng.randint(0, 4)
    if style == 0:
        return json.dumps(v, separators=(",", ":"), ensure_ascii=False)
    if style == 1:
        return json.dumps(v, ensure_ascii=True)
    if style == 2:
        return json.dumps(v, indent=2, ensure_ascii=False)
    if style == 3:
        return json.dumps(v, indent="\t", ensure_ascii=rng.random() < 0.5)
    return " \n" + json.dumps(v, ensure_ascii=False) + "\r\n "


HAND_VALID = [
    b"{}", b" {} ", b'{"a":1}', b'{"a":[]}', b'{"a":{}}', b'{"":""}', b'{"a":-0}', b'{"a":0.0e+0}', b'{"a":1E-2}',
    b'{"a":[true,false,null]}', b'{"\\u00e9\\uD83D\\uDE00":"\\"\\\\\\/\\b\\f\\n\\r\\t"}', '{"k":"\u20ac\U0001f600"}'.encode(),
    b'{"a":[[[[[]]]]]}', b'{"a" : 1 , "b" : [ 1 , 2 ] }', b'{"a":123e45}', b'{"dup":1,"dup":2}',
]
HAND_INVALID = [
    b"", b" ", b"[]", b'"s"', b"1", b"null", b"{", b"}", b"{]", b'{"a"}', b'{"a":}', b'{"a":1,}', b'{,"a":1}',
    b'{"a":01}', b'{"a":1.}', b'{"a":.5}', b'{"a":1e}', b'{"a":+1}', b'{"a":--1}', b'{"a":0x10}', b'{"a":NaN}',
    b'{"a":Infinity}', b'{"a":tru}', b'{"a":True}', b'{"a":nul}', b"{'a':1}", b'{a:1}', b'{"a":"\x01"}',
    b'{"a":"\\x41"}', b'{"a":"\\u12G4"}', b'{"a":"\\u12"}', b'{"a":"unterminated}', b'{"a":1}{"b":2}',
    b'{"a":1} x', b'{"a":[1,2}', b'{"a":{"b":1]}', b'{"a":"\xc3"}', b'{"a":"\xc3\x28"}', b'{"a":"\xe0\x80\x80"}',
    b'{"a":"\xed\xa0\x80"}', b'{"a":"\xf4\x90\x80\x80"}', b'{"a":"\xf5\x80\x80\x80"}', b'{"a":"\xc0\xaf"}',
    b'{"a":"\x80"}', b'{"a":1 2}', b'{"a" 1}', b'{"a"::1}', b'{"a":[1 2]}', b'{"a":[,1]}',
]


def main():
    rng = random.Random(20261130)
    cases = []
    for b in HAND_VALID + HAND_INVALID:
        cases.append({"hex": b.hex(), "object": is_object(b)})
    docs = []
    while len(docs) < 300:
        v = {rand_string(rng): rand_value(rng, 1) for _ in range(rng.randint(0, 5))}
        docs.append(dumps(rng, v).encode())
    for d in docs:
        cases.append({"hex": d.hex(), "object": is_object(d)})
        for _ in range(2):
            m = bytearray(d)
            at = rng.randrange(len(m) + 1)
            op = rng.randint(0, 2)
            if op == 0 and at < len(m):
                del m[at]
            elif op == 1:
                m.insert(at, rng.choice(b'{}[]",:\\ 0e.-tfnx\x00\xc3\x80'))
            elif at < len(m):
                m[at] = rng.choice(b'{}[]",:\\ 0e.-tfnx\x00\xc3\x80')
            cases.append({"hex": bytes(m).hex(), "object": is_object(bytes(m))})
    assert all(c["object"] for c in cases[len(HAND_VALID + HAND_INVALID):][::3])
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "cases.json"), "w") as f:
        json.dump(cases, f, indent=0)
        f.write("\n")
    print(f"{len(cases)} cases, {sum(c['object'] for c in cases)} valid")


if __name__ == "__main__":
    main()
