#!/usr/bin/env python3
"""Produces tests/data/json-object/schema_cases.json: JSON Schemas (hand-written, and Pydantic
v2's model_json_schema() of models with nested models, Optional fields, Literal enums, length
limits and a recursive tree, as written and made strict the way OpenAI's structured outputs
want them), documents generated from each (written compact, spaced, indented), those documents
with a byte deleted, inserted or replaced, and whether each is valid against its schema by the
`jsonschema` package (Draft 2020-12), with the style rules kvpr's recognizer
(engine/constrain/json_schema.h) adds: an integer is written without a fraction or exponent, a key is given
once, and the text is UTF-8 JSON without NaN/Infinity. Bytes are stored as hex. Run offline:
  python3 tests/scripts/make_json_schema_fixtures.py
"""
import copy
import datetime
import enum
import json
import math
import os
import random
import sys
import uuid
from typing import List, Literal, Optional

import jsonschema
from pydantic import BaseModel, Field

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "json-object")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_regex_fixtures import FORMATS, python_match  # noqa: E402  (the formats' regexes, ECMAScript matching)


class Address(BaseModel):
    street: str
    city: str = Field(min_length=1, max_length=12)
    zip: Optional[str] = None


class Person(BaseModel):
    name: str = Field(min_length=1, max_length=20)
    age: int
    email: Optional[str] = None
    tags: List[str] = Field(max_length=3)
    address: Address
    role: Literal["admin", "user", "guest"]
    kind: Literal["person"] = "person"
    scores: List[float]
    active: bool


class Reading(BaseModel):
    age: int = Field(ge=0, le=120)
    ratio: float = Field(gt=0, lt=1)
    temp: float = Field(ge=-40.5, le=60)
    count: int = Field(gt=-3, lt=1000)
    big: int = Field(ge=100000)
    below: int = Field(le=-7)


class Event(BaseModel):
    when: datetime.datetime
    day: datetime.date
    id: uuid.UUID
    contact: str = Field(pattern=r"^[a-z]+@[a-z]+\.(com|org)$")
    code: str = Field(pattern=r"^[A-Z]{2}-\d{3}$", max_length=6)
    note: Optional[str] = Field(default=None, pattern="ok")


class Shade(str, enum.Enum):
    light = "light"
    dark = "dark"


# Sets of literals: Pydantic writes set[Literal[...]], frozenset[bool] and set[SomeEnum] as arrays
# with uniqueItems true.
class Palette(BaseModel):
    colors: set[Literal["red", "green", "blue", "cyan"]]
    flags: frozenset[bool] = Field(min_length=1)
    shades: Optional[set[Shade]] = None


# Tuples: Pydantic writes tuple[int, int] as prefixItems with minItems = maxItems = 2, and
# tuple[int, ...] as items.
class Shape(BaseModel):
    point: tuple[int, int]
    label: tuple[str, float, bool]
    path: tuple[int, ...]
    named: Optional[tuple[Literal["x", "y"], tuple[int, str]]] = None


class Tree(BaseModel):
    value: int
    children: List["Tree"] = []


def strict(schema):
    """As OpenAI's SDK makes a schema strict: every object closed, every property required."""
    s = copy.deepcopy(schema)

    def walk(n):
        if isinstance(n, dict):
            if n.get("type") == "object" or "properties" in n:
                n["additionalProperties"] = False
                n["required"] = list(n.get("properties", {}))
            for v in n.values():
                walk(v)
        elif isinstance(n, list):
            for v in n:
                walk(v)
    walk(s)
    return s


SCHEMAS = [
    Person.model_json_schema(),
    strict(Person.model_json_schema()),
    Tree.model_json_schema(),
    strict(Tree.model_json_schema()),
    {"type": "object", "properties": {"value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#"}}},
     "required": ["value", "children"], "additionalProperties": False},
    {"anyOf": [
        {"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}}, "required": ["kind", "x"],
         "additionalProperties": False},
        {"type": "object", "properties": {"kind": {"const": "b"}, "y": {"type": "string", "maxLength": 4}},
         "required": ["kind", "y"], "additionalProperties": False},
        {"type": "object", "properties": {"kindest": {"type": "boolean"}}, "required": ["kindest"],
         "additionalProperties": False}]},
    {"type": "object", "properties": {"v": {"type": ["string", "null", "integer"]},
                                      "n": {"enum": [1, 2.5, "x", None, True]},
                                      "list": {"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 3}},
     "required": ["v", "n", "list"], "additionalProperties": False},
    {"type": "object", "additionalProperties": {"type": "integer"}},
    {"type": "object", "properties": {"s": {"type": "string", "minLength": 2, "maxLength": 3}}, "required": ["s"]},
    {"type": "array", "items": {"type": "object", "properties": {"name": {"enum": ["get_weather", "get_time"]},
                                                                "parameters": {"type": "object"}},
                                "required": ["name", "parameters"], "additionalProperties": False}, "minItems": 1},
    {"type": "object", "properties": {}, "additionalProperties": False},
    {"type": ["integer", "boolean"]},
    Reading.model_json_schema(),
    {"type": "array", "items": {"anyOf": [{"type": "number", "exclusiveMinimum": -1, "maximum": 2.5},
                                          {"type": "integer", "minimum": 1.5, "exclusiveMaximum": 9.5}]}, "maxItems": 4},
    {"type": "object", "properties": {"p": {"type": "number", "minimum": 0.1, "maximum": 0.3}},
     "required": ["p"], "additionalProperties": False},
]
# Schemas whose every number is bounded: kvpr writes those without an exponent (a style rule
# the validity below adds).
NO_EXPONENT = {len(SCHEMAS) - 3, len(SCHEMAS) - 2, len(SCHEMAS) - 1}
SCHEMAS += [
    Event.model_json_schema(),
    {"type": "array", "items": {"anyOf": [{"type": "string", "format": "ipv4"}, {"type": "string", "format": "time"},
                                          {"type": "string", "pattern": "^v[0-9]+$"}]}, "maxItems": 3},
]
SCHEMAS += [
    Shape.model_json_schema(),
    strict(Shape.model_json_schema()),
    # A prefix, then booleans, at most 4 items; a prefix and nothing after it (items false);
    # an unused uniqueItems false.
    {"type": "array", "prefixItems": [{"type": "string", "maxLength": 3}, {"type": "integer"}],
     "items": {"type": "boolean"}, "maxItems": 4, "uniqueItems": False},
    {"prefixItems": [{"enum": ["a", "b"]}, {"type": "null"}], "items": False, "minItems": 1},
    Palette.model_json_schema(),
    strict(Palette.model_json_schema()),
    {"type": "array", "items": {"enum": [1, 7, "x", None, "xy"]}, "uniqueItems": True, "minItems": 1},
    # A closed object whose other keys are those its patterns match (one pattern's keys are a
    # finite set beside a listed name); an open one with a number of keys between bounds.
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 4}, "ab": {"type": "null"}},
     "patternProperties": {"^x-[a-z]+$": {"type": "integer"}, "^a[bc]$": {"type": "null"}},
     "required": ["name"], "additionalProperties": False},
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "null"}},
     "additionalProperties": {"type": "string", "maxLength": 3}, "minProperties": 2, "maxProperties": 3},
    # Unique items that are strings and numbers, compared by value.
    {"type": "array", "items": {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "number"}]},
     "uniqueItems": True, "maxItems": 4},
    # Multiples (of a binary fraction, which the validator's float division takes exactly).
    {"type": "object", "properties": {"q": {"type": "number", "multipleOf": 0.25, "minimum": 0.5},
                                      "n": {"type": "integer", "multipleOf": 3}},
     "required": ["q", "n"], "additionalProperties": False},
]
NO_EXPONENT.add(len(SCHEMAS) - 1)
# Keys the patterns of patternProperties match.
PATTERN_KEYS = {"^x-[a-z]+$": ["x-a", "x-vendor", "x-id"], "^a[bc]$": ["ac"]}
# Values of strings under a format or pattern, which random text would not match.
EXAMPLES = {
    "date-time": ["2024-07-01T12:30:00Z", "1999-12-31t23:59:60.25-08:00"],
    "date": ["2024-02-29", "1970-01-01"],
    "time": ["00:00:00Z", "12:34:56.789+05:30"],
    "uuid": ["123e4567-e89b-12d3-a456-426614174000", "AAAAAAAA-BBBB-CCCC-DDDD-EEEEEEEEEEEE"],
    "ipv4": ["192.168.0.1", "255.255.255.255", "0.0.0.0"],
    r"^[a-z]+@[a-z]+\.(com|org)$": ["ada@example.org", "b@c.com"],
    r"^[A-Z]{2}-\d{3}$": ["AB-123", "ZZ-000"],
    "ok": ["ok", "this is ok!", "okok"],
    "^v[0-9]+$": ["v1", "v2024"],
}


def resolve(root, s):
    while isinstance(s, dict) and "$ref" in s:
        ref = s["$ref"]
        if ref == "#":
            s = root
        else:
            _, kind, name = ref.split("/")
            s = root[kind][name]
    return s


def rand_text(rng, lo=0, hi=8):
    chars = "abc xyz\"\\\n\u00e9\u4e1c\U0001f600"
    return "".join(rng.choice(chars) for _ in range(rng.randint(lo, hi)))


def gen(root, s, rng, depth=0):
    s = resolve(root, s)
    if s is True or s == {}:
        return rng.choice([1, "any", None, [1, 2], {"k": False}])
    for key in ("anyOf", "oneOf"):
        if key in s:
            return gen(root, rng.choice(s[key]), rng, depth)
    if "const" in s:
        return s["const"]
    if "enum" in s:
        return rng.choice(s["enum"])
    t = s.get("type", "object" if "properties" in s else None)
    if isinstance(t, list):
        t = rng.choice(t)
    if t == "object":
        out = {}
        props = s.get("properties", {})
        req = s.get("required", [])
        for k, v in props.items():
            if k in req or rng.random() < 0.5:
                out[k] = gen(root, v, rng, depth + 1)
        for rx, v in s.get("patternProperties", {}).items():
            for k in rng.sample(PATTERN_KEYS[rx], rng.randint(0, len(PATTERN_KEYS[rx]))):
                out.setdefault(k, gen(root, v, rng, depth + 1))
        extra = s.get("additionalProperties", True)
        while extra is not False and (rng.random() < 0.3 or len(out) < s.get("minProperties", 0)):
            out["extra_" + str(rng.randint(0, 9))] = gen(root, extra if isinstance(extra, dict) else {}, rng, depth + 1)
            if "minProperties" not in s:
                break
        while len(out) > s.get("maxProperties", len(out)):
            del out[rng.choice([k for k in out if k not in req])]
        return out
    if s.get("uniqueItems"):  # distinct literals (enum, boolean), or strings and numbers, as many as asked for
        items = resolve(root, s["items"])
        values = items["enum"] if "enum" in items else ["a", "bc", "\u00e9", "1", 1, 2.5, -3] if "anyOf" in items else [True, False]
        lo, hi = s.get("minItems", 0), min(s.get("maxItems", len(values)), len(values))
        return rng.sample(values, rng.randint(lo, hi))
    if t == "array" or "prefixItems" in s:
        prefix = s.get("prefixItems", [])
        lo, hi = s.get("minItems", 0), s.get("maxItems", len(prefix) + 4)
        if s.get("items", True) is False:
            hi = min(hi, len(prefix))
        if depth > 3:
            hi = lo
        return [gen(root, prefix[i] if i < len(prefix) else s.get("items", {}), rng, depth + 1)
                for i in range(rng.randint(lo, max(lo, hi)))]
    if t == "string" and ("format" in s or "pattern" in s):
        return rng.choice(EXAMPLES[s.get("pattern", s.get("format"))])
    if t == "string":
        return rand_text(rng, s.get("minLength", 0), s.get("maxLength", 8))
    if "multipleOf" in s:
        m = s["multipleOf"]
        first = math.ceil(s.get("minimum", -10) / m)
        return rng.randint(first, first + 20) * m
    lo = s.get("minimum", s.get("exclusiveMinimum"))
    hi = s.get("maximum", s.get("exclusiveMaximum"))
    if t == "integer" and (lo is not None or hi is not None):
        a = -10**6 if lo is None else (math.floor(lo) + 1 if "exclusiveMinimum" in s else math.ceil(lo))
        b = 10**6 if hi is None else (math.ceil(hi) - 1 if "exclusiveMaximum" in s else math.floor(hi))
        return rng.choice([a, b, rng.randint(a, b)])
    if t == "number" and (lo is not None or hi is not None):
        a = -1000.0 if lo is None else float(lo)
        b = 1000.0 if hi is None else float(hi)
        x = round(rng.uniform(a, b), 3)
        picks = [x] + ([lo] if "minimum" in s else []) + ([hi] if "maximum" in s else [])
        v = rng.choice(picks)
        return v if a < v < b or ("minimum" in s and v == lo) or ("maximum" in s and v == hi) else round((a + b) / 2, 3)
    if t == "integer":
        return rng.choice([0, -3, 42, 123456789])
    if t == "number":
        return rng.choice([0, 1.5, -2.25e-3, 7, 1e21])
    if t == "boolean":
        return rng.choice([True, False])
    if t == "null":
        return None
    return None


def dumps(rng, v):
    style = rng.randint(0, 2)
    if style == 0:
        return json.dumps(v, separators=(",", ":"), ensure_ascii=False)
    if style == 1:
        return json.dumps(v, ensure_ascii=False)
    return json.dumps(v, indent=2, ensure_ascii=False)


def validator(schema):
    checker = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda c, x: isinstance(x, int) and not isinstance(x, bool))

    def pattern(v, rx, instance, schema):  # ECMAScript's matching (ASCII classes, $ at the very end)
        if isinstance(instance, str) and not python_match(rx, instance):
            yield jsonschema.ValidationError(f"{instance!r} does not match {rx!r}")
    cls = jsonschema.validators.extend(jsonschema.Draft202012Validator, type_checker=checker,
                                       validators={"pattern": pattern})
    formats = jsonschema.FormatChecker(formats=())
    for name, rx in FORMATS.items():
        formats.checks(name)(lambda s, rx=rx: not isinstance(s, str) or python_match(rx, s))
    return cls(schema, format_checker=formats)


def valid(v, b, no_exponent=False):
    def no_dups(pairs):
        keys = [k for k, _ in pairs]
        if len(keys) != len(set(keys)):
            raise ValueError("duplicate key")
        return dict(pairs)

    def reject(name):
        raise ValueError(name)
    def number(text):
        if no_exponent and ("e" in text or "E" in text):
            raise ValueError("exponent")
        return float(text)
    try:
        doc = json.loads(b.decode("utf-8"), object_pairs_hook=no_dups, parse_constant=reject, parse_float=number)
    except (ValueError, UnicodeDecodeError):
        return False
    return v.is_valid(doc)


def main():
    rng = random.Random(1130)
    out = []
    for index, schema in enumerate(SCHEMAS):
        v = validator(schema)
        ne = index in NO_EXPONENT
        cases = []
        for _ in range(40):
            doc = dumps(rng, gen(schema, schema, rng)).encode()
            assert valid(v, doc, ne), (schema, doc)
            cases.append({"hex": doc.hex(), "valid": True})
            for _ in range(2):
                m = bytearray(doc)
                at = rng.randrange(len(m) + 1)
                op = rng.randint(0, 2)
                pick = rng.choice(b'{}[]",:\\ 0.e-tfnxa\xc3')
                if op == 0 and at < len(m):
                    del m[at]
                elif op == 1:
                    m.insert(at, pick)
                elif at < len(m):
                    m[at] = pick
                cases.append({"hex": bytes(m).hex(), "valid": valid(v, bytes(m), ne)})
        out.append({"schema": schema, "cases": cases})
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "schema_cases.json"), "w") as f:
        json.dump(out, f, indent=0, ensure_ascii=False)
        f.write("\n")
    n = sum(len(s["cases"]) for s in out)
    print(f"{len(out)} schemas, {n} cases, {sum(c['valid'] for s in out for c in s['cases'])} valid")


if __name__ == "__main__":
    main()
