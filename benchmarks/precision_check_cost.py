"""What the deviation check of a precision below float32 costs (nncc/preparing/calibration.py),
against a cold native compile of the same model, and the deviation it records.

    python benchmarks/precision_check_cost.py                     # bert, gpt2, gpt2_kv in bf16
    python benchmarks/precision_check_cost.py --precision auto build/real-models/bert.onnx

Each model in a process of its own (so every kernel is compiled, none reused): the compile
alone, then the check on the compiled plan. A script, not a test: it asserts nothing.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]


def measure(path: str, precision: str) -> dict:
    from nncc.compiler import compile_graph
    from nncc.frontend.onnx import load_model
    from nncc.preparing.calibration import checked
    from nncc.preparing.compiling import compile_options

    opts = compile_options({"precision": precision})
    start = time.perf_counter()
    plan = compile_graph(load_model(path), opts)
    compiled = time.perf_counter()
    plan = checked(lambda o: plan if o == opts else compile_graph(load_model(path), o), opts)
    done = time.perf_counter()
    check = plan.options.get("precision_check") or {}
    return {"model": pathlib.Path(path).stem, "compile_s": compiled - start, "check_s": done - compiled,
            "deviation": max((check.get("deviation") or {0: 0.0}).values()),
            "float32_layers": len(check.get("float32_layers") or [])}


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        print(json.dumps(measure(argv[1], argv[2])))
        return 0
    precision = "bf16"
    if argv[:1] == ["--precision"]:
        precision, argv = argv[1], argv[2:]
    if not argv:
        import real_models

        argv = [real_models.write_one(str(ROOT / "build" / "real-models"), n) for n in ("bert", "gpt2", "gpt2_kv")]
    print(f"{'model':10} {'compile s':>9} {'check s':>8} {'check/compile':>13} {'deviation':>10} {'f32 layers':>10}")
    for path in argv:
        done = subprocess.run([sys.executable, __file__, "--child", path, precision], capture_output=True, text=True)
        if done.returncode:
            print(f"{path}: {done.stderr.strip().splitlines()[-1:]}")
            continue
        r = json.loads(done.stdout)
        print(f"{r['model']:10} {r['compile_s']:9.2f} {r['check_s']:8.2f} {r['check_s'] / r['compile_s']:13.0%} "
              f"{r['deviation']:10.2e} {r['float32_layers']:10d}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
