"""Compiling for the prepare layer: options from their plain form, and a compile from the
very bytes that were hashed into the token, linking native code from the cache's kernel
objects when a cache is open."""

from __future__ import annotations

import os

from nncc.compiler import CompileOptions, compile_graph
from nncc.errors import ModelFormatError
from nncc.settings import build_settings


def compile_options(options: dict, build=None):
    """CompileOptions from keyword options or their JSON form (lists become tuples): a
    backend's own options (``target=``) go into its record. ``build``: the backends' option
    records the command's settings resolved (nncc.settings.build_settings), the base of a
    backend's record the options do not give whole (their JSON form does); None resolves
    them now, only when one is missing."""
    options = {k: tuple(v) if isinstance(v, list) else v for k, v in options.items()}
    return CompileOptions.from_keywords(options, build_settings if build is None else lambda: build)


def compile_source(source, opts, cache=None):
    """The Plan of ``source`` (a ModelSource), compiled from the bytes hashed into its
    token; with ``cache``, native code is linked from its kernel objects. Below float32,
    its deviation is measured first (nncc.preparing.calibration)."""
    from nncc.frontend.onnx import parse_model  # lazy: onnx

    from nncc.preparing.calibration import checked  # lazy: the executor and numpy, not on a cache hit

    path = source.path
    objects = None
    if cache is not None:
        from nncc.cache.objects import CacheObjects  # lazy: start-up

        objects = CacheObjects(cache)

    def build(options):  # each compile parses again: the passes rewrite the graph they are given
        try:
            graph = parse_model(source.bytes, base_dir=os.path.dirname(os.path.abspath(path)))
        except ModelFormatError as exc:
            raise ModelFormatError(f"{os.fspath(path)} is not a valid ONNX model: {exc}") from None
        return compile_graph(graph, options, objects)

    return checked(build, opts)  # a precision below float32: its deviation measured, the tolerance held
