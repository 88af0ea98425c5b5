// Small templates for the semantics of expressions, filters, tests, methods,
// scoping and whitespace control, rendered with snippetVars. Where whale
// deliberately follows Python's Jinja instead of @huggingface/jinja (see
// docs/chat-templates.md) the construct is left out here and tested in
// tests/test_jinja.c against Python's result.
export const snippetVars = {
  messages: [
    { role: "system", content: " sys " },
    { role: "user", content: "  hi\n" },
    { role: "assistant", content: "yo", tool_calls: [{ function: { name: "f", arguments: { a: 1, b: [true, null] } } }] },
  ],
  tools: [{ type: "function", function: { name: "f", parameters: { type: "object" } } }],
  add_generation_prompt: false,
  n: 3,
  f: 2.5,
  s: "Hello, World",
  empty: "",
  nested: { a: { b: [1, { c: "deep" }] } },
};

export const snippets = [
  // arithmetic and number printing
  "{{ 1 + 2 }}|{{ 7 // 2 }}|{{ 7 / 2 }}|{{ 7 % 3 }}|{{ 2 ** 10 }}|{{ 1.5 + 1 }}|{{ 3.0 }}|{{ 0.1 + 0.2 }}|{{ n * f }}|{{ -n }}|{{ n - -1 }}",
  "{{ 1000000000000 * 1000 }}|{{ 0.000001 }}|{{ 0.0000001 * 1 }}|{{ 123456789.125 }}|{{ 1/3 }}|{{ 10/4 }}|{{ 100000000000000000000.0 }}|{{ 1.5 * 2 }}|{{ 'x' + 2.0 * 1 }}",
  "{{ 'a' ~ 1 ~ true ~ 1.0 ~ none if false else 'a' ~ 1 ~ true ~ 1.0 }}|{{ 'x' + 1.5 }}|{{ 'n=' + n }}",
  // printing values
  "{{ [1, 'a', none, true, 2.0] }}|{{ {'k': [1, {'z': 2}]} }}|{{ none }}|{{ undefined_name }}|{{ true }}{{ false }}|{{ messages[2].tool_calls }}",
  // loops
  "{% for x in [3,1,2] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }},{% endfor %}",
  "{% for x in [1,2,3,4,5] if x is odd %}{{ x }}{% if loop.last %}!{% endif %}{% else %}none{% endfor %}|{% for x in [] %}y{% else %}empty{% endfor %}",
  "{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}|{% for k in {'a': 1, 'b': 2} %}{{ k }}{% endfor %}|{% for k, v in nested | items %}{{ k }}{% endfor %}",
  "{% for x in [1,2,3,4] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}",
  "{% for m in messages %}{{ m.role }}:{{ m['content'] }};{% endfor %}|{{ messages[0].role }}|{{ messages | length }}|{{ messages[-1]['role'] }}|{% for m in messages[::-1] %}{{ loop.index0 }}{{ m.role[0] }}{% endfor %}",
  // scoping: set in a loop stays in it; namespaces carry out
  "{% set ns = namespace(a=1, b='x') %}{% set outer = 'o' %}{% for i in range(3) %}{% set ns.a = ns.a + i %}{% set outer = i %}{% endfor %}{{ ns.a }}{{ ns.b }}{{ outer }}|{{ ns }}",
  "{% set a, b = [1, 2] %}{{ a }}{{ b }}|{% set block %}inner {{ a }}{% endset %}{{ block }}|{% if true %}{% set in_if = 5 %}{% endif %}{{ in_if }}",
  "{{ ns.x }}{% set ns = namespace() %}{% set ns.x = [1] %}{{ ns.x }}{{ ns.missing }}|{{ x.y.z }}|{{ nested.a.b[1].c }}{{ nested['a']['b'][0] }}",
  // macros
  "{%- macro greet(name, punct='!') -%}Hello {{ name }}{{ punct }}{%- endmacro -%}{{ greet('Bob') }} {{ greet('Al', punct='?') }} {{ greet(name='Z') }}",
  "{% macro m(a, b) %}[{{ a }}|{{ b }}]{% endmacro %}{{ m(1) }}{{ m(1, 2) }}{{ m(b=3) }}{% macro outer_m() %}{{ m('in') }}{% endmacro %}{{ outer_m() }}",
  // string filters and methods
  "{{ '  Hello World  ' | trim }}|{{ 'hello world' | title }}|{{ 'hello' | capitalize }}|{{ 'HeLLo' | lower }}{{ 'HeLLo' | upper }}|{{ 'abc' | length }}|{{ s | length }}",
  "{{ 'a,b,,c'.split(',') }}|{{ '  a b  c '.split() }}|{{ 'a,b,c'.split(',', 1) }}|{{ 'hello'.replace('l', 'L') }}|{{ 'hello'.replace('l', 'L', 1) }}|{{ s.upper() }}{{ s.lower() }}",
  "{{ 'hello'.startswith('he') }}{{ 'hello'.endswith(('x', 'lo')) }}{{ s.startswith('World') }}|{{ '  hi  '.strip() }}|{{ ' x '.lstrip() }}|{{ ' x '.rstrip() }}|",
  "{{ 'abc'[1] }}{{ 'abc'[-1] }}{{ 'abc'[::-1] }}{{ 'abcdef'[1:3] }}{{ 'abcdef'[-2:] }}{{ [1,2,3,4][1:] }}{{ [1,2,3,4][::2] }}{{ [1,2,3,4][:-1] }}{{ [1,2,3][5:] }}",
  "{{ 'Hello' | replace('l', 'L') }}|{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'x' | indent }}",
  // case mapping beyond ASCII (JavaScript's, Greek final sigma included)
  "{{ 'àéîõü ÀÉ ß ÿ ĀāŁłŒœŸ µ Ωωάέ ΣΑΣ ΟΔΟΣ. Жж Ёё 日本 😀 x' | upper }}|{{ 'ÀÉÎ ĀŁŒŸ ΑΣ ΣΑΣ ΟΔΟΣ. Σ ΌΎΏ ЖЁЮ 😀 XY' | lower }}|{{ 'élan über' | capitalize }}|{{ 'ärger élan-x' | title }}|{{ 'ωmega'.upper() }}",
  // list filters
  "{{ [1,2,3] | join(', ') }}|{{ ['a','b'] | join }}|{{ [3,1,2] | sort }}|{{ ['b','A','c'] | sort }}|{{ [3,1,2] | reverse | list }}|{{ [1,2,2,3,1] | unique | list }}|{{ [1,2] | first }}{{ [1,2] | last }}",
  "{{ [{'n': 'a', 't': 1}, {'n': 'b'}] | selectattr('t') | map(attribute='n') | list }}|{{ [{'n': 'a', 't': 1}, {'n': 'b'}] | rejectattr('t') | map(attribute='n') | join }}|{{ messages | selectattr('role', 'equalto', 'user') | list | length }}",
  "{{ messages | map(attribute='role') | join(',') }}|{{ [{'p': {'q': 1}}] | map(attribute='p.q') | list }}|{{ [{'a': 1}, {}] | map(attribute='a', default=0) | list }}",
  // JSON
  "{{ {'b': 1, 'a': 2} | tojson }}|{{ {'b': 1, 'a': [1, 2]} | tojson(indent=2) }}|{{ 'é\"\\n\\t\\\\' | tojson }}|{{ 'é😀' | tojson(ensure_ascii=true) }}|{{ [1, {'a': none}] | tojson(separators=(',', ':')) }}",
  "{{ tools | tojson }}|{{ tools[0] | tojson(indent=4) }}|{{ messages[2].tool_calls[0].function.arguments | tojson }}|{{ [] | tojson(indent=2) }}|{{ {} | tojson(indent=2) }}|{{ [1.0, 2.5, 0.1] | tojson }}|{{ {'k': 'v'} | tojson(sort_keys=true) }}",
  // tests
  "{{ x is defined }}{{ x is undefined }}{{ none is none }}{{ 's' is string }}{{ {} is mapping }}{{ [] is iterable }}{{ 's' is iterable }}{{ 1 is number }}{{ 1.5 is number }}{{ true is boolean }}{{ true is true }}{{ false is false }}{{ 1 is not string }}{{ [] is sequence }}{{ 2 is even }}{{ n is odd }}{{ 1 is integer }}",
  "{{ messages[2].tool_calls is defined }}{{ messages[0].tool_calls is defined }}{{ messages[0].tool_calls is none }}{{ tools is not none }}{{ 'HELLO' is upper }}{{ 'hello' is lower }}",
  // operators
  "{{ 1 if true else 2 }}|{{ 'y' if false }}|{{ 'a' in 'cat' }}{{ 'z' not in 'cat' }}{{ 2 in [1,2] }}{{ 'k' in {'k': 1} }}{{ 1 == 1.0 }}{{ 1 != 2 }}{{ 1 < 2 }}{{ 2 >= 2 }}{{ not true }}{{ true and false }}{{ false or 'x' }}{{ [] or 'e' }}{{ none == none }}{{ x == none }}",
  "{{ [1] + [2] }}|{{ (1 + 2) * 3 }}|{{ 2 ** 3 ** 2 }}|{{ 10 - 2 - 3 }}|{{ not 1 == 2 }}|{{ n > 2 and n < 5 }}|{{ messages|length - 1 }}|{{ 'a' 'b' }}",
  "{{ {'a': 1}.get('a') }}{{ {'a': 1}.get('b', 5) }}{{ {'a': 1}.get('c') }}|{{ {'a': 1, 'b': 2}.keys() }}{{ {'a': 1, 'b': 2}.values() }}|{{ {'a': 1} | length }}|{{ nested.a | length }}",
  "{{ '42' | int + 1 }}{{ '4.5' | float }}{{ 3.7 | int }}{{ 5 | string ~ '!' }}{{ 'x' | int }}|{{ 'x' | default('d') }}{{ y | default('d') }}{{ '' | default('d', true) }}{{ none | default('n') }}|{{ -3 | abs }}",
  "{{ range(2, 10, 3) | list }}|{{ range(3) }}|{{ range(5, 0, -2) | list }}|{{ [[1,2],[3]][0][1] }}|{{ {'a': {'b': {'c': 1}}}.a.b.c }}",
  "{{ '\\x41\\u00e9\\t' }}|{{ 'it\\'s' }}|{{ \"dq \\\"x\\\"\" }}|{{ -1 }}{{ - 2 }}{{ +3 }}|{{ [1,2,3][-1] }}|{{ '日本語' | length }}|{{ '😀' | length }}|{{ '日本語'[1] }}|{{ '日本語'[::-1] }}|{{ '\\u3000 x \\u3000' | trim }}",
  // whitespace control, trim_blocks, lstrip_blocks, comments
  "  {% if true %}\n  lstrip and trim\n  {% endif %}\n  {#- comment -#}   after\n{{- '  spaces ' -}}   kept?   {{ 'x' }}\n\t{% for i in [1] -%}\n   {{ i }}  \n  {%- endfor %}\n{# c #}\nend\n\n",
  "a  {%- if true -%}  b  {%- endif -%}  c\n{{ 'd' }}  {# x #}  e\n  {{ 'f' }}\n{% if true %}g{% endif %}\n",
  "line\n    {% set x = 1 %}\n    {{ x }}\n{%- for i in [1, 2] %}\n    item {{ i }}\n{%- endfor %}\n",
  "{% generation %}kept{% endgeneration %}|  {%- generation -%}  tight  {%- endgeneration -%}  |",
  // errors both must raise
  "{{ raise_exception('custom failure') }}",
  "{{ 'x' + undefined_name }}",
  "{{ none + 1 }}",
  "{% for x in 5 %}{% endfor %}",
  "{{ (1 }}",
  "{% if true %}no end",
  "{{ 'unterminated }}",
  "{% set ns = {} %}{% set ns.a = 1 %}",
  "{{ messages.content.startswith('x') }}",
];
