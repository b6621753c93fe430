#!/usr/bin/env python3
"""Produces tests/data/chat-templates/tool_cases.json: conversations with tools, tool calls and
tool results rendered by the real chat templates of Qwen2.5, Qwen3, Llama-3.2 and Mistral-Nemo
(templates.json,
as their tokenizer_config.json files carry them; Llama-3.2's also stands for Llama-3.1's, which
differs from it only in the date it writes and in builtin tools, rendered once with 3.1's date
"26 Jul 2024" and once with "__TODAY__" for today's) with Jinja2 set up as Hugging Face transformers'
apply_chat_template sets it up (a sandboxed environment with trim_blocks and lstrip_blocks, the
loopcontrols extension, and a tojson filter that is Python's json.dumps with ensure_ascii=False),
given what vLLM gives it: the request's tools as objects, a null content as "", and each tool
call's arguments parsed
from their JSON string into an object. It also holds model outputs parsed as vLLM's `hermes`
tool parser does (a regex over <tool_call>...</tool_call> blocks, json.loads of each, the
arguments written back by json.dumps with ensure_ascii=False; any block that does not parse
makes the whole output content), and as its `llama3_json` parser does (every "{" not inside or
right after an object already read starts one, read by JSONDecoder.raw_decode, each
{"name", "arguments" or "parameters"}; anything else makes the whole output content; the
content kvpr gives with calls is the text before the first object, less <|python_tag|>, where
vLLM gives none). Run offline on Debian's python3-jinja2:
  python3 tests/scripts/make_tool_chat_fixtures.py
"""
import json
import os
import re

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "data", "chat-templates")


def environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city \u2014 \"quoted\", caf\u00e9, \u6771\u4eac",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name\nwith a newline and a \\ backslash"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"}},
        "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "parameters": {"type": "object", "properties": {
        "query": {"type": "string", "maxLength": 200},
        "top_k": {"type": "integer", "minimum": 1, "maximum": 50},
        "threshold": {"type": "number", "minimum": 0.0, "maximum": 1.0, "default": 0.5, "step": 1e-05},
        "big": {"type": "number", "maximum": 1e16, "minimum": -123456.789},
        "exact": {"type": "boolean", "default": False}, "extra": {"default": None},
        "ctrl": {"const": "tab\there \u0001 \u2028 \u007f /slash"}},
        "additionalProperties": False}}}
NOPARAMS = {"type": "function", "function": {"name": "now", "description": "The time"}}


def call(name, args, id_="call00001"):  # ids of 9 characters: Mistral's template takes no others
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": args}}


CONVERSATIONS = [
    ([WEATHER], [{"role": "user", "content": "Weather in Paris?"}]),
    ([WEATHER, SEARCH, NOPARAMS], [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]),
    ([WEATHER], [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call("get_weather", {"city": "Paris"})]},
        {"role": "tool", "tool_call_id": "call00001", "content": "{\"temp\": 21}"},
        {"role": "assistant", "content": "It is 21 degrees."},
        {"role": "user", "content": "And Tokyo and Oslo?"}]),
    ([WEATHER, SEARCH], [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Two cities"},
        {"role": "assistant", "content": "Let me look both up.", "tool_calls": [
            call("get_weather", {"city": "\u6771\u4eac", "unit": "celsius"}, "aaaaaaaaa"),
            call("search", {"query": "Oslo \"weather\"\n", "top_k": 3, "threshold": 0.25, "exact": True,
                            "nested": {"list": [1, 2.5, None, "x"], "empty": {}}}, "bbbbbbbbb")]},
        {"role": "tool", "tool_call_id": "aaaaaaaaa", "content": "sunny"},
        {"role": "tool", "tool_call_id": "bbbbbbbbb", "content": "rain"}]),
    (None, [
        {"role": "user", "content": "Earlier call, no tools now"},
        {"role": "assistant", "content": "", "tool_calls": [call("now", {})]},
        {"role": "tool", "tool_call_id": "call00001", "content": "12:00"},
        {"role": "user", "content": "Thanks"}]),
    ([NOPARAMS], [
        {"role": "user", "content": "What time is it?"},
        {"role": "assistant", "content": "<think>\nI should call now.\n</think>\n\n", "tool_calls": [call("now", {})]},
        {"role": "tool", "tool_call_id": "call00001", "content": "12:00"},
        {"role": "assistant", "content": "<think>\nGot it.\n</think>\n\nIt is noon."}]),
    ([WEATHER], [
        {"role": "user", "content": "Paris?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "\nUse the tool.\n",
         "tool_calls": [call("get_weather", {"city": "Paris"})]},
        {"role": "tool", "tool_call_id": "call00001", "content": "cloudy"}]),
    ([WEATHER], [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "<think>old</think>A1", "reasoning_content": None},
        {"role": "user", "content": "<tool_response>\nmanual\n</tool_response>"},
        {"role": "assistant", "content": "A2", "reasoning_content": "kept"}]),
]

# Model outputs for the hermes parser.
OUTPUTS = [
    "Just text, no call.",
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>",
    "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": "
    "{\"x\": [1, 2.50, 1e-5, 1E20, -0.0, 123456789012345678, true, null], \"s\": \"caf\\u00e9 \\u6771 \\\"q\\\" \\\\ \\n \\u0001\"}}\n</tool_call>",
    "<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}</tool_call>",
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n",
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par",
    "<tool_call>\n{\"name\": \"x\", \"arguments\": {}}\n</tool_call><tool_call>not json</tool_call>",
    "<tool_call>\n{\"arguments\": {}}\n</tool_call>",
    "<tool_call>\n[1, 2]\n</tool_call>",
    "Before <tool_call>\n{\"name\": \"f\", \"arguments\": {\"k\": 1.0}}\n</tool_call> and after",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": \"{\\\"k\\\": 1}\"}\n</tool_call>",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1, \"a\": 2}}\n</tool_call>",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"n\": 1.5e300, \"m\": 0.1, \"k\": 100.0, \"j\": 1e16, \"i\": 1e15, \"h\": 0.0001, \"g\": 0.00001234}}\n</tool_call>",
    "text with a stray </tool_call> and <tool_call",
]

MISTRAL_OUTPUTS = [
    "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]",
    "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \"arguments\": {\"x\": [1, 2.50, \"\\u00e9\"]}}]",
    "Let me look.[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"q\": 1}}]",
    "[TOOL_CALLS]{\"name\": \"one\", \"arguments\": {\"k\": true}}",
    "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"q\": 1}}][TOOL_CALLS]",
    "No tools needed.",
    "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"q\": ",
    "[TOOL_CALLS][{\"name\": \"f\"}]",
    "[TOOL_CALLS][{\"arguments\": {}}]",
    "[TOOL_CALLS][]",
    "[TOOL_CALLS][1, 2]",
    "Text [TOOL_CALLS]not json",
]


def mistral(output):
    """vLLM's mistral parser, with the text before the marker as the content."""
    mark = "[TOOL_CALLS]"
    if mark not in output:
        return {"content": output, "tool_calls": []}
    before = output[:output.find(mark)]
    rest = output[output.find(mark):].replace(mark, "")
    try:
        v = json.loads(rest)
        calls = v if isinstance(v, list) else [v]
        out = []
        for c in calls:
            if not isinstance(c, dict) or not isinstance(c["name"], str):
                raise TypeError("call")
            out.append({"name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False)})
        if not out:
            raise ValueError("no calls")
        return {"content": before if before else None, "tool_calls": out}
    except Exception:
        return {"content": before + rest, "tool_calls": []}


LLAMA_OUTPUTS = [
    "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
    "<|python_tag|>{\"name\": \"f\", \"arguments\": {\"x\": 1}}",
    "{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"k\": [1, 2.0, \"\\u6771\"]}}",
    "{\"name\":\"a\",\"parameters\":{}}{\"name\":\"b\",\"parameters\":{}}",
    "Sure! {\"name\": \"f\", \"parameters\": {\"q\": \"x\"}}",
    "The set {1, 2} is small.",
    "Plain text, no braces.",
    "{\"name\": \"f\"}",
    "{\"parameters\": {}}",
    "{\"name\": 5, \"parameters\": {}}",
    "{\"name\": \"f\", \"parameters\": {\"a\": \"{nested} }\"}} trailing text",
    "{\"name\": \"f\", \"parameters\": {}} and {\"name\": \"g\", \"parameters\": {\"x\": null}}",
    "{\"name\": \"f\", \"arguments\": {\"a\": 1}, \"parameters\": {\"b\": 2}}",
    "{\"name\": \"f\", \"parameters\": {\"a\": 1}",
    "{\"name\": \"f\", \"parameters\": {\"big\": 1e400, \"tiny\": 1e-400, \"n\": -12345678901234567}}",
    " {\"name\": \"f\", \"parameters\": {}}",
]


def llama3_json(output):
    if not ("<|python_tag|>" in output or "{" in output):
        return {"content": output, "tool_calls": []}
    dec, end_index, calls = json.JSONDecoder(), -1, []
    for m in re.finditer(r"\{", output):
        start = m.start()
        if start <= end_index:
            continue
        try:
            obj, n = dec.raw_decode(output[start:])
            end_index = start + n
            name = obj["name"]
            if not isinstance(name, str):
                raise TypeError("name")
            args = obj["arguments"] if "arguments" in obj else obj["parameters"]
            calls.append({"name": name, "arguments": json.dumps(args, ensure_ascii=False)})
        except Exception:
            return {"content": output, "tool_calls": []}
    if not calls:
        return {"content": output, "tool_calls": []}
    before = output[:output.find("{")].removeprefix("<|python_tag|>")
    return {"content": before if before else None, "tool_calls": calls}


TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


def hermes(output):
    if "<tool_call>" not in output:
        return {"content": output, "tool_calls": []}
    try:
        calls = [json.loads(m[0] if m[0] else m[1]) for m in TOOL_CALL_RE.findall(output)]
        tool_calls = [{"name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False)} for c in calls]
        content = output[:output.find("<tool_call>")]
        return {"content": content if content else None, "tool_calls": tool_calls}
    except Exception:
        return {"content": output, "tool_calls": []}


def main():
    templates = json.load(open(os.path.join(DATA, "templates.json")))
    env = environment()
    cases = []
    for source in ("qwen2.5", "qwen3", "llama-3.1", "llama-3.2", "mistral-nemo"):
        llama = source.startswith("llama")
        t = env.from_string(templates["llama-3.2" if llama else source]["chat_template"])
        for tools, messages in CONVERSATIONS:
            if source == "qwen2.5" and any(m.get("reasoning_content") for m in messages):
                continue  # Qwen2.5's template has no reasoning
            if llama and any(len(m.get("tool_calls", [])) > 1 for m in messages):
                continue  # Llama's templates take one call per message
            for thinking in ([True, False] if source == "qwen3" else [True]):
                extra = {} if thinking else {"enable_thinking": False}
                if llama:
                    extra = {"bos_token": "", "date_string": "26 Jul 2024" if source == "llama-3.1" else "__TODAY__"}
                if source == "mistral-nemo":
                    extra = {"bos_token": "", "eos_token": "</s>"}
                try:
                    prompt = t.render(messages=messages, tools=tools, add_generation_prompt=True, **extra)
                except jinja2.exceptions.TemplateError:
                    assert source == "mistral-nemo"  # its roles must alternate
                    continue
                cases.append({"source": source, "tools": tools, "messages": messages, "enable_thinking": thinking,
                              "prompt": prompt})
    parsed = [{"parser": "hermes", "output": o, **hermes(o)} for o in OUTPUTS]
    parsed += [{"parser": "llama3_json", "output": o, **llama3_json(o)} for o in LLAMA_OUTPUTS]
    parsed += [{"parser": "mistral", "output": o, **mistral(o)} for o in MISTRAL_OUTPUTS]
    with open(os.path.join(DATA, "tool_cases.json"), "w") as f:
        json.dump({"renders": cases, "parsed": parsed}, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"{len(cases)} renders, {len(parsed)} parsed outputs")


if __name__ == "__main__":
    main()
