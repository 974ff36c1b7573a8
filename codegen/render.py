"""The Jinja2 environment that turns a Spec into C and CUDA sources.

Same input, same bytes out: templates see only the spec (and the chat strings), iteration is in
table order, there are no timestamps, and files are written only when their bytes change so that
make does not rebuild what did not change.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import jinja2

# Bumped whenever generated code and runtime/ingot_version.h must change together; the generated
# model_config.h refuses to compile against a runtime of another version.
GENERATOR_VERSION = 2

REPO_ROOT = Path(__file__).resolve().parent.parent
TEMPLATE_DIR = REPO_ROOT / "templates"


def c_string(s: str) -> str:
    """A C string literal holding the UTF-8 bytes of s, with every non-printable byte escaped.

    Octal escapes are always three digits so a following digit cannot extend them."""
    out = ['"']
    for b in s.encode("utf-8"):
        ch = chr(b)
        if ch == '"' or ch == "\\":
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif 0x20 <= b < 0x7F and ch != "?":  # '?' would start trigraphs in old dialects
            out.append(ch)
        else:
            out.append(f"\\{b:03o}")
    out.append('"')
    return "".join(out)


def c_string_lines(s: str, indent: str = "    ") -> str:
    """s as adjacent C string literals, one per line of s, so that long text stays readable."""
    lines = s.splitlines(keepends=True) or [""]
    return ("\n" + indent).join(c_string(line) for line in lines)


def c_float(x: float) -> str:
    """A float literal that rounds to the same float32 as x: 9 significant digits suffice."""
    if not math.isfinite(x):
        raise ValueError(f"non-finite constant {x}")
    f32 = struct.unpack("<f", struct.pack("<f", x))[0]
    return f"{f32:.9e}f"


def c_double(x: float) -> str:
    """A double literal of exactly x: Python's repr reads back as the same double, in C too."""
    if not math.isfinite(x):
        raise ValueError(f"non-finite constant {x}")
    return repr(float(x))


def make_env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["c_string"] = c_string
    env.filters["c_string_lines"] = c_string_lines
    env.filters["c_float"] = c_float
    env.filters["c_double"] = c_double
    env.filters["json"] = lambda v: json.dumps(v, sort_keys=True)
    return env


def write_if_changed(path: Path, text: str) -> bool:
    """Writes text to path unless it already holds exactly that; returns whether it wrote."""
    data = text.encode("utf-8")
    if path.exists() and path.read_bytes() == data:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    return True
