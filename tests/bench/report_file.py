"""The command line of a report script of tests/bench (ncu_table.py, variants_summary.py): one file
in, a table out, or an exit status after saying why not."""

from __future__ import annotations

import sys
from typing import Callable


def report_main(argv: list[str], prog: str, what: str, render: Callable[[str], str]) -> int:
    """Prints render(the text of the file argv[1] names) and returns 0. Returns 2 after the usage
    line when argv is not one argument; 1 after the OS's reason when the file cannot be read, or
    after render's ValueError (why the file is not what prog reads)."""
    if len(argv) != 2:
        print(f"usage: python3 tests/bench/{prog}.py {what}", file=sys.stderr)
        return 2
    try:
        with open(argv[1], encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        print(f"{prog}: {argv[1]}: {e.strerror}", file=sys.stderr)
        return 1
    try:
        out = render(text)
    except ValueError as e:
        print(f"{prog}: {argv[1]}: {e}", file=sys.stderr)
        return 1
    print(out)
    return 0
