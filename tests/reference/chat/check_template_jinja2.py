#!/usr/bin/env python3
"""Render every real-template golden (tests/data/chat/golden-jinja-*.json,
made by gen_template_goldens.mjs with @huggingface/jinja) again with Python's
Jinja2 in transformers' environment: an ImmutableSandboxedEnvironment with
trim_blocks and lstrip_blocks, transformers' tojson, raise_exception and
strftime_now. Where the two engines render a case differently, the golden
gets "python_text" (or "python_error"): what transformers'
apply_chat_template gives, which tests/test_jinja.c then expects of whale.

    python3 tests/reference/chat/check_template_jinja2.py     (needs python3-jinja2)
"""
import datetime
import json
import pathlib

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

root = pathlib.Path(__file__).resolve().parents[3]


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise TemplateError(message)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception

def strftime_at(epoch):
    """strftime_now at the golden's fixed instant (SOURCE_DATE_EPOCH, UTC)."""
    return lambda f: datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime(f)


total = differ = 0
for path in sorted((root / "tests/data/chat").glob("golden-jinja-*.json")):
    if path.name == "golden-jinja-snippets.json":
        continue
    g = json.loads(path.read_text("utf-8"))
    env.globals["strftime_now"] = strftime_at(g["source_date_epoch"])
    template = env.from_string((root / g["template"]).read_text("utf-8"))
    for case in g["cases"]:
        case.pop("python_text", None)
        case.pop("python_error", None)
        variables = dict(g["specials"], messages=case["messages"], add_generation_prompt=case["add_generation_prompt"])
        if "tools" in case:
            variables["tools"] = case["tools"]
        variables.update(case.get("kwargs", {}))
        try:
            text, error = template.render(**variables), None
        except Exception as e:  # the template refused the conversation
            text, error = None, f"{type(e).__name__}: {e}"
        total += 1
        if ("text" in case) == (text is not None) and case.get("text") == text:
            continue
        differ += 1
        if text is not None:
            case["python_text"] = text
        else:
            case["python_error"] = error
        print(f"{path.name}/{case['name']}: Jinja2 {'renders ' + repr(text)[:160] if text is not None else 'refuses: ' + error}")
    path.write_text(json.dumps(g, ensure_ascii=False, indent=1) + "\n", "utf-8")
print(f"{total} cases rendered by Jinja2, {differ} differ from @huggingface/jinja")
