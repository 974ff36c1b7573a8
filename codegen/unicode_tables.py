"""Generates runtime/unicode_data.c, the Unicode tables of the tokenizer, from Python's unicodedata.

    .venv/bin/python -m codegen.unicode_tables          # rewrites runtime/unicode_data.c if stale
    .venv/bin/python -m codegen.unicode_tables --check  # exit 1 if the checked-in file is stale

The pre-tokenizer regexes of tokenizer.json (run by Oniguruma in the `tokenizers` library) and
its Rust helpers ask three questions of a code point: is it \\p{L} (general category L*), \\p{N}
(N*), or \\s (the White_Space property: U+0009..U+000D, U+0085 and the categories Zs, Zl, Zp)?
The NFC normalizer (Qwen2) needs canonical combining classes, full canonical decompositions and
the primary composites. Each table is a sorted array that the runtime binary-searches.
"""

from __future__ import annotations

import argparse
import sys
import unicodedata

from .render import REPO_ROOT, make_env, write_if_changed

TEMPLATE = "unicode_data.c.j2"
OUTPUT = REPO_ROOT / "runtime" / "unicode_data.c"

# Must equal UNICODE_DATA_FORMAT in runtime/unicode_data.h: bump both when the table layout changes.
FORMAT = 1

# Class numbers, as enum unicode_class in runtime/unicode_data.h.
CLASS_OTHER, CLASS_LETTER, CLASS_NUMBER, CLASS_SPACE = 0, 1, 2, 3

MAX_CP = 0x10FFFF
HANGUL_FIRST, HANGUL_LAST = 0xAC00, 0xD7A3  # decomposed algorithmically by the runtime


def char_class(cp: int) -> int:
    ch = chr(cp)
    cat = unicodedata.category(ch)
    if 0x09 <= cp <= 0x0D or cp == 0x85 or cat in ("Zs", "Zl", "Zp"):
        return CLASS_SPACE
    if cat[0] == "L":
        return CLASS_LETTER
    if cat[0] == "N":
        return CLASS_NUMBER
    return CLASS_OTHER


def ranges(value_of, skip):
    """[(first, last, value)] over all code points, merging runs of equal value, dropping skip."""
    out = []
    for cp in range(MAX_CP + 1):
        v = value_of(cp)
        if out and out[-1][2] == v and out[-1][1] == cp - 1:
            out[-1][1] = cp
        else:
            out.append([cp, cp, v])
    return [tuple(r) for r in out if r[2] != skip]


def decompositions():
    """[(cp, [full canonical decomposition])] for every code point NFD changes, Hangul excluded."""
    out = []
    for cp in range(MAX_CP + 1):
        if HANGUL_FIRST <= cp <= HANGUL_LAST or 0xD800 <= cp <= 0xDFFF:
            continue
        d = unicodedata.normalize("NFD", chr(cp))
        if d != chr(cp):
            out.append((cp, [ord(c) for c in d]))
    return out


def compositions():
    """[(first, second, composite)] sorted by (first, second): the primary composites, i.e. the
    two-character canonical decompositions that NFC recomposes (composition exclusions and
    non-starter decompositions are exactly those whose NFC is not themselves)."""
    out = []
    for cp in range(MAX_CP + 1):
        if HANGUL_FIRST <= cp <= HANGUL_LAST or 0xD800 <= cp <= 0xDFFF:
            continue
        dec = unicodedata.decomposition(chr(cp))
        if not dec or dec.startswith("<"):
            continue
        parts = [int(x, 16) for x in dec.split()]
        if len(parts) == 2 and unicodedata.normalize("NFC", chr(cp)) == chr(cp):
            out.append((parts[0], parts[1], cp))
    return sorted(out)


def render() -> str:
    decomp = decompositions()
    decomp_cps, decomp_index = [], []
    for cp, d in decomp:
        decomp_index.append((cp, len(decomp_cps), len(d)))
        decomp_cps.extend(d)
    env = make_env()
    return env.get_template(TEMPLATE).render(
        output="runtime/unicode_data.c",
        template=TEMPLATE,
        regenerate=".venv/bin/python -m codegen.unicode_tables",
        unicode_version=unicodedata.unidata_version,
        format=FORMAT,
        class_ranges=ranges(char_class, CLASS_OTHER),
        ccc_ranges=ranges(lambda cp: unicodedata.combining(chr(cp)), 0),
        decomp_index=decomp_index,
        decomp_cps=decomp_cps,
        decomp_max=max(len(d) for _, d in decomp),
        compositions=compositions(),
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only report whether the file is stale")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        if not OUTPUT.exists() or OUTPUT.read_text(encoding="utf-8") != text:
            print(f"{OUTPUT}: stale, run .venv/bin/python -m codegen.unicode_tables", file=sys.stderr)
            return 1
        return 0
    write_if_changed(OUTPUT, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
