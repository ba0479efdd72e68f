"""Keyed trust for artifacts' native code: an artifact signed by the user's key (or the
shared NNCC_TRUST_KEY_FILE key) runs natively without --trust-native; one signed by
another key, unsigned, or changed after signing runs its portable plan after one warning
that names the reason. Every user is a separate HOME/XDG_CONFIG_HOME in a tmp dir, each
command a real subprocess; outputs are checked against onnxruntime.

Edited artifacts are made as an attacker would: change a section, then rebuild the section
table with correct checksums (written here from the documented grammar), so only the MAC
can tell."""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import shutil
import stat
import struct
import subprocess
import sys

from blake3 import blake3
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
import pytest

from nncc.native.toolchain import find_toolchain
from tests.oracle import ort_session

pytestmark = pytest.mark.skipif(find_toolchain() is None, reason="no C compiler on this machine: no artifact "
                                "carries native code, so there is nothing to sign")

HEADER = struct.Struct("<8sII16s")
ENTRY = struct.Struct("<4sIQQ32s")
# documented in docs/native.md (Trust) and nncc/plan/format.py (SIGN)
FINGERPRINT_CONTEXT = "nncc 2026 artifact signing key fingerprint"
SEAL_DOMAIN = b"nncc artifact seal 1\n"

PROBE = """
import json, sys
import numpy as np
import nncc
path, feeds, out, trust = sys.argv[1:5]
model = nncc.load(path, trust_native=trust == "1")
np.savez(out, **model.run(dict(np.load(feeds))))
print(json.dumps({"native_partitions": model.native_partitions}))
"""


# -- users, models, artifacts -----------------------------------------------------------


def user(tmp_path: pathlib.Path, name: str, **extra: str) -> dict[str, str]:
    """The environment of one user: their own home, config (key) and cache."""
    home = tmp_path / name
    env = dict(os.environ, HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"),
               NNCC_CACHE_DIR=str(home / "cache"), **extra)
    if "NNCC_TRUST_KEY_FILE" not in extra:
        env.pop("NNCC_TRUST_KEY_FILE", None)
    return env


def key_path(env: dict[str, str]) -> pathlib.Path:
    return pathlib.Path(env["XDG_CONFIG_HOME"]) / "nncc" / "trust.key"


def nncc_cli(env, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nncc", *map(str, args)], env=env, capture_output=True, text=True)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> pathlib.Path:
    rng = np.random.default_rng(7)
    rand = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    inits = [numpy_helper.from_array(rand(48, 32), "w1"), numpy_helper.from_array(rand(32), "b1"),
             numpy_helper.from_array(rand(32, 10), "w2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["l"]),
             helper.make_node("Softmax", ["l"], ["probs"], axis=-1)]
    graph = helper.make_graph(nodes, "signed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 48])],
                              [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [3, 10])], inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    path = tmp_path_factory.mktemp("model") / "mlp.onnx"
    onnx.save(proto, str(path))
    return path


@pytest.fixture(scope="module")
def feeds(model) -> tuple[pathlib.Path, np.ndarray]:
    """(the .npz of inputs, onnxruntime's output for them)."""
    x = np.random.default_rng(3).standard_normal((3, 48)).astype(np.float32)
    path = model.parent / "feeds.npz"
    np.savez(path, x=x)
    session = ort_session(model)
    return path, session.run(None, {"x": x})[0]


@pytest.fixture(scope="module")
def alice(tmp_path_factory, model) -> tuple[dict[str, str], bytes]:
    """Alice's environment and the artifact she compiled (signed with her key)."""
    env = user(tmp_path_factory.mktemp("users"), "alice")
    out = model.parent / "alice.nncc"
    done = nncc_cli(env, "compile", model, "-o", out)
    assert done.returncode == 0, done.stderr
    return env, out.read_bytes()


def load(env, artifact: bytes, feeds, tmp_path, trust: bool = False) -> tuple[int, np.ndarray, str]:
    """Load and run ``artifact`` as the user of ``env``, in a new process: (native
    partitions, output, stderr)."""
    path, out = tmp_path / f"run-{secrets.token_hex(4)}.nncc", tmp_path / f"out-{secrets.token_hex(4)}.npz"
    path.write_bytes(artifact)
    done = subprocess.run([sys.executable, "-c", PROBE, str(path), str(feeds[0]), str(out), "1" if trust else "0"],
                          env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["native_partitions"], np.load(out)["probs"], done.stderr


def assert_matches_onnxruntime(got, feeds):
    np.testing.assert_allclose(got, feeds[1], rtol=1e-4, atol=1e-5)


# -- the artifact's layout, read and rebuilt from the documented grammar -------------------


def sections(raw: bytes) -> list[tuple[bytes, int, bytes]]:
    """[(tag, flags, payload)] in table order."""
    _, _, count, _ = HEADER.unpack_from(raw, 0)
    out = []
    for i in range(count):
        tag, flags, offset, length, _ = ENTRY.unpack_from(raw, HEADER.size + i * ENTRY.size)
        out.append((tag, flags, raw[offset:offset + length]))
    return out


def rebuild(raw: bytes, parts: list[tuple[bytes, int, bytes]]) -> bytes:
    """The artifact with these sections, every checksum correct (what anyone can do)."""
    magic, version, _, producer = HEADER.unpack_from(raw, 0)
    pad = lambda n: b"\0" * (-n % 64)  # noqa: E731
    head_size = HEADER.size + ENTRY.size * len(parts)
    offset = head_size + len(pad(head_size))
    table, body = [], []
    for i, (tag, flags, payload) in enumerate(parts):
        table.append(ENTRY.pack(tag, flags, offset, len(payload), blake3(payload).digest()))
        body.append(payload if i + 1 == len(parts) else payload + pad(len(payload)))
        offset += len(body[-1])
    head = HEADER.pack(magic, version, len(parts), producer) + b"".join(table)
    return head + pad(len(head)) + b"".join(body)


def replace(raw: bytes, tag: bytes, payload: bytes) -> bytes:
    return rebuild(raw, [(t, f, payload if t == tag else p) for t, f, p in sections(raw)])


def flip_bit(payload: bytes, index: int) -> bytes:
    edited = bytearray(payload)
    edited[index] ^= 0x01
    return bytes(edited)


def fingerprint_of(key_file: pathlib.Path) -> str:
    secret = bytes.fromhex(key_file.read_text().strip())
    return blake3(secret, derive_key_context=FINGERPRINT_CONTEXT).digest()[:8].hex()


# -- signing ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_compile_creates_a_private_key_and_signs_with_a_keyed_blake3_mac(alice):
    env, raw = alice
    key_file = key_path(env)
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(key_file.parent.stat().st_mode) == 0o700
    secret = bytes.fromhex(key_file.read_text().strip())
    assert len(secret) == 32
    parts = sections(raw)
    assert [t for t, _, _ in parts] == [b"PROG", b"INLN", b"DATA", b"CODE", b"SIGN"]
    scheme, fingerprint, mac = struct.unpack("<I8s32s", parts[-1][2])
    assert scheme == 1 and fingerprint.hex() == fingerprint_of(key_file)
    # the MAC, recomputed from the documented seal message: header, then every other
    # section's (tag, flags, length, blake3)
    magic, version, _, producer = HEADER.unpack_from(raw, 0)
    message = SEAL_DOMAIN + magic + struct.pack("<I", version) + producer + struct.pack("<I", len(parts) - 1)
    message += b"".join(struct.pack("<4sIQ32s", t, f, len(p), blake3(p).digest()) for t, f, p in parts[:-1])
    assert blake3(message, key=secret).digest() == mac


@pytest.mark.slow
def test_signed_by_your_own_key_runs_natively_without_trust_native(alice, feeds, tmp_path):
    env, raw = alice
    native, got, err = load(env, raw, feeds, tmp_path)
    assert native == 1 and err == ""
    assert_matches_onnxruntime(got, feeds)
    artifact = tmp_path / "mine.nncc"
    artifact.write_bytes(raw)
    run = nncc_cli(env, "run", artifact, "--inputs", feeds[0], "-o", tmp_path / "cli.npz")
    assert run.returncode == 0 and "warning" not in run.stderr
    assert_matches_onnxruntime(np.load(tmp_path / "cli.npz")["probs"], feeds)
    report = json.loads(nncc_cli(env, "inspect", artifact, "--json").stdout)
    assert report["signature"] == {"signed": True, "key_fingerprint": fingerprint_of(key_path(env)),
                                   "trusted": True, "trusted_key": "your key",
                                   "reason": f"signed by your key {fingerprint_of(key_path(env))}"}
    text = nncc_cli(dict(env, COLUMNS="200"), "inspect", artifact).stdout
    assert f"signature: signed by your key {fingerprint_of(key_path(env))}, trusted" in text


@pytest.mark.slow
def test_cached_and_uncached_compiles_write_the_same_signed_bytes(alice, model, tmp_path):
    env, raw = alice
    again, uncached = tmp_path / "again.nncc", tmp_path / "uncached.nncc"
    hit = nncc_cli(env, "compile", model, "-o", again)
    assert hit.returncode == 0 and "cache hit" in hit.stderr  # assembled from the cache entry
    assert nncc_cli(env, "compile", model, "-o", uncached, "--no-cache").returncode == 0
    assert again.read_bytes() == uncached.read_bytes() == raw


def test_python_api_signs_what_it_compiles_and_never_what_it_loads(tmp_path, monkeypatch, model, feeds):
    import nncc

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "bob"))
    compiled = nncc.compile_model(model)
    compiled.save(tmp_path / "bob.nncc")
    assert sections(compiled.to_bytes())[-1][0] == b"SIGN"
    mine = nncc.load(tmp_path / "bob.nncc")
    assert mine.native_partitions == 1
    assert_matches_onnxruntime(mine.run({"x": np.load(feeds[0])["x"]})["probs"], feeds)
    # someone else's artifact, loaded with --trust-native and saved again, is not signed by bob
    unsigned = rebuild(compiled.to_bytes(), sections(compiled.to_bytes())[:-1])
    forced = nncc.load(unsigned, trust_native=True)
    assert forced.native_partitions == 1
    assert b"SIGN" not in [t for t, _, _ in sections(forced.to_bytes())]


def test_an_artifact_without_native_code_is_not_signed_and_makes_no_key(tmp_path, model):
    env = user(tmp_path, "carol")
    out = tmp_path / "portable.nncc"
    assert nncc_cli(env, "compile", model, "-o", out, "--backend", "numpy").returncode == 0
    assert [t for t, _, _ in sections(out.read_bytes())] == [b"PROG", b"INLN", b"DATA"]
    assert not key_path(env).exists()


def test_concurrent_first_uses_agree_on_one_key(tmp_path):
    env = user(tmp_path, "dave")
    script = "from nncc.trust.keys import signing_key; print(signing_key().fingerprint.hex())"
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    prints = {p.communicate()[0].strip() for p in procs}
    assert prints == {fingerprint_of(key_path(env))}
    assert [p.name for p in key_path(env).parent.iterdir()] == ["trust.key"]  # no temp file left


# -- what is not trusted runs its portable plan, with one warning naming why ------------------


@pytest.mark.slow
def test_signed_by_another_users_key_runs_portable_and_names_the_key(alice, feeds, tmp_path):
    env, raw = alice
    bob = user(tmp_path, "bob")
    native, got, err = load(bob, raw, feeds, tmp_path)
    assert native == 0
    assert_matches_onnxruntime(got, feeds)
    assert err.count("nncc: warning:") == 1 and len(err.splitlines()) == 1
    assert f"signed by another key {fingerprint_of(key_path(env))}" in err
    assert "NNCC_TRUST_KEY_FILE" in err and "--trust-native" in err
    assert not key_path(bob).exists()  # checking a signature never makes a key
    forced, got, err = load(bob, raw, feeds, tmp_path, trust=True)
    assert forced == 1 and err == ""
    assert_matches_onnxruntime(got, feeds)
    report = json.loads(nncc_cli(bob, "inspect", _write(tmp_path, raw), "--json").stdout)["signature"]
    assert report["signed"] and not report["trusted"] and report["trusted_key"] is None
    assert report["key_fingerprint"] == fingerprint_of(key_path(env))


def _write(tmp_path, raw: bytes) -> pathlib.Path:
    path = tmp_path / f"a-{secrets.token_hex(4)}.nncc"
    path.write_bytes(raw)
    return path


@pytest.mark.slow  # test_native's untrusted artifact runs portable quickly
def test_unsigned_artifact_runs_portable(alice, feeds, tmp_path):
    env, raw = alice
    stripped = rebuild(raw, sections(raw)[:-1])  # as an older nncc wrote it
    native, got, err = load(env, stripped, feeds, tmp_path)
    assert native == 0 and err.count("nncc: warning:") == 1
    assert "it is not signed" in err and "nncc compile" in err and "--trust-native" in err
    assert_matches_onnxruntime(got, feeds)
    run = nncc_cli(env, "run", _write(tmp_path, stripped), "--random-inputs")
    assert run.returncode == 0 and run.stderr.count("nncc: warning:") == 1 and "not signed" in run.stderr
    report = json.loads(nncc_cli(env, "inspect", _write(tmp_path, stripped), "--json").stdout)["signature"]
    assert report == {"signed": False, "key_fingerprint": None, "trusted": False, "trusted_key": None,
                      "reason": "it is not signed"}


@pytest.mark.parametrize("edit", ["mac bit", "code bit", *(pytest.param(edit, marks=pytest.mark.slow)
                                                          for edit in ("prog workspace", "data bit", "producer"))])
def test_any_change_after_signing_fails_the_mac(alice, feeds, tmp_path, edit):
    env, raw = alice
    parts = dict((t, p) for t, _, p in sections(raw))
    if edit == "mac bit":
        changed = replace(raw, b"SIGN", flip_bit(parts[b"SIGN"], 4 + 8 + 5))  # scheme, fingerprint, MAC
    elif edit == "code bit":
        changed = replace(raw, b"CODE", flip_bit(parts[b"CODE"], len(parts[b"CODE"]) // 2))
    elif edit == "prog workspace":  # another scratch size: a smaller one would make the code overrun it
        program = json.loads(parts[b"PROG"])
        program["payloads"][0][5]["calls"][0][4] ^= 64
        changed = replace(raw, b"PROG", json.dumps(program, sort_keys=True, separators=(",", ":")).encode())
    elif edit == "data bit":
        changed = replace(raw, b"DATA", flip_bit(parts[b"DATA"], 0))
    else:
        changed = flip_bit(raw, 16)  # the producer version's first character
    assert changed != raw
    native, got, err = load(env, changed, feeds, tmp_path)
    assert native == 0, "changed native code was loaded"
    assert err.count("nncc: warning:") == 1
    assert f"MAC does not verify under your key {fingerprint_of(key_path(env))}" in err
    if edit != "data bit":  # the weights changed: the output does too
        assert_matches_onnxruntime(got, feeds)


def test_a_bit_flipped_without_fixing_its_checksum_refuses_the_file(alice, tmp_path):
    env, raw = alice
    offset, length = next((o, n) for t, _, o, n, _ in
                          (ENTRY.unpack_from(raw, HEADER.size + i * ENTRY.size) for i in range(5)) if t == b"SIGN")
    damaged = bytearray(raw)
    damaged[offset + length - 1] ^= 0x80
    path = _write(tmp_path, bytes(damaged))
    run = nncc_cli(env, "run", path, "--random-inputs")
    assert run.returncode == 2
    [line] = run.stderr.strip().splitlines()
    assert line.startswith(f"nncc: error: {path}: section SIGN fails its checksum")


# -- the key file ----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_key_file_others_can_read_is_refused_in_one_line(alice, model, tmp_path):
    env, raw = alice
    mallory = user(tmp_path, "mallory")
    assert nncc_cli(mallory, "compile", model, "-o", tmp_path / "m.nncc").returncode == 0
    key_path(mallory).chmod(0o640)
    for args in (["run", _write(tmp_path, raw), "--random-inputs"], ["compile", model, "-o", tmp_path / "n.nncc"]):
        done = nncc_cli(mallory, *args)
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
        assert done.stderr.startswith(f"nncc: error: the key file {key_path(mallory)} is readable or writable "
                                      "by others (mode 0640); run chmod 600")
    assert not (tmp_path / "n.nncc").exists()
    inspect = json.loads(nncc_cli(mallory, "inspect", _write(tmp_path, raw), "--json").stdout)["signature"]
    assert not inspect["trusted"] and "readable or writable by others" in inspect["reason"]
    key_path(mallory).write_text("not a key\n")
    key_path(mallory).chmod(0o600)
    done = nncc_cli(mallory, "compile", model, "-o", tmp_path / "n.nncc")
    assert done.returncode == 2 and "does not hold a key (64 hex digits)" in done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another user")
def test_a_key_file_owned_by_someone_else_is_refused(alice, tmp_path):
    env, raw = alice
    eve = user(tmp_path, "eve")
    key_path(eve).parent.mkdir(parents=True)
    shutil.copy(key_path(env), key_path(eve))
    key_path(eve).chmod(0o600)
    os.chown(key_path(eve), 65534, 65534)
    done = nncc_cli(eve, "run", _write(tmp_path, raw), "--random-inputs")
    assert done.returncode == 2 and "is owned by user id 65534, not by you" in done.stderr


@pytest.mark.slow  # two users, five CLI processes and a native compile
def test_a_team_key_is_shared_through_nncc_trust_key_file(tmp_path, model, feeds):
    team_key = secrets.token_hex(32) + "\n"
    copies = {}
    for name in ("ann", "ben"):  # each member keeps a private copy
        copies[name] = tmp_path / f"{name}-team.key"
        copies[name].write_text(team_key)
        copies[name].chmod(0o600)
    ann = user(tmp_path, "ann", NNCC_TRUST_KEY_FILE=str(copies["ann"]))
    ben = user(tmp_path, "ben", NNCC_TRUST_KEY_FILE=str(copies["ben"]))
    out = tmp_path / "team.nncc"
    assert nncc_cli(ann, "compile", model, "-o", out).returncode == 0
    assert not key_path(ann).exists()  # the team key signs; no personal key is made
    team_print = fingerprint_of(copies["ann"])
    assert sections(out.read_bytes())[-1][2][4:12].hex() == team_print
    native, got, err = load(ben, out.read_bytes(), feeds, tmp_path)
    assert native == 1 and err == ""
    assert_matches_onnxruntime(got, feeds)
    report = json.loads(nncc_cli(ben, "inspect", out, "--json").stdout)["signature"]
    assert report["trusted"] and report["trusted_key"] == "the NNCC_TRUST_KEY_FILE key"
    # without the team key, ben's own key does not vouch for it
    alone = user(tmp_path, "ben")
    native, _, err = load(alone, out.read_bytes(), feeds, tmp_path)
    assert native == 0 and f"signed by another key {team_print}" in err
    missing = nncc_cli(user(tmp_path, "ben", NNCC_TRUST_KEY_FILE=str(tmp_path / "nowhere.key")),
                       "compile", model, "-o", tmp_path / "x.nncc")
    assert missing.returncode == 2
    assert f"the NNCC_TRUST_KEY_FILE file {tmp_path / 'nowhere.key'} does not exist" in missing.stderr
