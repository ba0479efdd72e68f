"""Native code loaded from memory: every load gets its own library, and a process that
loads many models keeps no descriptor per load (the memory file is closed once mapped)."""

from __future__ import annotations

import os

import numpy as np
from onnx import TensorProto, helper, numpy_helper
import pytest

import nncc
from nncc.native.toolchain import find_toolchain
from tests.oracle import ort_run

pytestmark = pytest.mark.skipif(find_toolchain() is None, reason="no C compiler: nothing native to load")


def _conv_model(seed: int) -> bytes:
    """A 3x3 convolution whose channel count is the seed's: each seed's native code differs
    (a library loaded for another seed would compute the wrong geometry)."""
    rng = np.random.default_rng(seed)
    cout = 8 * (seed + 1)
    w = numpy_helper.from_array(rng.standard_normal((cout, 4, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "conv",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 10, 10])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, 10, 10])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.slow
def test_each_load_runs_its_own_code_and_keeps_no_descriptor(tmp_path):
    x = np.random.default_rng(0).standard_normal((1, 4, 10, 10)).astype(np.float32)
    artifacts = []
    for seed in range(3):
        (tmp_path / f"conv{seed}.onnx").write_bytes(_conv_model(seed))
        artifacts.append(nncc.compile_model(tmp_path / f"conv{seed}.onnx").to_bytes())
    before = _descriptors()
    for round_ in range(4):  # the memory file's number comes round again: each load is still its own
        for seed, artifact in enumerate(artifacts):
            model = nncc.load(artifact, trust_native=True)
            assert model.native_partitions == 1
            expected = ort_run(_conv_model(seed), {"x": x})[0]
            np.testing.assert_allclose(model.run({"x": x})["y"], expected, rtol=1e-4, atol=1e-4)
            del model
    assert _descriptors() <= before  # twelve loads, no descriptor kept for any of them
