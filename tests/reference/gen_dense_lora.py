#!/usr/bin/python3
"""LoRA goldens for the dense decoder's Qwen3 variant (tests/test_dense.c):
gen_qwen2_lora.py's hand-written LoRA (rank 4, alpha 8, the seven
projections of every layer; q_norm / k_norm are not Linear and get none) on
dense_ref.py instead of qwen2_ref.py. Same files and contents as
gen_qwen2_lora.py writes.

  /usr/bin/python3 tests/reference/gen_dense_lora.py tests/data/dense-qwen3 tests/data/dense-lora
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dense_ref  # noqa: E402
import gen_qwen2_lora  # noqa: E402

if __name__ == "__main__":
    gen_qwen2_lora.ref = dense_ref  # the module the script's functions build models from
    gen_qwen2_lora.main()
