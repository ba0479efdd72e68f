"""A backend's own options travel as its own record in the compile options: the native
backend's target ISA and how its C compiler runs (nncc.backends.native_options), given as
keywords at the API edge (``target=``), as a whole record by backend name, in their JSON
form (the background worker's), or resolved from the command's settings."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import onnx
import pytest

import nncc
from nncc.backends.native_options import NativeOptions
from nncc.errors import OptionError
from nncc.native.toolchain import find_toolchain
from nncc.preparing.compiling import compile_options
from nncc.preparing.token import token_context
from tests.models import mlp
from tests.oracle import ort_outputs

HAS_CC = find_toolchain() is not None
DEFAULTS = (("native", NativeOptions()),)  # the records a command resolves with nothing set


@pytest.fixture
def mlp_path(tmp_path):
    path = tmp_path / "mlp.onnx"
    onnx.save_model(mlp([3, 16], 24, 5, seed=3), str(path))
    return path


@pytest.mark.slow
@pytest.mark.skipif(not HAS_CC, reason="no C compiler: the native backend builds nothing to target")
def test_the_target_keyword_builds_for_that_isa_and_matches_onnxruntime(mlp_path):
    model = nncc.compile_model(mlp_path, target="x86-64-v2")
    assert model.plan.options["native"]["target"] == "x86-64-v2"
    assert model.native_partitions == 1
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    want = ort_outputs(mlp_path, {"x": x})["y"]
    np.testing.assert_allclose(model.run({"x": x})["y"], want, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not HAS_CC, reason="no C compiler: the native backend builds nothing to target")
def test_the_target_flag_reaches_the_artifact(cli, mlp_path, tmp_path):
    out = tmp_path / "mlp.nncc"
    code, stdout, _ = cli("compile", mlp_path, "-o", out, "--target", "x86-64-v2", "--no-cache", "--json")
    assert code == 0 and json.loads(stdout)["written"]
    model = nncc.load(out.read_bytes())
    assert model.plan.options["native"]["target"] == "x86-64-v2" and model.native_partitions == 1
    x = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    np.testing.assert_allclose(model.run({"x": x})["y"], ort_outputs(mlp_path, {"x": x})["y"], rtol=1e-5, atol=1e-5)


def test_a_keyword_a_record_and_its_json_form_are_the_same_options():
    by_keyword = compile_options({"target": "x86-64-v3"}, DEFAULTS)
    by_record = compile_options({"backend_options": {"native": NativeOptions(target="x86-64-v3")}}, DEFAULTS)
    by_plain = compile_options({"backend_options": [["native", {"target": "x86-64-v3"}]]}, DEFAULTS)
    assert by_keyword == by_record == by_plain
    assert by_keyword.options_of("native") == NativeOptions(target="x86-64-v3")
    assert token_context(by_keyword) == token_context(by_record)


@pytest.mark.skipif(not HAS_CC, reason="no C compiler: no toolchain key for the target to change")
def test_another_target_is_another_token():
    assert token_context(compile_options({"target": "x86-64-v3"}, DEFAULTS)) != token_context(
        compile_options({}, DEFAULTS))


def test_keywords_go_over_the_record_the_settings_resolve(monkeypatch):
    monkeypatch.setenv("NNCC_NATIVE_SANITIZE", "on")
    monkeypatch.setenv("NNCC_CC_TIMEOUT", "9")
    native = compile_options({"target": "x86-64-v2", "cc_jobs": 3}).options_of("native")
    assert native == NativeOptions(target="x86-64-v2", sanitize=True, cc_timeout=9.0, cc_jobs=3,
                                   cc=native.cc)  # $CC as this environment has it


def test_the_workers_json_form_carries_the_commands_record(monkeypatch):
    """The detached worker gets the options as JSON (nncc.preparing.policy.spawn_worker)
    and builds exactly what its command resolved, reading no setting of its own: a bad
    value in its environment changes nothing."""
    opts = compile_options({"precision": "bf16"},
                           (("native", NativeOptions("x86-64-v2", True, 7.5, "gcc", 2)),))
    monkeypatch.setenv("NNCC_NATIVE_SANITIZE", "maybe")
    again = compile_options(json.loads(json.dumps(dataclasses.asdict(opts))))
    assert again == opts and again.options_of("native") == NativeOptions("x86-64-v2", True, 7.5, "gcc", 2)


@pytest.mark.parametrize("options, message", [
    ({"target": "z80"}, "unknown target 'z80'; choose from native, x86-64, "),
    ({"cc_jobs": 0}, "the compiler runs at once must be a whole number above 0, not 0"),
    ({"cc_timeout": 0}, "the C compiler's time-out must be a number of seconds above 0, not 0"),
    ({"sanitize": "yes"}, "the sanitize mode must be True or False, not 'yes'"),
    ({"colour": "red"}, "unknown compile option 'colour'"),
    ({"backend_options": {"numpy": {"fast": True}}}, "backend 'numpy' takes no options"),
    ({"backend_options": {"native": {"colour": 1}}}, "backend 'native' has no option 'colour'; its options: "
                                                      "target, sanitize, cc_timeout, cc, cc_jobs"),
    ({"backend_options": {"native": 3}}, "backend 'native' takes its options as a NativeOptions or a dict, "
                                         "not int"),
    ({"backend_options": ["native"]}, "backend options are (backend name, options) pairs, not 'native'"),
])
def test_a_bad_option_is_one_clause_and_a_usage_error(mlp_path, options, message):
    with pytest.raises(OptionError) as caught:
        nncc.compile_model(mlp_path, **options)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)
    assert caught.value.exit_code == 2


def test_a_backend_nobody_registers_is_named(mlp_path):
    from nncc.backends.registry import PluginError

    with pytest.raises(PluginError, match="unknown backend 'tpu'"):
        nncc.compile_model(mlp_path, backend_options={"tpu": {}})
