"""The command line of a report script of tests/bench (ncu_table.py, variants_summary.py): one file
in, a table out, or an exit status after saying why not."""

from __future__ import annotations

import sys
from typing import Callable


def probe_lines(text: str, prefix: str, fields: int, hex_first: bool = False) -> list[tuple[int, ...]]:
    """The integer fields of each line of text that starts with `prefix ` (a probe build's lines among
    the bench's), the first in hex where hex_first says so. A ValueError naming the line where one
    has another count of fields or a field that is not an integer."""
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.startswith(prefix + " "):
            continue
        items = line.split()[1:]
        if len(items) != fields:
            raise ValueError(f"line {number}: {len(items)} fields, a {prefix} line has {fields}: {line.strip()}")
        try:
            rows.append(tuple(int(f, 16 if hex_first and k == 0 else 10) for k, f in enumerate(items)))
        except ValueError:
            kind = "a hex id, then integers" if hex_first else "integers"
            raise ValueError(f"line {number}: a {prefix} line holds {kind}: {line.strip()}") from None
    return rows


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
