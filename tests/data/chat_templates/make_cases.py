#!/usr/bin/env python3
"""Writes cases.json: chat templates and small Jinja programs rendered by Jinja2 itself, in the
environment transformers' apply_chat_template uses (ImmutableSandboxedEnvironment, trim_blocks,
lstrip_blocks, loop controls, its tojson, raise_exception and strftime_now). Lamina's renderer is
tested against these outputs (tests/unit/common/chat_template/renderer_test.cc).

    python3 tests/data/chat_templates/make_cases.py   # needs python3-jinja2
"""
import json
import os
from datetime import datetime

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


ENV = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
ENV.filters["tojson"] = tojson
ENV.globals["raise_exception"] = raise_exception
ENV.globals["strftime_now"] = lambda f: datetime.now().strftime(f)

LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}")

CHATML = """{%- for message in messages %}
    {%- if loop.first and messages[0]['role'] != 'system' %}
        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
    {{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

ZEPHYR = """{% for message in messages %}
  {% if message.role == 'user' %}
<|user|>
{{ message.content }}{{ eos_token }}
  {% elif message.role == 'system' %}
<|system|>
{{ message.content }}{{ eos_token }}
  {% else %}
<|assistant|>
{{ message.content }}{{ eos_token }}
  {% endif %}
  {% if loop.last and add_generation_prompt %}
<|assistant|>
  {% endif %}
{% endfor %}
"""

# In the style of Llama 3.1's: a system turn with a date, tools as JSON, namespace, tojson(indent).
LLAMA31_STYLE = """{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none and tools is defined %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is defined and tools is not none %}
    {{- "You have access to the following functions.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- set ns = namespace(turns=0, last_role=none) %}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool') %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
        {%- set ns.turns = ns.turns + 1 %}
    {%- else %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
    {%- set ns.last_role = message.role %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
{#- turns: ns.turns, for the test below #}
"""

MISTRAL_STYLE = """{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
"""

TOKENS = {"bos_token": "<s>", "eos_token": "</s>"}
L3_TOKENS = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
CHAT = [
    {"role": "system", "content": "You are terse.  "},
    {"role": "user", "content": "  Hello, who are you?\n"},
    {"role": "assistant", "content": "A model. Ünïcödé — 日本語 ✓"},
    {"role": "user", "content": "Say \"hi\" in 'quotes' \\ backslash"},
]
NO_SYSTEM = CHAT[1:]
BAD_ORDER = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
TOOL_CHAT = [{"role": "user", "content": "Weather in Paris?"},
             {"role": "tool", "content": {"temperature": 21.5, "unit": "C", "ok": True, "note": None}}]


def chat_case(name, template, messages, tokens, gen=True, **extra):
    return {"name": name, "template": template,
            "variables": dict(messages=messages, add_generation_prompt=gen, **tokens, **extra)}


CASES = [
    chat_case("llama3", LLAMA3, CHAT, L3_TOKENS),
    chat_case("llama3_no_generation_prompt", LLAMA3, NO_SYSTEM, L3_TOKENS, gen=False),
    chat_case("llama2_system", LLAMA2, CHAT, TOKENS),
    chat_case("llama2_no_system", LLAMA2, NO_SYSTEM, TOKENS),
    chat_case("llama2_bad_order", LLAMA2, BAD_ORDER, TOKENS),
    chat_case("chatml", CHATML, NO_SYSTEM, {}),
    chat_case("chatml_system", CHATML, CHAT, {}),
    chat_case("zephyr", ZEPHYR, CHAT, TOKENS),
    chat_case("llama31_style", LLAMA31_STYLE, CHAT, L3_TOKENS),
    chat_case("llama31_style_tools", LLAMA31_STYLE, TOOL_CHAT, L3_TOKENS, tools=TOOLS, date_string="1 Jan 2026"),
    chat_case("mistral_style", MISTRAL_STYLE, CHAT, TOKENS),
    chat_case("mistral_style_bad_role", MISTRAL_STYLE, [{"role": "user", "content": "x"},
                                                        {"role": "critic", "content": "y"}], TOKENS),
]

# Small programs, one feature or a few each.
SNIPPETS = {
    "arithmetic": "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ -7 % 3 }} "
                  "{{ 3 / 2 }} {{ 4 / 2 }} {{ 2 ** 10 }} {{ 2 ** 0.5 }} {{ 1.5 + 1 }} {{ 0.1 + 0.2 }} {{ -x }}",
    "floats": "{{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }} {{ 123.456 }} {{ 1/3 }} {{ 2.0 }} {{ -0.5 }}",
    "strings": "{{ 'a' ~ 1 ~ none ~ true }} {{ 'ab' * 3 }} {{ 'x' + \"y\" }} {{ 'tab\\tnew\\nline' }} "
               "{{ '\\u00e9\\x41' }} {{ 'it''s' }}",
    "string_methods": "{{ '  pad  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '  l'.lstrip() }}|{{ 'r  '.rstrip() }}|"
                      "{{ 'Hello'.upper() }}{{ 'Hello'.lower() }}|{{ 'hello world'.title() }}|{{ 'hELLO'.capitalize() }}|"
                      "{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a,b,c'.split(',', 1) }}|"
                      "{{ 'banana'.replace('a', 'o') }}|{{ 'banana'.replace('a', 'o', 2) }}|"
                      "{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'bc')) }}|{{ 'banana'.find('n') }}"
                      "{{ 'banana'.count('a') }}|{{ '-'.join(['a', 'b']) }}",
    "string_index_unicode": "{{ s[0] }}|{{ s[-1] }}|{{ s[1:3] }}|{{ s[::-1] }}|{{ s|length }}|{{ s[::2] }}",
    "comparisons": "{{ 1 < 2 }}{{ 2 <= 2 }}{{ 'a' < 'b' }}{{ 1 == 1.0 }}{{ true == 1 }}{{ [1, 2] == [1, 2] }}"
                   "{{ {'a': 1} == {'a': 1} }}{{ none == none }}{{ 'a' in 'cat' }}{{ 2 in [1, 2] }}"
                   "{{ 'k' in {'k': 1} }}{{ 3 not in [1] }}{{ [1, 2] < [1, 3] }}",
    "logic": "{{ 1 and 'x' }}|{{ 0 and 'x' }}|{{ '' or 'fallback' }}|{{ 'first' or 'second' }}|{{ not [] }}|"
             "{{ 'yes' if 1 else 'no' }}|{{ 'yes' if 0 else 'no' }}|{{ 'only' if false }}|",
    "repr": "{{ [1, 'a', none, true, 1.5, {'k': [2]}] }} {{ {'b': 1, 'a': \"it's\"} }} {{ none }} {{ false }}",
    "tojson": "{{ data|tojson }}\n{{ data|tojson(indent=2) }}\n{{ 'é\"\\\\\\n'|tojson }} {{ []|tojson }} {{ {}|tojson }}",
    "filters": "{{ '  x '|trim }}|{{ 'abc'|upper }}|{{ 'ABC'|lower }}|{{ 'hello there'|title }}|"
               "{{ 'hello'|capitalize }}|{{ [3, 1, 2]|sort }}|{{ [3, 1, 2]|sort(reverse=true) }}|"
               "{{ ['b', 'A', 'c']|sort }}|{{ [1, 2, 3]|first }}{{ [1, 2, 3]|last }}|{{ [1, 2]|join(', ') }}|"
               "{{ 'abc'|list }}|{{ [1, 2, 2, 1]|unique|list }}|{{ 'abc'|reverse }}|{{ [1, 2]|reverse|list }}|"
               "{{ -3|abs }}|{{ '42'|int + 1 }}|{{ 'x'|int }}|{{ 3|float }}|{{ 2.567|round(1) }}|{{ 2.5|round }}|"
               "{{ [1, 2, 3]|sum }}|{{ [4, 9, 2]|max }}{{ [4, 9, 2]|min }}|{{ 'a'|replace('a', 'b') }}|"
               "{{ undefined_name|default('dflt') }}|{{ ''|default('empty', true) }}|{{ none|string }}|"
               "{{ [1, 2]|length }}{{ {'a': 1}|count }}|{{ '<a href=\"x\">'|e }}",
    "indent": "{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(4, true) }}|{{ 'a\\n\\nb'|indent(2, blank=true) }}",
    "dicts": "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{{ d.keys()|list }}|{{ d.values()|list }}|"
             "{{ d.get('a') }}{{ d.get('zz') }}{{ d.get('zz', 0) }}|{{ d|dictsort }}|{{ d|items|list }}|"
             "{% for k in d %}{{ k }}{% endfor %}|{{ d.a }}{{ d['b'] }}|{{ d.missing }}|{{ d.missing is defined }}",
    "select_map": "{{ msgs|selectattr('role', 'equalto', 'user')|map(attribute='content')|join('+') }}|"
                  "{{ msgs|rejectattr('role', 'eq', 'user')|list|length }}|{{ msgs|map(attribute='role')|list }}|"
                  "{{ [1, 2, 3, 4]|select('even')|list }}|{{ [1, 2, 3, 4]|reject('odd')|list }}|"
                  "{{ ['a', 'b']|map('upper')|list }}|{{ msgs|selectattr('flag')|list|length }}|"
                  "{{ msgs|map(attribute='nothing', default='-')|join }}|{{ [0, 1, '', 'x']|select|list }}",
    "tests": "{{ x is defined }}{{ y is defined }}{{ y is undefined }}{{ none is none }}{{ 1 is none }}"
             "{{ 'a' is string }}{{ 1 is number }}{{ 1.5 is number }}{{ 1 is integer }}{{ 1.5 is float }}"
             "{{ {} is mapping }}{{ [] is iterable }}{{ 'a' is iterable }}{{ 3 is odd }}{{ 4 is even }}"
             "{{ 9 is divisibleby 3 }}{{ 'a' is eq 'a' }}{{ 1 is ne 2 }}{{ true is true }}{{ 1 is true }}"
             "{{ false is false }}{{ true is boolean }}{{ 'ab' is lower }}{{ 'AB' is upper }}{{ 2 is in [1, 2] }}"
             "{{ 1 is not none }}{{ 3 is gt 2 }}{{ 3 is lt 2 }}{{ [] is sequence }}{{ range is callable }}",
    "loops": "{% for x in xs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/"
             "{{ loop.first }}/{{ loop.last }}/{{ loop.length }}/{{ loop.previtem }}/{{ loop.nextitem }};{% endfor %}|"
             "{% for x in xs if x > 1 %}{{ x }}{{ loop.length }}{% endfor %}|{% for x in [] %}a{% else %}empty{% endfor %}|"
             "{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 3 %}{% break %}{% endif %}{{ x }}"
             "{% endfor %}|{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}|{% for c in 'hé' %}[{{ c }}]"
             "{% endfor %}|{% for i in range(3) %}{{ i }}{% endfor %}{% for i in range(5, 1, -2) %}{{ i }}{% endfor %}",
    "scoping": "{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}|"
               "{% set ns = namespace(total=0, seen=[]) %}{% for i in [1, 2, 3] %}{% set ns.total = ns.total + i %}"
               "{% endfor %}{{ ns.total }}|{% if true %}{% set y = 5 %}{% endif %}{{ y }}|"
               "{% set a, b = 1, 2 %}{{ a }}{{ b }}|{% set block %}inner {{ x }}{% endset %}[{{ block }}]",
    "macros": "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} "
              "{{ greet('B', '?') }} {{ greet(name='C', punct='.') }} {{ greet('D')|upper }}"
              "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}"
              " {{ fact(5) }}",
    "whitespace": "a\n  {% if true %}\n    b\n  {% endif %}\n  {{ 'c' }}  \n{#- comment -#}\n d {{- ' e ' -}} f\n"
                  "  {%+ if true %}g{% endif +%}\nh\n{% if true -%}\n   i\n{%- endif %}\nj {# note #}\nk\n",
    "whitespace_more": "<{%- for x in [1, 2] -%}\n  {{ x }}\n{%- endfor -%}>\n  {% if 1 %}  x  {% endif %}  \n",
    "comments_and_literals": "{# a {{ b }} comment #}{{ [1, 2,] }}{{ (1, 2)[1] }}{{ {'a': 1,}['a'] }}{{ 'a' 'b' }}"
                             "{{ True }}{{ None }}{{ False }}{{ [1, [2, [3]]][1][1][0] }}{{ {'k': {'j': 'v'}}.k.j }}",
}

ERRORS = {
    "raise": "before{{ raise_exception('Only user and assistant roles are supported!') }}",
    "undefined_attribute": "{{ nothing.field }}",
    "missing_then_attribute": "{{ d.missing.deeper }}",
    "unknown_filter": "{{ 'a'|no_such_filter }}",
    "unclosed_if": "{% if true %}never closed",
    "bad_token": "{{ 1 $ 2 }}",
    "unclosed_tag": "{{ 1 + ",
    "add_string_and_number": "{{ 'a' + 1 }}",
    "set_field_of_dict": "{% set d.x = 1 %}",
    "division_by_zero": "{{ 1 // 0 }}",
}


def render(template, variables):
    try:
        return {"expected": ENV.from_string(template).render(**variables)}
    except Exception as e:  # pylint: disable=broad-except  (TypeError, ZeroDivisionError too)
        return {"error": str(e)}


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    variables = {
        "x": 5, "xs": [1, 2, 3], "s": "hé日本!", "d": {"b": 2, "a": 1},
        "data": {"name": "get", "args": [1, 2.5, None, True, "s\u00e9"], "nested": {"k": []}},
        "msgs": [{"role": "user", "content": "u1", "flag": True}, {"role": "assistant", "content": "a1"},
                 {"role": "user", "content": "u2"}],
    }
    cases = []
    for case in CASES:
        case.update(render(case["template"], case["variables"]))
        cases.append(case)
    for name, template in SNIPPETS.items():
        case = {"name": name, "template": template, "variables": variables}
        case.update(render(template, variables))
        cases.append(case)
    for name, template in ERRORS.items():
        case = {"name": "error_" + name, "template": template, "variables": variables}
        case.update(render(template, variables))
        if "error" not in case:
            case["error"] = "(Jinja2 raised no error)"
        cases.append(case)
    with open(os.path.join(here, "cases.json"), "w", encoding="utf-8") as f:
        json.dump({"generated_by": "tests/data/chat_templates/make_cases.py", "jinja2": jinja2.__version__,
                   "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    errors = [c["name"] for c in cases if "error" in c]
    print(f"{len(cases)} cases, {len(errors)} expected errors: {', '.join(errors)}")


if __name__ == "__main__":
    main()
