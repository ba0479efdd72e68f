"""Rich rendering of an inspect report."""

from __future__ import annotations

from rich.tree import Tree

from nncc.cli.output import console
from nncc.util.units import format_bytes


def print_report(report: dict) -> None:
    tree = Tree(f"[bold]{report['path']}[/]  (format {report['format_version']}, nncc {report['producer']})")
    opts = report["options"]
    tree.add(f"options: preference={opts.get('preference')} -O{opts.get('opt_level')} "
             f"backends={','.join(opts.get('backends', []))}")
    io = tree.add("inputs / outputs")
    for kind in ("inputs", "outputs"):
        for v in report[kind]:
            if "kind" in v:  # a sequence or optional of elements of this dtype
                io.add(f"{kind[:-1]} {v['name']}: {v['kind']}({v['dtype']})")
            else:
                io.add(f"{kind[:-1]} {v['name']}: {v['dtype']}{v['shape']}")
    parts = tree.add(f"{len(report['partitions'])} partition(s), {report['instructions']} instructions")
    for p in report["partitions"]:
        ops = ", ".join(f"{op}×{n}" for op, n in p["ops"].items())
        how = " [green](native code)[/]" if p.get("native") else ""
        parts.add(f"#{p['index']} [cyan]{p['backend']}[/] {p['entry']}{how}: {p['nodes']} nodes ({ops})")
    if report["fallbacks"]:
        fb = tree.add(f"[yellow]{len(report['fallbacks'])} fallback node(s)[/]")
        for f in report["fallbacks"]:
            fb.add(f"{f['op']} {f['node']!r}: {f['reason']}")
    c = report["constants"]
    line = (f"constants: {c['inline']['count']} inline ({format_bytes(c['inline']['bytes'])}), "
            f"{c['referenced']['count']} referenced ({format_bytes(c['referenced']['bytes'])})")
    splat = c.get("splat")
    if splat and splat["count"]:
        line += f", {splat['count']} splat ({format_bytes(splat['bytes'])} for {format_bytes(splat['expanded_bytes'])})"
    tree.add(line)
    tree.add(f"peak activation memory: {format_bytes(report['peak_activation_bytes'])}")
    if report.get("native_code_bytes"):
        built = opts.get("native") or {}
        tree.add(f"native code: {format_bytes(report['native_code_bytes'])} "
                 f"({built.get('version', '?')}, target {built.get('target', '?')}, "
                 f"linked from {len(built.get('objects') or [])} objects)")
    elif opts.get("native_error"):
        tree.add(f"[yellow]native code: none ({opts['native_error']})[/]")
    if report.get("artifact_bytes") is not None:
        tree.add(f"artifact size: {format_bytes(report['artifact_bytes'])}")
    console().print(tree)
