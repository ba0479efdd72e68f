"""Which backends exist: the built-ins, entry-point plugins and ``--plugin`` modules.

Plugins are Python modules the *user* names (on the command line or by installing a
package with an ``nncc.backends`` entry point); nothing is ever imported because a model
or a compiled plan names it.
"""

from __future__ import annotations

import importlib

from nncc.backends.base import Backend
from nncc.backends.native import NativeBackend
from nncc.backends.portable import PortableBackend
from nncc.errors import NnccError

_BACKENDS: dict[str, Backend] = {}
_PLUGINS: dict[str, str] = {}  # module name -> version, part of the cache key
_entry_points_loaded = False


class PluginError(NnccError):
    exit_code = 2


PORTABLE = "numpy"  # the built-in portable backend, also every compile's fallback


def register_backend(backend: Backend | type[Backend]) -> Backend:
    """Register a backend under its name and its aliases."""
    instance = backend() if isinstance(backend, type) else backend
    for name in (instance.name, *instance.aliases):
        _BACKENDS[name] = instance
    return instance


def ensure_builtins() -> None:
    if PORTABLE not in _BACKENDS:
        register_backend(PortableBackend)
        register_backend(NativeBackend)  # its toolchain is found per compile (for_compile)


def portable_backend() -> Backend:
    """The backend that runs whatever no other backend takes."""
    return get_backend(PORTABLE)


def get_backend(name: str) -> Backend:
    """A registered backend (by name or alias); installed packages' entry points are read
    only for a name that is not registered yet."""
    ensure_builtins()
    if name not in _BACKENDS:
        load_entry_points()
    if name not in _BACKENDS:
        raise PluginError(f"unknown backend {name!r}; available: {', '.join(sorted(_BACKENDS))}")
    return _BACKENDS[name]


def loaded_backend(name: str) -> Backend | None:
    """The backend registered as ``name`` in this process, or None; nothing is imported
    (a plan names the backend of each partition, and a plan never makes nncc import)."""
    ensure_builtins()
    return _BACKENDS.get(name)


def slow_backends(names) -> tuple[str, ...]:
    """The backends among ``names`` that declare themselves slow to build (registered in
    this process; a name nothing registers is not slow)."""
    return tuple(name for name in names
                 if getattr(loaded_backend(name), "slow_to_build", False))


def registered_backends() -> list[Backend]:
    """Every backend registered in this process once (nothing is imported)."""
    ensure_builtins()
    return [backend for name, backend in sorted(_BACKENDS.items()) if backend.name == name]


def available_backends() -> list[Backend]:
    """Every registered backend once (an alias is not another backend)."""
    ensure_builtins()
    load_entry_points()
    return [_BACKENDS[name] for name in sorted(_BACKENDS) if _BACKENDS[name].name == name]


def load_plugin(module_name: str) -> None:
    """Import a plugin module; on import it registers kernels and/or backends."""
    if module_name in _PLUGINS:
        return
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise PluginError(f"cannot load plugin {module_name!r}: {exc}") from None
    ensure_builtins()
    hook = getattr(module, "register", None)
    if callable(hook):
        hook()
    _PLUGINS[module_name] = str(getattr(module, "__version__", "0"))


ENTRY_POINT_GROUP = "nncc.backends"


def load_entry_points() -> None:
    """Register the backends installed packages declare in the entry-point group
    ``nncc.backends`` (an entry names a Backend class, or a callable that registers
    backends and kernels). Lazy: importing importlib.metadata and reading every installed
    distribution's metadata costs 20-30 ms, so this runs only when a backend that is not
    built in is asked for, or all are listed; a command on the built-in backends (a cache
    hit, a run) never pays it."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    from importlib.metadata import entry_points  # lazy: plugin

    for entry in entry_points(group=ENTRY_POINT_GROUP):
        try:
            target = entry.load()
        except Exception as exc:  # a broken third-party package must not break nncc
            raise PluginError(f"cannot load backend entry point {entry.name!r}: {exc}") from None
        if isinstance(target, type) and issubclass(target, Backend):
            register_backend(target)
        elif callable(target):
            target()
        _PLUGINS[f"entry-point:{entry.name}"] = entry.value


def loaded_plugins() -> dict[str, str]:
    return dict(sorted(_PLUGINS.items()))
