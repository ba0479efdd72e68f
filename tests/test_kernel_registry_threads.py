"""The kernel registry loads its families once, for every thread: a thread that resolves an
op while another is still importing the families waits for them (a dynamic model's plans
loaded ahead on a thread beside the caller's own prepare do exactly this), instead of seeing
a half-filled registry and refusing a valid cached plan."""

import subprocess
import sys

_CHILD = r"""
import importlib.abc, sys, threading, time

from nncc.kernels import registry

second_started = threading.Event()


class HoldFirstFamily(importlib.abc.MetaPathFinder):
    # Holds the loading thread at the first family's import, before it registers anything,
    # until the second thread has begun its own resolve.
    def find_spec(self, name, path=None, target=None):
        if name == "nncc.kernels.activation" and threading.current_thread().name == "loader":
            second_started.wait(10)
            time.sleep(0.3)
        return None


sys.meta_path.insert(0, HoldFirstFamily())
results = {}


def resolve(op, key):
    try:
        results[key] = registry.resolve(op, "", 17).op_type
    except Exception as error:
        results[key] = f"{type(error).__name__}: {error}"


loader = threading.Thread(target=resolve, args=("Conv", "loader"), name="loader")
loader.start()
time.sleep(0.05)
second_started.set()
resolve("Relu", "second")
loader.join()
print(results["loader"], results["second"])
"""


def test_an_op_resolved_while_another_thread_loads_the_families_is_found():
    done = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["Conv", "Relu"], done.stdout + done.stderr
