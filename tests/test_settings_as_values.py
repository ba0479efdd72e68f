"""The core receives its settings as values: a command resolves them once, and the compile
options carry how native code is built (sanitize mode, compiler time-out), in the native
backend's own record, to the C toolchain, which reads no setting itself (the floors'
contract keeps it so)."""

from __future__ import annotations

import pytest

from tests.conftest import FIXTURES

MLP = FIXTURES / "mlp.onnx"


def test_the_toolchains_own_time_out_is_the_settings_default(monkeypatch):
    from nncc.native.toolchain import DEFAULT_TIMEOUT
    from nncc.settings import resolve

    monkeypatch.delenv("NNCC_CC_TIMEOUT", raising=False)
    resolved = resolve("native.cc_timeout")
    assert resolved.source == "default" and resolved.value == DEFAULT_TIMEOUT


def test_the_compile_options_carry_the_native_settings_to_the_toolchain(monkeypatch):
    from nncc.backends.registry import get_backend
    from nncc.preparing.token import token_context
    from nncc.native.toolchain import SANITIZE_FLAGS, find_toolchain
    from nncc.preparing.compiling import compile_options
    from nncc.backends.native_options import NativeOptions

    if find_toolchain() is None:
        pytest.skip("no C compiler on this machine: no toolchain to carry the settings to")
    monkeypatch.setenv("NNCC_NATIVE_SANITIZE", "yes")
    monkeypatch.setenv("NNCC_CC_TIMEOUT", "7")
    opts = compile_options({})  # no resolved record given: resolved now, from the environment
    toolchain = get_backend("native").for_compile(opts).toolchain  # the backend finds the compiler
    native_record = opts.options_of("native")
    assert (native_record.sanitize, native_record.cc_timeout) == (True, 7.0)
    assert toolchain.sanitize and toolchain.timeout == 7.0 and set(SANITIZE_FLAGS) <= set(toolchain.flags)
    # the token's toolchain key is the one a sanitizing toolchain has, whoever asked for it
    assert toolchain.key() == find_toolchain(sanitize=True).key() != find_toolchain(sanitize=False).key()
    # a resolved record wins over the environment
    plain = compile_options({}, (("native", NativeOptions(sanitize=False, cc_timeout=7.0)),))
    native = get_backend("native")
    assert not native.for_compile(plain).toolchain.sanitize and token_context(plain) != token_context(opts)
    # the time-out changes no code: not in the token
    resolved = (("native", NativeOptions(sanitize=False, cc_timeout=300.0)),)
    assert token_context(plain) == token_context(compile_options({}, resolved))


def test_a_command_that_prepares_many_times_resolves_its_settings_once(tmp_path, monkeypatch):
    """``nncc bench`` prepares a model many times: a setting changed after its first
    prepare of each kind changes nothing for it, while a new command reads it (here: a
    bad value, refused)."""
    import nncc
    from nncc.model import preparer
    from nncc.settings import SettingError

    prepare = preparer()
    cache = tmp_path / "cache"
    prepare(MLP, use_cache=False, backends=["numpy"])
    assert prepare(MLP, cache_dir=cache, backends=["numpy"])[1].outcome == "miss"
    monkeypatch.setenv("NNCC_CACHE_MAX_SIZE", "banana")
    monkeypatch.setenv("NNCC_NATIVE_SANITIZE", "maybe")
    assert prepare(MLP, use_cache=False, backends=["numpy"])[1].outcome == "disabled"
    assert prepare(MLP, cache_dir=cache, backends=["numpy"])[1].outcome == "hit"
    with pytest.raises(SettingError, match="NNCC_CACHE_MAX_SIZE"):
        nncc.prepare(MLP, cache_dir=cache, backends=["numpy"])
    monkeypatch.delenv("NNCC_CACHE_MAX_SIZE")
    with pytest.raises(SettingError, match="NNCC_NATIVE_SANITIZE"):
        nncc.prepare(MLP, use_cache=False, backends=["numpy"])
