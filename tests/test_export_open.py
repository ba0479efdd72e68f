"""What an exported library's open does for the first run: the model's workspace is mapped and
faulted in at open, so the first run takes no more page faults than a later one (it used to
fault the workspace in a 4 KiB page at a time), and one of 1 MiB or more in transparent huge
pages where the system grants them on request."""

from __future__ import annotations

import pathlib
import re
import subprocess

import numpy as np
import pytest

from tests.export_build import compiler, export
from tests.conftest import ROOT
from tests.models import GraphBuilder

pytestmark = [pytest.mark.skipif(compiler() is None, reason="no C compiler: nothing can be exported or linked"),
              pytest.mark.slow]  # every test builds, links or runs a C library

PROGRAM = ROOT / "tests" / "export_first_run_faults.c"
PAGE = 4096


def wide_convnet(path):
    """Convolutions over a 96x96 image with 32 channels: intermediate tensors of 1.2 MB each,
    which the native code keeps in its workspace."""
    b = GraphBuilder(name="wide", seed=3)
    x = b.input([1, 3, 96, 96])
    y = b.node("Relu", [b.node("Conv", [x, b.weight([32, 3, 3, 3])], pads=[1, 1, 1, 1])])
    z = b.node("Relu", [b.node("Conv", [y, b.weight([32, 32, 3, 3])], pads=[1, 1, 1, 1])])
    y = b.node("Add", [b.node("Conv", [z, b.weight([32, 32, 1, 1])]), y])
    b.output(b.node("Flatten", [b.node("GlobalAveragePool", [y])]))
    return b.save(path)


def faults(tmp_path, name):
    """(first run, second run, open) page faults and the huge pages' KiB the open added, of
    the model exported from tmp_path/NAME.onnx, opened with one thread."""
    export(tmp_path / f"{name}.onnx", tmp_path / name, cache=tmp_path / "cache")
    exe = tmp_path / "faults"
    done = subprocess.run([compiler(), "-O1", "-std=c11", f"-DPFX={name}", "-include",
                           str(tmp_path / name / f"{name}.h"), str(PROGRAM), str(tmp_path / name / f"lib{name}.a"),
                           "-lm", "-lpthread", "-o", str(exe)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    done = subprocess.run([str(exe), str(tmp_path / name / f"{name}.weights")], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return tuple(map(int, done.stdout.split()))


def test_the_first_run_faults_no_more_pages_than_a_later_one(tmp_path):
    wide_convnet(tmp_path / "wide.onnx")
    first, second, _, _ = faults(tmp_path, "wide")
    intermediate_pages = 32 * 96 * 96 * 4 // PAGE  # one of the model's 1.2 MB tensors
    # a workspace faulted a page at a time would cost the first run hundreds more
    assert first <= second + intermediate_pages // 10, (first, second, intermediate_pages)


def huge_pages_on_request() -> bool:
    """Whether this kernel grants transparent huge pages to a mapping that asks (madvise)."""
    setting = pathlib.Path("/sys/kernel/mm/transparent_hugepage/enabled")
    chosen = re.search(r"\[(\w+)\]", setting.read_text()) if setting.exists() else None
    return chosen is not None and chosen.group(1) in ("always", "madvise")


def huge_page_fallbacks() -> int:
    """How many times this kernel had no huge page for a mapping that could take one."""
    for line in pathlib.Path("/proc/vmstat").read_text().splitlines():
        name, _, value = line.partition(" ")
        if name == "thp_fault_fallback":
            return int(value)
    return 0


@pytest.mark.skipif(not huge_pages_on_request(), reason="this kernel grants no transparent huge pages on request")
def test_a_workspace_between_1_and_2_mib_takes_one_huge_page(tmp_path):
    """One intermediate tensor of 1.1 MiB (32 channels of 96x96): its 288 pages of 4 KiB are
    one 2 MiB page, faulted in by the open at once."""
    b = GraphBuilder(name="onewide", seed=4)
    x = b.input([1, 3, 96, 96])
    y = b.node("Relu", [b.node("Conv", [x, b.weight([32, 3, 3, 3])], pads=[1, 1, 1, 1])])
    b.output(b.node("Flatten", [b.node("GlobalAveragePool", [y])]))
    b.save(tmp_path / "onewide.onnx")
    fallbacks = huge_page_fallbacks()
    first, second, opened, huge_kib = faults(tmp_path, "onewide")
    intermediate_pages = 32 * 96 * 96 * 4 // PAGE
    if huge_kib < 2048 and huge_page_fallbacks() > fallbacks:
        pytest.skip("the kernel found no free huge page meanwhile (its thp_fault_fallback count rose)")
    assert huge_kib >= 2048, (huge_kib, opened)
    assert opened < intermediate_pages // 4, (opened, intermediate_pages)
    assert first <= second + intermediate_pages // 10, (first, second)
