"""`nncc bench`: its --json output against the schema documented in docs/bench.md, the
onnxruntime comparison, --duration, bad input, and the pieces behind it (FLOP counting,
percentiles, BLAS threads). Never a timing assertion: only shapes, types and consistency.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from nncc.model import compile_model
from nncc.native.toolchain import find_toolchain
from tests.models import dynamic_quantize_matmul

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
DOC = ROOT / "docs" / "bench.md"

TYPES = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
}


def _env(**extra) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("NNCC_DEBUG", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), *extra.pop("pythonpath", []),
                                                      env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def bench(*args, cwd=ROOT, env=None) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "nncc", "bench", *map(str, args)], cwd=cwd,
                            env=env or _env(), capture_output=True, text=True, timeout=300)
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    return result


def bench_json(*args, env=None) -> tuple[dict, str]:
    result = bench(*args, "--json", env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), result.stderr


def documented_keys() -> dict[str, tuple[type, ...]]:
    """`key` -> allowed Python types, from the schema tables of docs/bench.md."""
    keys = {}
    for match in re.finditer(r"^\| `([^`]+)` \| ([a-z ]+?) \|", DOC.read_text(), re.MULTILINE):
        key, kinds = match.group(1), match.group(2)
        if " " in key or key.startswith("-"):
            continue
        allowed: tuple[type, ...] = ()
        for kind in kinds.split(" or "):
            allowed += TYPES[kind.strip()]
        keys[key] = allowed
    return keys


def lookup(payload: dict, key: str) -> list:
    """The values at a dotted key; `a[].b` means key b of every element of array a."""
    values = [payload]
    for part in key.split("."):
        many = part.endswith("[]")
        name = part[:-2] if many else part
        nxt = []
        for value in values:
            if value is None:  # a null parent (compare without onnxruntime): nothing below it
                continue
            assert isinstance(value, dict) and name in value, f"missing key {key!r} (at {name!r})"
            nxt.extend(value[name] if many else [value[name]])
        values = nxt
    return values


def check_schema(payload: dict, *, with_compare: bool) -> None:
    keys = documented_keys()
    assert len(keys) > 60, "the schema table of docs/bench.md was not found"
    for key, allowed in keys.items():
        if key.startswith("compare.") and not with_compare:
            continue
        for value in lookup(payload, key):
            ok = isinstance(value, allowed) and not (isinstance(value, bool) and bool not in allowed)
            assert ok, f"{key}: {value!r} is not {allowed}"
    # nothing undocumented at the first two levels either
    documented = set(keys)
    for top, value in payload.items():
        assert top in documented, f"undocumented key {top!r}"
        if isinstance(value, dict) and top not in ("flops_by_op",):
            for sub in value:
                if top == "settings" and sub == "dims" or top == "machine" and sub == "env":
                    continue
                assert f"{top}.{sub}" in documented, f"undocumented key {top}.{sub}"


@pytest.fixture(scope="module")
def mlp_report() -> tuple[dict, str]:
    return bench_json(FIXTURES / "mlp.onnx", "--iterations", 5, "--warmup", 1)


@pytest.mark.slow
def test_json_has_every_documented_key_with_its_type(mlp_report):
    payload, _ = mlp_report
    check_schema(payload, with_compare=False)
    assert payload["schema"] == "nncc-bench/1"
    assert payload["compare"] is None
    assert payload["iterations"] == 5
    assert payload["settings"]["iterations"] == 5 and payload["settings"]["warmup"] == 1
    assert payload["settings"]["dims"] == {"N": 1}
    assert payload["inputs"] == [{"name": "x", "shape": [1, 64], "dtype": "float32"}]


@pytest.mark.slow
@pytest.mark.skipif(find_toolchain() is None, reason="no C compiler here: nncc times portable code by design")
def test_the_timed_model_runs_the_native_code_a_compile_builds(mlp_report):
    # the cache hits must serve the optimized stage, not the quick portable one a miss
    # returns at once: compile_model (no cache, every stage) is the independent count
    payload, _ = mlp_report
    compiled = compile_model(FIXTURES / "mlp.onnx", dims=payload["settings"]["dims"])
    assert compiled.native_partitions >= 1
    assert payload["settings"]["native_partitions"] == compiled.native_partitions


def test_json_figures_are_consistent(mlp_report):
    payload, _ = mlp_report
    lat = payload["latency_seconds"]
    assert 0 < lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"]
    assert lat["min"] <= lat["mean"] and lat["stddev"] >= 0
    assert payload["throughput_per_second"] == pytest.approx(1 / lat["mean"])
    c = payload["compile"]
    assert c["cold_runs"] == 4 and c["cold_seconds"] > 0 and c["cold_first_seconds"] > 0
    assert c["cache_store_outcome"] == "miss" and c["cache_hits"] == 5
    assert 0 < c["cache_hit_min_seconds"] <= c["cache_hit_seconds"]
    assert c["cache_hit_slower"] is (c["cache_hit_seconds"] > c["cold_seconds"])  # the flag says what was measured
    assert c["cache_dir_temporary"] and not os.path.exists(c["cache_dir"])  # cleaned up
    assert c["load_seconds"] is None
    assert payload["first_inference_seconds"] > 0
    # 64 -> 128 (Gemm), 128 -> 64 (MatMul), 64 -> 10 (Gemm), batch 1
    assert payload["flops_by_op"] == {"Gemm": 2 * (64 * 128 + 64 * 10), "MatMul": 2 * 128 * 64}
    assert payload["flops"] == sum(payload["flops_by_op"].values())
    assert payload["gflops_per_second"] == pytest.approx(payload["flops"] / lat["p50"] / 1e9)
    mem = payload["memory"]
    assert mem["peak_rss_bytes"] >= mem["peak_rss_nncc_bytes"] > 0
    assert payload["settings"]["threads"] == 2


def test_json_output_is_strict_json(mlp_report):
    payload, _ = mlp_report
    text = json.dumps(payload, allow_nan=False)  # no Infinity/NaN anywhere
    assert json.loads(text) == payload


@pytest.mark.slow
def test_compare_onnxruntime_adds_ratios_and_a_small_difference():
    payload, _ = bench_json(FIXTURES / "mlp.onnx", "--iterations", 5, "--warmup", 1, "--compare", "onnxruntime")
    check_schema(payload, with_compare=True)
    cmp = payload["compare"]
    assert cmp["available"] is True and cmp["reason"] is None and cmp["runtime"] == "onnxruntime"
    assert cmp["iterations"] == payload["iterations"] == 5  # interleaved: same count each
    assert cmp["outputs_compared"] == 2  # probs and logits
    assert cmp["max_abs_diff"] < 1e-4
    for key in ("min", "p50", "p90", "p99", "mean"):
        assert cmp["ratios"][key] == pytest.approx(payload["latency_seconds"][key] / cmp["latency_seconds"][key])
    assert cmp["ratios"]["throughput"] == pytest.approx(payload["throughput_per_second"]
                                                        / cmp["throughput_per_second"])
    assert cmp["ratios"]["compile"] == pytest.approx(payload["compile"]["cold_seconds"] / cmp["session_seconds"])
    assert cmp["threads"] == 2
    assert cmp["session_options"] == {"intra_op_num_threads": 2}


def test_compare_runs_onnxruntime_at_its_defaults():
    """Every session option is onnxruntime's own default (a fresh SessionOptions says what
    that is) except the thread count, and no session config entry (spinning, say) is set."""
    from nncc.bench import onnxruntime_session

    ours = onnxruntime_session(str(FIXTURES / "mlp.onnx"), 3).get_session_options()
    default = ort.SessionOptions()
    differ = {name for name in dir(default) if not name.startswith("_") and not callable(getattr(default, name))
              and getattr(ours, name) != getattr(default, name)}
    assert differ == {"intra_op_num_threads", "log_severity_level"}  # the log level prints nothing else
    assert ours.intra_op_num_threads == 3
    for key in ("session.intra_op.allow_spinning", "session.inter_op.allow_spinning"):
        with pytest.raises(Exception, match="does not have configuration"):
            ours.get_session_config_entry(key)


@pytest.mark.slow
def test_a_quantized_model_compares_int8_with_int8(tmp_path):
    """A model its file quantizes computes its products in int8 in nncc and onnxruntime
    alike: both columns say int8 and the ratios are given; a float model's say f32."""
    path = tmp_path / "q.onnx"
    onnx.save(dynamic_quantize_matmul(np.random.default_rng(0), (4, 32), 16, True, True, False), path)
    for model, label in ((path, "int8"), (FIXTURES / "mlp.onnx", "f32")):
        result = bench(model, "-n", 2, "--warmup", 0, "--compare", "onnxruntime", "--threads", 1)
        assert result.returncode == 0, result.stderr
        assert f"nncc ({label})" in result.stdout and f"onnxruntime ({label})" in result.stdout, result.stdout
        assert "nncc / ort" in result.stdout
    payload, _ = bench_json(path, "-n", 2, "--warmup", 0)
    assert payload["settings"]["quantized"] is True


@pytest.mark.slow  # a bench run against onnxruntime
def test_compare_table_says_what_differs_from_onnxruntimes_defaults():
    result = bench(FIXTURES / "mlp.onnx", "-n", 2, "--warmup", 0, "--compare", "onnxruntime", "--threads", 1)
    assert result.returncode == 0, result.stderr
    assert "onnxruntime at its defaults except intra_op_num_threads=1" in result.stdout


@pytest.mark.slow
def test_compare_on_a_convnet_agrees_with_onnxruntime():
    payload, _ = bench_json(FIXTURES / "resnet_block.onnx", "-n", 2, "--warmup", 0, "--compare", "onnxruntime",
                            "--threads", 1)
    assert payload["compare"]["max_abs_diff"] < 1e-3
    assert payload["blas"]["threads"] in (1, None)
    assert payload["flops_by_op"].keys() == {"Conv", "Gemm"}


@pytest.mark.slow  # a bench run in a process
def test_compare_without_onnxruntime_says_so_once_and_goes_on(tmp_path):
    shadow = tmp_path / "shadow" / "onnxruntime"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('onnxruntime hidden by the test')\n")
    env = _env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "shadow"), env["PYTHONPATH"]])
    payload, stderr = bench_json(FIXTURES / "mlp.onnx", "-n", 3, "--warmup", 0, "--compare", "onnxruntime", env=env)
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "onnxruntime is not installed" in lines[0], stderr
    check_schema(payload, with_compare=True)
    cmp = payload["compare"]
    assert cmp["available"] is False and "not installed" in cmp["reason"]
    assert cmp["ratios"] is None and cmp["max_abs_diff"] is None and cmp["latency_seconds"] is None
    assert payload["iterations"] == 3


@pytest.mark.slow  # a timed bench run
def test_duration_runs_at_least_once_and_records_it():
    payload, _ = bench_json(FIXTURES / "mlp.onnx", "--duration", 0.2, "--warmup", 0)
    assert payload["settings"]["duration"] == 0.2 and payload["settings"]["iterations"] is None
    assert payload["iterations"] >= 1
    assert payload["latency_seconds"]["min"] > 0


@pytest.mark.slow
def test_table_output(tmp_path):
    # the MLP: the table's rows are the same for any model, and it compiles in a fraction of
    # the transformer's time
    result = bench(FIXTURES / "mlp.onnx", "-n", 3, "--warmup", 0, "--dim", "N=2")
    assert result.returncode == 0, result.stderr
    for label in ("cold compile", "cache-hit load", "first inference", "latency p50", "latency p99",
                  "throughput", "peak RSS"):
        assert label in result.stdout, label
    assert result.stderr == ""  # no progress bar when stderr is not a terminal


def test_artifact_reports_load_instead_of_compile(tmp_path):
    import nncc

    artifact = tmp_path / "mlp.nncc"
    nncc.compile_model(FIXTURES / "mlp.onnx").save(artifact)
    payload, _ = bench_json(artifact, "-n", 2, "--warmup", 0)
    check_schema(payload, with_compare=False)
    assert payload["model_kind"] == "artifact"
    assert payload["compile"]["load_seconds"] > 0
    assert payload["compile"]["cold_seconds"] is None and payload["compile"]["cache_hit_seconds"] is None


@pytest.mark.parametrize("args, fragment", [
    (["missing.onnx"], "no such file"),
    ([str(FIXTURES)], "directory"),
    ([str(FIXTURES / "mlp.onnx"), "--iterations", "3", "--duration", "1"], "not both"),
    ([str(FIXTURES / "mlp.onnx"), "--iterations", "0"], "at least 1"),
    ([str(FIXTURES / "mlp.onnx"), "--threads", "0"], "at least 1"),
    ([str(FIXTURES / "mlp.onnx"), "--duration", "-1"], "positive"),
    ([str(FIXTURES / "mlp.onnx"), "--dim", "S"], "NAME=SIZE"),
    ([str(FIXTURES / "mlp.onnx"), "--compare", "tvm"], "tvm"),
])
@pytest.mark.slow
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, fragment):
    result = bench(*args, "--json", cwd=tmp_path)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("nncc: error: ") and fragment in lines[0], lines[0]
    assert result.returncode == 2
    assert result.stdout == ""


def test_not_a_model_is_one_line_and_exit_2(tmp_path):
    bogus = tmp_path / "bogus.onnx"
    bogus.write_bytes(b"\xff\xfe not a protobuf")
    result = bench(bogus, cwd=tmp_path)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_bench_help_stays_light():
    code = ("import sys, json\nfrom nncc.cli.main import main\ntry:\n    main(['bench', '--help'])\n"
            "except SystemExit as exc:\n    code = exc.code\n"
            "print(json.dumps([code, [m for m in ('numpy', 'rich', 'onnx', 'onnxruntime') if m in sys.modules]]),"
            " file=sys.stderr)\n")
    result = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120)
    code, loaded = json.loads(result.stderr.strip().splitlines()[-1])
    assert code == 0 and loaded == []
    assert "--compare" in result.stdout and "--duration" in result.stdout


def test_core_does_not_import_click_or_rich():
    code = ("import sys, nncc.bench, nncc.util.threads\n"
            "assert 'click' not in sys.modules and 'rich' not in sys.modules, sys.modules.keys()\n")
    result = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


# -- the pieces ----------------------------------------------------------------------------------------


def test_latency_stats_match_numpy():
    from nncc.bench import latency_stats

    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 100):
        samples = list(rng.random(n))
        stats = latency_stats(samples)
        for key, q in (("p50", 50), ("p90", 90), ("p99", 99)):
            assert stats[key] == pytest.approx(np.percentile(samples, q))
        assert stats["min"] == min(samples)
        assert stats["mean"] == pytest.approx(np.mean(samples))
        assert stats["stddev"] == pytest.approx(np.std(samples, ddof=1) if n > 1 else 0.0)


def _onnx_flops(path, dims) -> int:
    """An independent count: onnx's own shape inference on the original graph."""
    import onnx
    from onnx import shape_inference

    model = onnx.load(str(path))
    for value in model.graph.input:
        for d in value.type.tensor_type.shape.dim:
            if d.dim_param:
                d.dim_value = dims[d.dim_param]
    model = shape_inference.infer_shapes(model)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output)}
    shapes.update({t.name: list(t.dims) for t in model.graph.initializer})
    total = 0
    for node in model.graph.node:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "Conv":
            total += 2 * math.prod(shapes[node.output[0]]) * math.prod(shapes[node.input[1]][1:])
        elif node.op_type == "Gemm":
            a = shapes[node.input[0]]
            k = a[0] if attrs.get("transA", 0) else a[1]
            total += 2 * math.prod(shapes[node.output[0]]) * k
        elif node.op_type == "MatMul":
            total += 2 * math.prod(shapes[node.output[0]]) * shapes[node.input[0]][-1]
    return total


@pytest.mark.slow
@pytest.mark.parametrize("name, dims", [("resnet_block", {}), ("mobilenet", {}), ("transformer", {"S": 16}),
                                        ("mlp", {"N": 4})])
@pytest.mark.parametrize("opt_level", [0, 2])
def test_count_flops_matches_an_independent_count(name, dims, opt_level):
    import nncc
    from nncc.bench import count_flops

    path = FIXTURES / f"{name}.onnx"
    plan = nncc.compile_model(path, opt_level=opt_level).plan
    counted = count_flops(plan, dims)
    assert counted["unresolved"] == []
    assert counted["total"] == _onnx_flops(path, dims) > 0


def test_count_flops_reports_unbound_dims():
    import nncc
    from nncc.bench import count_flops

    counted = count_flops(nncc.compile_model(FIXTURES / "mlp.onnx").plan, {})
    assert counted["total"] is None and counted["unresolved"]


def test_blas_threads_can_be_set_and_restored():
    from nncc.util.threads import blas_info, blas_threads, limit_blas_threads, set_blas_threads

    info = blas_info()
    if info["library"] is None:
        assert set_blas_threads(1) is False  # the no-op fallback
        pytest.skip("numpy runs on a BLAS nncc does not know how to limit")
    before = blas_threads()
    with limit_blas_threads(1) as applied:
        assert applied and blas_threads() == 1
        a = np.ones((64, 64), np.float32)
        assert (a @ a)[0, 0] == 64
    assert blas_threads() == before
    with pytest.raises(ValueError):
        set_blas_threads(0)
    with limit_blas_threads(None) as applied:
        assert applied is False


def test_max_abs_diff():
    from nncc.bench import max_abs_diff

    a = {"y": np.array([1.0, np.nan, np.inf], np.float32), "z": np.array([1, 2])}
    b = {"y": np.array([1.5, np.nan, np.inf], np.float32), "z": np.array([1, 2]), "extra": np.zeros(1)}
    assert max_abs_diff(a, b) == (0.5, 2)
    assert max_abs_diff({"y": np.zeros(2)}, {"y": np.zeros(3)})[0] == math.inf
    assert max_abs_diff({"y": np.zeros(2)}, {}) == (None, 0)


def test_max_rel_diff_is_relative_to_each_outputs_scale():
    from nncc.bench import max_rel_diff

    # logits in the hundreds of thousands: an absolute 0.156 is a relative 0.156 / 346000
    big = np.array([346000.0, -12.0, 3.0])
    assert max_rel_diff({"logits": big + [0.156, 0, 0]}, {"logits": big}) == pytest.approx(0.156 / 346000)
    # the worst output wins; a value near zero does not blow it up (the scale is the output's)
    ours = {"a": np.array([1.0, 1e-9]), "b": np.array([10.0, 0.0])}
    theirs = {"a": np.array([1.0, 2e-9]), "b": np.array([8.0, 0.0])}
    assert max_rel_diff(ours, theirs) == pytest.approx(2.0 / 8.0)
    assert max_rel_diff({"z": np.zeros(3)}, {"z": np.zeros(3)}) == 0.0
    assert max_rel_diff({"z": np.ones(3)}, {"z": np.zeros(3)}) == math.inf  # becomes null in --json
    assert max_rel_diff({"y": np.zeros(2)}, {}) is None


def test_table_flags_a_cache_hit_slower_than_a_cold_compile(mlp_report, capsys):
    from nncc.cli.bench import render

    payload = json.loads(json.dumps(mlp_report[0]))
    c = payload["compile"]
    c["cold_seconds"], c["cache_hit_seconds"], c["cache_hit_slower"] = 0.00069, 0.00090, True  # the mlp case
    render(payload)
    out = capsys.readouterr().out
    assert "0.900 ms (slower!)" in out
    assert "a cache hit (0.900 ms) is slower than a cold compile (0.690 ms)" in out
    c["cache_hit_slower"] = False
    render(payload)
    assert "slower" not in capsys.readouterr().out


@pytest.mark.slow  # a bench run in a process
def test_piped_table_title_is_one_line(tmp_path):
    """A title longer than 80 columns stays on one line when stdout is a pipe (it used to
    break before "threads")."""
    folder = tmp_path / ("a-folder-whose-name-makes-the-title-long" * 2)
    folder.mkdir()
    model = folder / "mlp.onnx"
    shutil.copy(FIXTURES / "mlp.onnx", model)
    result = bench(model, "-n", 2, "--warmup", 0, env=_env(COLUMNS="80"))
    assert result.returncode == 0, result.stderr
    first = result.stdout.splitlines()[0]
    assert len(first) > 80 and first.startswith(f"{model}: ") and first.endswith("threads, 2 iterations")


# -- benchmarks/bench_peers.py: the peers as their users run them, each in its own process ----------------

BENCHMARKS = ROOT / "benchmarks"


def _with_peer_runtimes(code: str) -> dict:
    """What ``code`` prints as JSON, run as the benchmarks run: a process with benchmarks/ on
    its path, peer_runtimes imported (the benchmarks are scripts, not a package to import)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(BENCHMARKS), str(ROOT)]))
    done = subprocess.run([sys.executable, "-c", "import json\nimport peer_runtimes\n" + textwrap.dedent(code)],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_bench_peers_onnxruntime_is_at_its_defaults():
    seen = _with_peer_runtimes(f"""
        import onnxruntime as ort
        ours = peer_runtimes.ort_session({str(FIXTURES / "mlp.onnx")!r}, 1).get_session_options()
        default = ort.SessionOptions()
        differ = sorted(name for name in dir(default) if not name.startswith("_")
                        and not callable(getattr(default, name)) and getattr(ours, name) != getattr(default, name))
        try:
            spinning = ours.get_session_config_entry("session.intra_op.allow_spinning")
        except Exception as exc:
            spinning = f"unset: {{exc}}"
        print(json.dumps(dict(differ=differ, threads=ours.intra_op_num_threads, spinning=spinning)))
        """)
    assert seen["differ"] == ["intra_op_num_threads"] and seen["threads"] == 1
    assert "does not have configuration" in seen["spinning"]


def test_a_measuring_process_times_at_least_its_runs_and_its_time_budget():
    """Every runtime's process (peer_runtimes.timed_runs) times --runs runs, and goes on
    until they took --min-seconds in all: a run of microseconds is a median over hundreds."""
    seen = _with_peer_runtimes("""
        import time
        calls = []
        run = lambda feeds: (calls.append(feeds), time.sleep(0.001))
        counted = peer_runtimes.timed_runs(run, "feeds", 7, 0.0)
        budget = peer_runtimes.timed_runs(run, "feeds", 2, 0.05)
        print(json.dumps(dict(counted=len(counted), budget=len(budget), spent=sum(budget), calls=len(calls),
                              fed=sorted(set(calls)))))
        """)
    assert seen["counted"] == 7
    assert seen["spent"] >= 0.05  # two runs of 1 ms each fill it only by going on
    assert seen["calls"] == seen["counted"] + seen["budget"] and seen["fed"] == ["feeds"]


def test_bench_peers_openvino_is_at_its_defaults():
    """Every property of the compiled model is what a plain compile_model gives, except the
    thread count."""
    seen = _with_peer_runtimes(f"""
        import openvino as ov
        ours = peer_runtimes.openvino_model({str(FIXTURES / "mlp.onnx")!r}, 1)
        default = ov.Core().compile_model({str(FIXTURES / "mlp.onnx")!r}, "CPU")
        differ = sorted(name for name in default.get_property("SUPPORTED_PROPERTIES")
                        if str(ours.get_property(name)) != str(default.get_property(name)))
        print(json.dumps(dict(differ=differ, threads=ours.get_property("INFERENCE_NUM_THREADS"))))
        """)
    assert seen["threads"] == 1
    assert set(seen["differ"]) <= {"INFERENCE_NUM_THREADS"}


def _onnx_conv_classes(path) -> dict[str, tuple[int, int]]:
    """class -> (nodes, FLOPs) from the ONNX graph itself: onnx's shape inference, the
    weights' dims and each Conv's group (an independent count for step_classes.py)."""
    import onnx
    from onnx import shape_inference

    model = shape_inference.infer_shapes(onnx.load(str(path)))
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output)}
    shapes.update({t.name: list(t.dims) for t in model.graph.initializer})
    found: dict[str, tuple[int, int]] = {}
    for node in model.graph.node:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "Conv":
            w, x = shapes[node.input[1]], shapes[node.input[0]]
            group = attrs.get("group", 1)
            kind = ("depthwise" if group > 1 and group == x[1] else "1x1" if w[2:] == [1, 1] else
                    "3x3" if w[2:] == [3, 3] else "7x7 stem" if w[2:] == [7, 7] and x[1] <= 4 else "other conv")
            flops = 2 * math.prod(shapes[node.output[0]]) * math.prod(w[1:])
        elif node.op_type in ("Gemm", "MatMul"):
            a = shapes[node.input[0]]
            kind, flops = "GEMM", 2 * math.prod(shapes[node.output[0]]) * (
                a[0] if attrs.get("transA", 0) else a[-1])
        else:
            continue
        nodes, total = found.get(kind, (0, 0))
        found[kind] = (nodes + 1, total + flops)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet_block", "mobilenet"])
def test_step_classes_account_for_every_convolution(name):
    """The profile's classes hold every Conv/Gemm of the model, in the class the ONNX graph
    says, with its FLOPs, and time for each: whatever steps the native code splits or fuses
    them into (resnet_block's residual convolutions are written by their Add)."""
    job = {"job": "profile", "path": str(FIXTURES / f"{name}.onnx"), "threads": 1, "runs": 2, "dims": {}}
    done = subprocess.run([sys.executable, str(BENCHMARKS / "bench_peers.py"), "--one", json.dumps(job)],
                          env=_env(), capture_output=True, text=True, timeout=300)
    profile = json.loads(done.stdout)
    assert "error" not in profile, profile
    assert profile["native_partitions"] == profile["partitions"] == 1
    assert profile["unplaced_gflop"] == 0 and profile["unmatched_ms"] == 0
    classes = profile["classes"]
    got = {k: (v["nodes"], round(v["gflops"] * 1e9)) for k, v in classes.items() if k != "no FLOPs"}
    assert got == _onnx_conv_classes(FIXTURES / f"{name}.onnx")
    assert all(v["ms"] > 0 for v in classes.values())
    assert sum(v["ms"] for v in classes.values()) == pytest.approx(profile["native_ms"])


@pytest.mark.slow  # rounds of processes
def test_bench_peers_runs_each_runtime_alone_in_alternating_rounds(tmp_path):
    """Two rounds on the mlp fixture, OpenVINO hidden: every measurement in a process of its
    own, the order reversed in round 2, the ratio against the peer that ran, and the
    missing peer named."""
    shadow = tmp_path / "shadow" / "openvino"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('openvino hidden by the test')\n")
    env = _env(pythonpath=[str(tmp_path / "shadow")])  # ahead of site-packages
    args = ["--model", "mlp", "--rounds", "2", "--iterations", "3", "--warmup", "1", "--profile-runs", "0",
            "--batch", "0"]
    done = subprocess.run([sys.executable, str(BENCHMARKS / "bench_peers.py"), *args, "--json"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert "openvino hidden by the test" in report["missing"]["openvino"]
    (row,) = report["models"]
    orders = [r["order"] for r in row["rounds"]]
    assert orders == [["nncc", "onnxruntime"], ["onnxruntime", "nncc"]]
    pids = [res["pid"] for r in row["rounds"] for res in r["results"].values()]
    assert len(set(pids)) == len(pids) == 4 and os.getpid() not in pids
    nncc, ort = row["runtimes"]["nncc"], row["runtimes"]["onnxruntime"]
    assert nncc["p50_s"] == statistics.median(r["results"]["nncc"]["p50_s"] for r in row["rounds"])
    assert row["best_peer"] == "onnxruntime"
    assert row["nncc_over_best_peer"] == pytest.approx(nncc["p50_s"] / ort["p50_s"])
    assert nncc["cache"] == "hit"  # prepared through the cache, as its users run it
    assert row["max_rel_diff"]["nncc vs onnxruntime"] < 1e-5
    assert row["runtimes"]["openvino"]["error"]
    table = subprocess.run([sys.executable, str(BENCHMARKS / "bench_peers.py"), *args[:2], "--rounds", "1",
                            "--iterations", "2", "--warmup", "0", "--profile-runs", "0", "--batch", "0"],
                           env=env, capture_output=True, text=True, timeout=600)
    assert "openvino is not installed (openvino hidden by the test): left out" in table.stdout
    row_line = next(line for line in table.stdout.splitlines() if line.startswith("mlp "))
    assert row_line.split()[3:5] == ["not", "installed"]  # nncc ms, onnxruntime ms, then openvino's cell
    # a saved report renders again, a difference that could not be measured shown as "-"
    row["max_rel_diff"] = {"nncc vs onnxruntime": None, "nncc-bf16 vs onnxruntime": None}
    saved = tmp_path / "peers.json"
    saved.write_text(json.dumps(report))
    rendered = subprocess.run([sys.executable, str(BENCHMARKS / "bench_peers.py"), "--render", str(saved),
                               "--markdown"], env=env, capture_output=True, text=True, timeout=600)
    assert rendered.returncode == 0, rendered.stderr
    assert rendered.stdout.count("| mlp |") >= 1 and "nncc-bf16 max rel diff vs onnxruntime -" in rendered.stdout


def test_a_temporary_cache_starts_no_thread_that_outlives_it(monkeypatch):
    """Without --cache-dir the bench times hits in a folder it removes afterwards: a
    background upgrade or shape build started by those hits would run on in a folder that
    is gone (and compete with the runs timed next). The hits start none; every thread
    started is recorded, and all are real."""
    import threading

    from nncc.bench import BenchSettings, run_benchmark

    monkeypatch.setenv("NNCC_UPGRADE_AFTER", "1")  # an upgrade would start at the first hit
    started = []
    start = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", lambda self: (started.append(self.name), start(self))[1])
    report = run_benchmark(str(FIXTURES / "mlp.onnx"), BenchSettings(iterations=2, warmup=0))
    assert report["compile"]["cache_hits"] >= 1
    assert not [name for name in started if name.startswith(("nncc-upgrade-", "nncc-shape-"))], started
