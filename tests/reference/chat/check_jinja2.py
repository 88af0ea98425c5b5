#!/usr/bin/env python3
"""Cross-check the chat goldens with Python's Jinja2, the engine transformers'
apply_chat_template uses (a sandboxed environment with trim_blocks and
lstrip_blocks on). Every golden text must be rendered identically.

    python3 tests/reference/chat/check_jinja2.py     (needs python3-jinja2)
"""
import json
import pathlib
import sys

from jinja2.sandbox import ImmutableSandboxedEnvironment

root = pathlib.Path(__file__).resolve().parents[3]
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
bad = 0
for fmt in ("deepseek", "chatml"):
    g = json.loads((root / f"tests/data/chat/golden-{fmt}.json").read_text("utf-8"))
    template = env.from_string(g["chat_template"])
    extra = {"bos_token": g["bos_token"]} if g["bos_token"] is not None else {}
    for case in g["cases"]:
        text = template.render(messages=case["messages"],
                               add_generation_prompt=case["add_generation_prompt"], **extra)
        if text != case["text"]:
            bad += 1
            print(f"{fmt}/{case['name']}: jinja2 renders differently\n  jinja2 {text!r}\n  golden {case['text']!r}")
    print(f"{fmt}: {len(g['cases'])} cases checked")
sys.exit(1 if bad else 0)
