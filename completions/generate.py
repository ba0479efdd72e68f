"""Write nncc's shell completion scripts (bash, zsh, fish) into this folder.

    python completions/generate.py [OUT_DIR]

Each script is what `_NNCC_COMPLETE=<shell>_source nncc` prints -- click's shell completion
for the `nncc` command tree -- behind a header comment. The scripts hold no command
names: on every TAB they ask `nncc` itself (with _NNCC_COMPLETE=<shell>_complete), so
completions always match the installed nncc, including `nncc cache rm` tokens read from
the cache index. Regenerate them when click changes its templates
(tests/test_shell.py::test_completion_scripts_are_fresh fails when they are stale).
"""

from __future__ import annotations

import pathlib
import sys

SCRIPTS = {"bash": "nncc.bash", "zsh": "_nncc", "fish": "nncc.fish"}
PROG = "nncc"
COMPLETE_VAR = "_NNCC_COMPLETE"


def header(shell: str) -> str:
    return (f"# {shell} completion for nncc: `{COMPLETE_VAR}={shell}_source nncc`, written by\n"
            f"# completions/generate.py. Do not edit; install as README.md says (Shell completion).\n")


def script(shell: str) -> str:
    from click.shell_completion import get_completion_class

    from nncc.cli.main import cli

    source = get_completion_class(shell)(cli, {}, PROG, COMPLETE_VAR).source()
    if not source.endswith("\n"):
        source += "\n"
    first, _, rest = source.partition("\n")
    if first.startswith("#compdef"):  # zsh reads this first line to autoload from $fpath
        return f"{first}\n{header(shell)}{rest}"
    return header(shell) + source


def generate(out_dir: pathlib.Path) -> list[pathlib.Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for shell, name in SCRIPTS.items():
        path = out_dir / name
        path.write_text(script(shell), encoding="utf-8")
        written.append(path)
    return written


def main(argv: list[str]) -> None:
    out_dir = pathlib.Path(argv[0]) if argv else pathlib.Path(__file__).resolve().parent
    for path in generate(out_dir):
        print(path)


if __name__ == "__main__":
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))  # this checkout's nncc
    main(sys.argv[1:])
