#!/usr/bin/env python3
"""Produces tests/data/chat-templates/jinja/rendered.json: every template in that folder (real
chat templates of open models, see its manifest.json; and the six of ../templates.json) rendered
on a conversation corpus (system, multi-turn, tools, tool calls and results, reasoning, non-ASCII,
whitespace; generation prompt on and off; enable_thinking off where a template reads it) by
Python's jinja2 set up exactly as transformers' apply_chat_template sets it up (an
ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks, loop controls, its tojson,
raise_exception and strftime_now; the messages, tools and documents it passes). Each case keeps
its conversation (messages and tools, in `conversations`), its other variables, and the text, or
the error jinja2 raised (`raised`: by the template's raise_exception): the reference kvpr's own interpreter
(jinja/jinja.h) is compared with byte for byte (tests/jinja/test_jinja.cc). strftime_now is
fixed at 2026-01-15 10:30 so that the fixtures do not change with the day. Run offline:
    python3 tests/scripts/make_jinja_fixtures.py          (jinja2 3.1)
"""

import datetime
import glob
import json
import os

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, '..', 'data', 'chat-templates')
OUT = os.path.join(DATA, 'jinja')
NOW = datetime.datetime(2026, 1, 15, 10, 30)


def environment():
    # As transformers' _compile_jinja_template (utils/chat_template_utils.py).
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return NOW.strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters['tojson'] = tojson
    env.globals['raise_exception'] = raise_exception
    env.globals['strftime_now'] = strftime_now
    return env


WEATHER = {'type': 'function', 'function': {
    'name': 'get_weather', 'description': 'Get the current weather in a city.',
    'parameters': {'type': 'object', 'properties': {
        'city': {'type': 'string', 'description': 'The city, e.g. Paris'},
        'unit': {'type': 'string', 'enum': ['celsius', 'fahrenheit']}}, 'required': ['city']}}}
TIME = {'type': 'function', 'function': {
    'name': 'get_time', 'description': 'The time in a time zone.',
    'parameters': {'type': 'object', 'properties': {'zone': {'type': 'string'}}, 'required': ['zone']}}}


def call(i, name, args):
    return {'id': 'call_%d' % i, 'type': 'function', 'function': {'name': name, 'arguments': args}}


CONVERSATIONS = {
    'one user turn': {'messages': [{'role': 'user', 'content': 'Hi'}]},
    'system and turns': {'messages': [
        {'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': ' Hi\n'},
        {'role': 'assistant', 'content': 'Hello'}, {'role': 'user', 'content': 'More'}]},
    'non-ASCII': {'messages': [
        {'role': 'system', 'content': ' Spaced system \n'},
        {'role': 'user', 'content': 'caf\u00e9 \u6771\u4eac \U0001f600 "quoted" \\ back'}]},
    'reasoning content': {'messages': [
        {'role': 'user', 'content': 'Q1'},
        {'role': 'assistant', 'content': 'A1', 'reasoning_content': 'first thoughts'},
        {'role': 'user', 'content': 'Q2'}]},
    'think in content': {'messages': [
        {'role': 'user', 'content': 'Q1'}, {'role': 'assistant', 'content': '<think>\nr1\n</think>\n\nA1'},
        {'role': 'user', 'content': 'Q2'}]},
    'last turn assistant': {'messages': [
        {'role': 'user', 'content': 'Q1'}, {'role': 'assistant', 'content': 'plain answer'}]},
    'tools offered': {'messages': [{'role': 'user', 'content': "What's the weather in Paris?"}],
                      'tools': [WEATHER, TIME]},
    'tool call and result': {'messages': [
        {'role': 'system', 'content': 'You help with weather.'},
        {'role': 'user', 'content': "What's the weather in Paris?"},
        {'role': 'assistant', 'content': '', 'tool_calls': [call(1, 'get_weather', {'city': 'Paris', 'unit': 'celsius'})]},
        {'role': 'tool', 'tool_call_id': 'call_1', 'name': 'get_weather', 'content': '{"temperature": 21.5}'}],
        'tools': [WEATHER]},
    'parallel tool calls': {'messages': [
        {'role': 'user', 'content': 'Weather and time in Tokyo?'},
        {'role': 'assistant', 'content': None, 'tool_calls': [
            call(1, 'get_weather', {'city': 'Tokyo'}), call(2, 'get_time', {'zone': 'Asia/Tokyo'})]},
        {'role': 'tool', 'tool_call_id': 'call_1', 'name': 'get_weather', 'content': 'sunny'},
        {'role': 'tool', 'tool_call_id': 'call_2', 'name': 'get_time', 'content': '09:00'},
        {'role': 'assistant', 'content': 'Sunny, 9 am.'},
        {'role': 'user', 'content': 'Thanks'}],
        'tools': [WEATHER, TIME]},
}

SPECIAL = {'bos_token': '<s>', 'eos_token': '</s>', 'unk_token': '<unk>', 'pad_token': '<pad>'}


def templates():
    out = {}
    for path in sorted(glob.glob(os.path.join(OUT, '*.jinja'))):
        out[os.path.basename(path)[:-len('.jinja')]] = (open(path, newline='', encoding='utf-8').read(), SPECIAL)
    for name, t in json.load(open(os.path.join(DATA, 'templates.json'))).items():
        special = dict(SPECIAL, bos_token=t.get('bos_token') or '')
        out['known/' + name] = (t['chat_template'], special)
    return out


def main():
    env = environment()
    cases = []
    for name, (source, special) in templates().items():
        template = env.from_string(source)
        for conv_name, conv in CONVERSATIONS.items():
            for gen in (True, False):
                for kwargs in ({},) + (({'enable_thinking': False},) if 'enable_thinking' in source else ()):
                    variables = dict(special, documents=None, add_generation_prompt=gen, **kwargs)
                    case = {'template': name, 'conversation': conv_name, 'variables': variables}
                    try:
                        case['text'] = template.render(messages=conv['messages'], tools=conv.get('tools'), **variables)
                    except jinja2.exceptions.TemplateError as e:  # raise_exception's (or jinja2's own)
                        case['error'] = str(e)
                        case['raised'] = type(e) is jinja2.exceptions.TemplateError
                    except Exception as e:  # noqa: BLE001 — Python's own (None + str): an error all the same
                        case['error'] = str(e)
                        case['raised'] = False
                    cases.append(case)
    with open(os.path.join(OUT, 'rendered.json'), 'w', encoding='utf-8') as f:
        json.dump({'jinja2': jinja2.__version__, 'now': NOW.isoformat(), 'conversations': CONVERSATIONS,
                   'cases': cases}, f, ensure_ascii=False, indent=0)
    errors = sum('error' in c for c in cases)
    print('%d templates, %d cases (%d errors)' % (len(templates()), len(cases), errors))


if __name__ == '__main__':
    main()
