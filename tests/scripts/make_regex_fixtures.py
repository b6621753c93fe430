#!/usr/bin/env python3
"""Produces tests/data/regex/cases.json for engine/constrain/regex.h: patterns of the supported ECMAScript
subset (and the regexes kvpr's JSON Schema formats stand for) with strings, and whether each
matches by Python's `re` as JSON Schema's `pattern` means it (a search; ^ and $ anchor the whole
text). Python's and ECMAScript's regexes agree on these strings: ASCII-only classes (re.ASCII),
no line terminators, and $ tested as the end of the text (re's \\Z). Run offline:
  python3 tests/scripts/make_regex_fixtures.py
"""
import json
import os
import random
import re

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "regex")

DATE = r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
TIME = r"([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
# What kvpr's formats stand for (engine/constrain/regex.cc's format_pattern): the specification here.
FORMATS = {
    "date": "^" + DATE + "$",
    "time": "^" + TIME + "$",
    "date-time": "^" + DATE + "[Tt]" + TIME + "$",
    "uuid": "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
    "email": r"^[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+$",
    "ipv4": "^(" + OCTET + r"\.){3}" + OCTET + "$",
}

PATTERNS = [
    (r"^[a-z]+$", ["abc", "z"]),
    (r"^\d{3}-\d{4}$", ["555-1234"]),
    (r"ab+c", ["xxabbbcyy", "abc"]),
    (r"^(foo|bar)baz?$", ["foobaz", "barba"]),
    (r"^[^0-9\s]{2,4}$", ["ab", "é中x"]),
    (r"^(?:[A-Z][a-z]*)(?: [A-Z][a-z]*)*$", ["Ada Lovelace", "X"]),
    (r"^\w+@\w+\.(com|org)$", ["a_b@c1.org"]),
    (r"colou?r", ["the colour red", "color"]),
    (r"^a.c$", ["abc", "a中c"]),
    (r"^[-+]?[0-9]*\.?[0-9]+$", ["-1.5", "42", ".5"]),
    (r"^(?<year>\d{4})/(?<m>\d\d)$", ["2024/07"]),
    (r"^x{2,}y{0,2}$", ["xx", "xxxxyy"]),
    (r"^\x41\u00e9[\u4e00-\u9fff]$", ["Aé中"]),
    (r"^[\]\-a]+$", ["]-a", "a"]),
    (r"^\$\d+(\.\d\d)?$", ["$10", "$3.50"]),
    (r"^[.]$", ["."]),
    (r"^(a|b|)c$", ["ac", "c"]),
    (r"^(ab)*$", ["", "abab"]),
    (r"^[😀-🙏]+!$", ["😀😃!"]),
] + [(rx, []) for rx in FORMATS.values()] + [
    # Anchors on top-level alternatives: ^ binds the first, $ the last (ECMAScript's reading).
    (r"^dev|alpha|rc$", ["dev1", "xalphax", "1rc"]),
    (r"^a$|^bc$|d", ["a", "bc", "xdx"]),
    (r"^(http)|(https)://(.*)$", ["httpx", "xhttps://y"]),
]

FORMAT_EXAMPLES = ["2024-02-29", "23:59:60.5+05:30", "2024-07-01T12:30:00Z", "1999-12-31t00:00:00.123-08:00",
                   "123e4567-e89b-12d3-a456-426614174000", "ada@example.co.uk", "192.168.0.255", "0.0.0.0"]
ALPHABET = "abcxyzABCZ0129 -_.:/@$+é中😀]\\[(){}"


def python_match(pattern, text):
    anchored_end = pattern.endswith("$") and not pattern.endswith(r"\$")
    p = pattern[:-1] + r"\Z" if anchored_end else pattern
    p = re.sub(r"(?<!\\)\$\|", r"\\Z|", p)  # a top-level alternative's $: the very end too
    p = re.sub(r"\(\?<(?=[A-Za-z])", "(?P<", p)  # ECMAScript's named groups in Python's spelling
    return re.search(p, text, re.ASCII) is not None


def mutate(rng, s):
    s = list(s)
    op = rng.randint(0, 2)
    at = rng.randrange(len(s) + 1)
    ch = rng.choice(ALPHABET)
    if op == 0 and at < len(s):
        del s[at]
    elif op == 1:
        s.insert(at, ch)
    elif at < len(s):
        s[at] = ch
    return "".join(s)


def main():
    rng = random.Random(1201)
    out = []
    for pattern, examples in PATTERNS:
        seeds = examples + FORMAT_EXAMPLES + [""]
        texts = set(seeds)
        own = examples or [e for e in FORMAT_EXAMPLES if python_match(pattern, e)]
        for _ in range(60):  # mostly one edit away from a match, so both answers are common
            s = rng.choice(own) if own and rng.random() < 0.7 else rng.choice(seeds)
            for _ in range(rng.randint(1, 2)):
                s = mutate(rng, s)
            texts.add(s)
        for _ in range(10):
            texts.add("".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 8))))
        cases = [{"text": t, "match": python_match(pattern, t)} for t in sorted(texts)]
        out.append({"pattern": pattern, "cases": cases})
    out.append({"formats": FORMATS})
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "cases.json"), "w") as f:
        json.dump(out, f, indent=0, ensure_ascii=False)
        f.write("\n")
    n = sum(len(p["cases"]) for p in out if "cases" in p)
    print(f"{len(out) - 1} patterns, {n} strings, {sum(c['match'] for p in out if 'cases' in p for c in p['cases'])} match")


if __name__ == "__main__":
    main()
