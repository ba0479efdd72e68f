"""Rich rendering of an inspect report."""

from __future__ import annotations

from rich.markup import escape
from rich.tree import Tree

from nncc.cli.output import console, verbosity
from nncc.preparing.deviation import PLAN_KEY, summary
from nncc.util.units import format_bytes


def print_report(report: dict) -> None:
    tree = Tree(f"[bold]{report['path']}[/]  (format {report['format_version']}, nncc {report['producer']})")
    opts = report["options"]
    dims = "".join(f" --dim {k}={v}" for k, v in (opts.get("dims") or {}).items())
    precision = f" --precision {opts['precision']}" if opts.get("precision") else ""  # only when not f32
    tree.add(f"options: preference={opts.get('preference')} -O{opts.get('opt_level')} "
             f"backends={','.join(opts.get('backends', []))}{dims}{precision}")
    if opts.get(PLAN_KEY):  # a precision below float32: what it costs, measured at compile time
        tree.add(escape(summary(opts[PLAN_KEY])))
    if report.get("stage"):
        tree.add(f"stage: {report['stage']}")
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
        for group in report["fallback_groups"]:  # each node: -v, or --json
            ops = ", ".join(f"{op}×{n}" for op, n in group["ops"].items())
            fb.add(f"{group['nodes']} node{'s' if group['nodes'] > 1 else ''}: {escape(group['reason'])} ({ops})")
        if verbosity() > 0:
            for f in report["fallbacks"]:
                fb.add(f"{f['op']} {escape(_node_label(f['node']))}: {escape(f['reason'])}")
        if any("static" in g["reason"] for g in report["fallback_groups"]) and _symbolic(report):
            fb.add(f"[dim]fixing {', '.join(_symbolic(report))} with --dim NAME=SIZE gives static shapes[/]")
    for dim, found in (report.get("sample_axes") or {}).items():
        if found["sample_axis"]:
            tree.add(f"[green]{escape(dim)}: a sample axis[/] (runs natively at any size, through the plan for "
                     f"{escape(dim)}=1, one run per sample)")
        else:
            tree.add(f"{escape(dim)}: no sample axis ({escape(found['reason'])})")
    c = report["constants"]
    line = (f"constants: {c['inline']['count']} inline ({format_bytes(c['inline']['bytes'])}), "
            f"{c['referenced']['count']} referenced ({format_bytes(c['referenced']['bytes'])})")
    splat = c.get("splat")
    if splat and splat["count"]:
        line += f", {splat['count']} splat ({format_bytes(splat['bytes'])} for {format_bytes(splat['expanded_bytes'])})"
    tree.add(line)
    if report.get("dynamic_values"):
        tree.add(f"peak activation memory: unknown for dynamic shapes ({report['dynamic_values']} values are "
                 f"sized at run time; {format_bytes(report['peak_activation_bytes'])} planned ahead)")
    else:
        tree.add(f"peak activation memory: {format_bytes(report['peak_activation_bytes'])}")
    if report.get("native_code_bytes"):
        built = opts.get("native") or {}
        tree.add(f"native code: {format_bytes(report['native_code_bytes'])} "
                 f"({built.get('version', '?')}, target {built.get('target', '?')}, "
                 f"linked from {len(built.get('objects') or [])} objects)")
    elif opts.get("native_error"):
        tree.add(f"[yellow]native code: none ({escape(opts['native_error'])})[/]")
    if report.get("native_off"):
        tree.add(f"[yellow]native code: off here ({escape(report['native_off'])})[/]")
    signature = report.get("signature")
    if signature is not None:
        tree.add(_signature_line(signature, bool(report.get("native_code_bytes"))))
    if report.get("artifact_bytes") is not None:
        tree.add(f"artifact size: {format_bytes(report['artifact_bytes'])}")
    if report.get("cache") is not None:
        _add_cache(tree, report["cache"])
    console().print(tree)


def _add_cache(tree: Tree, cache: dict) -> None:
    """Whether the model, with these options, has a cache entry; its token either way (the
    one `nncc run` stores under and `nncc cache pull` takes)."""
    where = escape(cache["directory"])
    if cache["cached"]:
        hits = f"{cache['hits']} hit{'' if cache['hits'] == 1 else 's'}"
        node = tree.add(f"[green]cache: cached[/] ({cache['stage'] or '-'} stage, origin "
                        f"{escape(cache['origin'] or '-')}, {hits}, {format_bytes(cache['size'])})")
    elif cache["cached"] is None:
        node = tree.add(f"[yellow]cache: not checked ({escape(cache['detail'] or '')})[/]")
    else:
        node = tree.add("cache: not cached" + (f" ({escape(cache['detail'])})" if cache["detail"] else ""))
    node.add(f"token {cache['token']}")
    node.add(f"in {where}")


def _signature_line(signature: dict, has_code: bool) -> str:
    from rich.markup import escape  # lazy: rich

    reason = escape(signature["reason"])
    if signature["trusted"]:
        return f"[green]signature: {reason}, trusted[/]"
    if not signature["signed"] and not has_code:
        return "signature: none (no native code to trust)"
    return f"[yellow]signature: not trusted, {reason}[/]"


def _node_label(node: str) -> str:
    """A fallback's node: its name quoted, or, for an unnamed node, the first output the
    plan names it by (nncc/partition.py)."""
    return f"({node})" if node.startswith("output '") else repr(node)


def _symbolic(report: dict) -> list[str]:
    """The symbolic dimension names of the inputs, in order."""
    names: list[str] = []
    for entry in report["inputs"]:
        for dim in entry.get("shape") or ():
            if isinstance(dim, str) and dim not in names:
                names.append(dim)
    return names
