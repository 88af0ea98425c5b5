#!/usr/bin/env python3
"""Check a LoRA checkpoint folder the way PEFT would read it (standard
library only: the safetensors headers are parsed by hand).

  python3 tests/reference/check_adapter.py CHECKPOINT_DIR BASE_MODEL_DIR [RANK]

adapter_config.json: peft_type LORA, task_type CAUSAL_LM, r, lora_alpha,
lora_dropout, target_modules, base_model_name_or_path, use_rslora, bias
"none". adapter_model.safetensors: only keys
base_model.model.<module>.lora_A.weight [r, in] and .lora_B.weight [out, r],
F32, each pair complete, every <module>.weight a 2-D tensor of the base
(single file or sharded), and <module> ending in one of target_modules
(unless "all-linear", which must leave out lm_head and embeddings).
Prints one line per problem and exits 1 if there is any.
"""

import json
import os
import re
import struct
import sys


def header(path):
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path}: shorter than 8 bytes")
        (n,) = struct.unpack("<Q", raw)
        h = json.loads(f.read(n))
    h.pop("__metadata__", None)
    return h


def base_shapes(base):
    index = os.path.join(base, "model.safetensors.index.json")
    single = os.path.join(base, "model.safetensors")
    files = [single] if os.path.exists(single) else sorted(
        {os.path.join(base, v) for v in json.load(open(index))["weight_map"].values()})
    shapes = {}
    for f in files:
        for k, v in header(f).items():
            shapes[k] = v["shape"]
    return shapes


def main():
    if len(sys.argv) not in (3, 4):
        print(__doc__)
        return 2
    ckpt, base = sys.argv[1], sys.argv[2]
    want_rank = int(sys.argv[3]) if len(sys.argv) == 4 else None
    problems = []
    cfg = json.load(open(os.path.join(ckpt, "adapter_config.json")))
    expect = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "bias": "none"}
    for k, v in expect.items():
        if cfg.get(k) != v:
            problems.append(f"adapter_config.json: {k} is {cfg.get(k)!r}, want {v!r}")
    for k, t in (("r", int), ("lora_alpha", (int, float)), ("lora_dropout", (int, float)), ("use_rslora", bool),
                 ("base_model_name_or_path", str)):
        if not isinstance(cfg.get(k), t) or (t is int and isinstance(cfg.get(k), bool)):
            problems.append(f"adapter_config.json: {k} missing or not {t}")
    r = cfg.get("r")
    if want_rank is not None and r != want_rank:
        problems.append(f"adapter_config.json: r is {r}, want {want_rank}")
    targets = cfg.get("target_modules")
    if not (targets == "all-linear" or (isinstance(targets, list) and targets and all(isinstance(t, str) for t in targets))):
        problems.append(f"adapter_config.json: target_modules {targets!r} is not 'all-linear' or a list of names")

    shapes = base_shapes(base)
    tensors = header(os.path.join(ckpt, "adapter_model.safetensors"))
    key = re.compile(r"^base_model\.model\.(.+)\.lora_([AB])\.weight$")
    pairs = {}
    for name, t in tensors.items():
        m = key.match(name)
        if not m:
            problems.append(f"{name}: not a PEFT LoRA key")
            continue
        if t["dtype"] != "F32":
            problems.append(f"{name}: dtype {t['dtype']}, want F32")
        pairs.setdefault(m.group(1), {})[m.group(2)] = t["shape"]
    for module, ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"}:
            problems.append(f"{module}: has lora_{''.join(ab)} only")
            continue
        w = shapes.get(module + ".weight")
        if w is None or len(w) != 2:
            problems.append(f"{module}: the base has no 2-D {module}.weight")
            continue
        out_f, in_f = w
        if ab["A"] != [r, in_f]:
            problems.append(f"{module}.lora_A: shape {ab['A']}, want {[r, in_f]}")
        if ab["B"] != [out_f, r]:
            problems.append(f"{module}.lora_B: shape {ab['B']}, want {[out_f, r]}")
        leaf = module.rsplit(".", 1)[-1]
        if targets == "all-linear":
            if leaf == "lm_head" or "embed" in leaf:
                problems.append(f"{module}: all-linear must leave out the output layer and embeddings")
        elif isinstance(targets, list) and not any(module == t or module.endswith("." + t) for t in targets):
            problems.append(f"{module}: not among target_modules {targets}")
    if not pairs:
        problems.append("adapter_model.safetensors: no adapters")
    for p in problems:
        print(p)
    if not problems:
        print(f"ok: {len(pairs)} adapters, r={r}, {sum(len(v) for v in pairs.values())} tensors")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
