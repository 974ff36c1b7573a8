"""A line chart drawn into a NumPy RGB array and written as a PNG, with the standard library only.

compare.py charts decode tok/s against context depth for two builds; the project's dependencies
hold no plotting or imaging library, so this file carries what that needs: a PNG writer (zlib +
struct), a 5x7 bitmap font (digits, letters, a few symbols), thick lines, markers, and the chart
layout (one panel per device, each with its own axes, ticks and tick labels, one legend and title).

Coordinates are pixels, (x, y) with y growing downwards; images are uint8 arrays (height, width, 3).
"""

from __future__ import annotations

import math
import struct
import zlib

import numpy as np

# ---------------------------------------------------------------------------------------------
# PNG


def png_encode(img: np.ndarray) -> bytes:
    """The bytes of an 8-bit RGB PNG of img (height, width, 3) uint8: one IDAT, filter 0 rows."""
    if img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
        raise ValueError(f"png_encode: expected uint8 (height, width, 3), got {img.dtype} {img.shape}")
    h, w, _ = img.shape

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = np.concatenate([np.zeros((h, 1), np.uint8), img.reshape(h, w * 3)], axis=1)  # (h, 1 + 3w)
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)  # 8 bits, colour type 2 (RGB), no interlace
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(rows.tobytes(), 9))
            + chunk(b"IEND", b""))


def png_write(path, img: np.ndarray) -> None:
    with open(path, "wb") as f:
        f.write(png_encode(img))


# ---------------------------------------------------------------------------------------------
# Font: 5 columns by 7 rows above the baseline, 2 more below it for g, j, p, q, y and the comma.
# Each glyph is its rows top to bottom, '#' set and '.' clear.

GLYPH_W, GLYPH_H = 5, 9
_FONT_ROWS = {
    " ": "..... ..... ..... ..... ..... ..... .....",
    "0": ".###. #...# #..## #.#.# ##..# #...# .###.",
    "1": "..#.. .##.. ..#.. ..#.. ..#.. ..#.. .###.",
    "2": ".###. #...# ....# ...#. ..#.. .#... #####",
    "3": "##### ...#. ..#.. ...#. ....# #...# .###.",
    "4": "...#. ..##. .#.#. #..#. ##### ...#. ...#.",
    "5": "##### #.... ####. ....# ....# #...# .###.",
    "6": "..##. .#... #.... ####. #...# #...# .###.",
    "7": "##### ....# ...#. ..#.. .#... .#... .#...",
    "8": ".###. #...# #...# .###. #...# #...# .###.",
    "9": ".###. #...# #...# .#### ....# ...#. .##..",
    "A": ".###. #...# #...# ##### #...# #...# #...#",
    "B": "####. #...# #...# ####. #...# #...# ####.",
    "C": ".###. #...# #.... #.... #.... #...# .###.",
    "D": "####. #...# #...# #...# #...# #...# ####.",
    "E": "##### #.... #.... ####. #.... #.... #####",
    "F": "##### #.... #.... ####. #.... #.... #....",
    "G": ".###. #...# #.... #.### #...# #...# .####",
    "H": "#...# #...# #...# ##### #...# #...# #...#",
    "I": ".###. ..#.. ..#.. ..#.. ..#.. ..#.. .###.",
    "J": "..### ...#. ...#. ...#. ...#. #..#. .##..",
    "K": "#...# #..#. #.#.. ##... #.#.. #..#. #...#",
    "L": "#.... #.... #.... #.... #.... #.... #####",
    "M": "#...# ##.## #.#.# #.#.# #...# #...# #...#",
    "N": "#...# #...# ##..# #.#.# #..## #...# #...#",
    "O": ".###. #...# #...# #...# #...# #...# .###.",
    "P": "####. #...# #...# ####. #.... #.... #....",
    "Q": ".###. #...# #...# #...# #.#.# #..#. .##.#",
    "R": "####. #...# #...# ####. #.#.. #..#. #...#",
    "S": ".#### #.... #.... .###. ....# ....# ####.",
    "T": "##### ..#.. ..#.. ..#.. ..#.. ..#.. ..#..",
    "U": "#...# #...# #...# #...# #...# #...# .###.",
    "V": "#...# #...# #...# #...# #...# .#.#. ..#..",
    "W": "#...# #...# #...# #.#.# #.#.# #.#.# .#.#.",
    "X": "#...# #...# .#.#. ..#.. .#.#. #...# #...#",
    "Y": "#...# #...# .#.#. ..#.. ..#.. ..#.. ..#..",
    "Z": "##### ....# ...#. ..#.. .#... #.... #####",
    "a": "..... ..... .###. ....# .#### #...# .####",
    "b": "#.... #.... #.##. ##..# #...# #...# ####.",
    "c": "..... ..... .###. #.... #.... #...# .###.",
    "d": "....# ....# .##.# #..## #...# #...# .####",
    "e": "..... ..... .###. #...# ##### #.... .###.",
    "f": "..##. .#..# .#... ###.. .#... .#... .#...",
    "g": "..... ..... .#### #...# #...# #...# .#### ....# .###.",
    "h": "#.... #.... #.##. ##..# #...# #...# #...#",
    "i": "..#.. ..... .##.. ..#.. ..#.. ..#.. .###.",
    "j": "...#. ..... ..##. ...#. ...#. ...#. ...#. #..#. .##..",
    "k": "#.... #.... #..#. #.#.. ##... #.#.. #..#.",
    "l": ".##.. ..#.. ..#.. ..#.. ..#.. ..#.. .###.",
    "m": "..... ..... ##.#. #.#.# #.#.# #.#.# #.#.#",
    "n": "..... ..... #.##. ##..# #...# #...# #...#",
    "o": "..... ..... .###. #...# #...# #...# .###.",
    "p": "..... ..... ####. #...# #...# #...# ####. #.... #....",
    "q": "..... ..... .#### #...# #...# #...# .#### ....# ....#",
    "r": "..... ..... #.##. ##..# #.... #.... #....",
    "s": "..... ..... .###. #.... .###. ....# ####.",
    "t": ".#... .#... ###.. .#... .#... .#..# ..##.",
    "u": "..... ..... #...# #...# #...# #..## .##.#",
    "v": "..... ..... #...# #...# #...# .#.#. ..#..",
    "w": "..... ..... #...# #...# #.#.# #.#.# .#.#.",
    "x": "..... ..... #...# .#.#. ..#.. .#.#. #...#",
    "y": "..... ..... #...# #...# #...# #...# .#### ....# .###.",
    "z": "..... ..... ##### ...#. ..#.. .#... #####",
    ".": "..... ..... ..... ..... ..... .##.. .##..",
    ",": "..... ..... ..... ..... ..... .##.. .##.. ..#.. .#...",
    ":": "..... .##.. .##.. ..... .##.. .##.. .....",
    "-": "..... ..... ..... .###. ..... ..... .....",
    "_": "..... ..... ..... ..... ..... ..... #####",
    "+": "..... ..#.. ..#.. ##### ..#.. ..#.. .....",
    "=": "..... ..... ##### ..... ##### ..... .....",
    "/": "..... ....# ...#. ..#.. .#... #.... .....",
    "(": "...#. ..#.. .#... .#... .#... ..#.. ...#.",
    ")": ".#... ..#.. ...#. ...#. ...#. ..#.. .#...",
    "[": ".###. .#... .#... .#... .#... .#... .###.",
    "]": ".###. ...#. ...#. ...#. ...#. ...#. .###.",
    "%": "##... ##..# ...#. ..#.. .#... #..## ...##",
    "#": ".#.#. .#.#. ##### .#.#. ##### .#.#. .#.#.",
    "*": "..... ..#.. #.#.# .###. #.#.# ..#.. .....",
    "'": "..#.. ..#.. .#... ..... ..... ..... .....",
    "|": "..#.. ..#.. ..#.. ..#.. ..#.. ..#.. ..#..",
    "?": ".###. #...# ....# ...#. ..#.. ..... ..#..",
}


def _glyph(rows: str) -> np.ndarray:
    g = np.zeros((GLYPH_H, GLYPH_W), bool)
    for r, row in enumerate(rows.split()):
        g[r] = [c == "#" for c in row]
    return g


FONT = {c: _glyph(rows) for c, rows in _FONT_ROWS.items()}


def text_mask(text: str, scale: int = 1) -> np.ndarray:
    """The pixels of text as a bool array (9 * scale, 6 * scale * len(text)); unknown characters
    print as '?'. One blank column separates characters."""
    m = np.zeros((GLYPH_H, (GLYPH_W + 1) * len(text)), bool)
    for i, c in enumerate(text):
        m[:, i * (GLYPH_W + 1):i * (GLYPH_W + 1) + GLYPH_W] = FONT.get(c, FONT["?"])
    return m.repeat(scale, axis=0).repeat(scale, axis=1)


def text_width(text: str, scale: int = 1) -> int:
    return (GLYPH_W + 1) * scale * len(text) - scale


# ---------------------------------------------------------------------------------------------
# Drawing into img (height, width, 3) uint8


def _paint(img: np.ndarray, mask: np.ndarray, x: int, y: int, color) -> None:
    """Colours the set pixels of mask with its top-left corner at (x, y), clipped to img."""
    h, w = img.shape[:2]
    mh, mw = mask.shape
    x0, y0, x1, y1 = max(x, 0), max(y, 0), min(x + mw, w), min(y + mh, h)
    if x0 >= x1 or y0 >= y1:
        return
    region = img[y0:y1, x0:x1]
    region[mask[y0 - y:y1 - y, x0 - x:x1 - x]] = color


def draw_text(img, text: str, x: int, y: int, color, scale: int = 1, anchor: str = "left", rotate: bool = False):
    """Text with its cap top at y; anchor left, center or right on x. rotate: reads bottom to top,
    centred on (x, y)."""
    m = text_mask(text, scale)
    if rotate:
        m = np.rot90(m)
        _paint(img, m, x - m.shape[1] // 2, y - m.shape[0] // 2, color)
        return
    w = text_width(text, scale)
    x = x - w // 2 if anchor == "center" else x - w if anchor == "right" else x
    _paint(img, m, x, y, color)


def fill_rect(img, x0: int, y0: int, x1: int, y1: int, color) -> None:
    """Fills [x0, x1] x [y0, y1], both ends included."""
    _paint(img, np.ones((y1 - y0 + 1, x1 - x0 + 1), bool), x0, y0, color)


def draw_line(img, x0: float, y0: float, x1: float, y1: float, color, width: int = 1) -> None:
    """A segment width pixels thick: a square brush stamped every half pixel along it."""
    n = max(1, int(math.ceil(2 * max(abs(x1 - x0), abs(y1 - y0)))))
    brush = np.ones((width, width), bool)
    for t in np.linspace(0.0, 1.0, n + 1):
        x, y = x0 + (x1 - x0) * t, y0 + (y1 - y0) * t
        _paint(img, brush, int(round(x)) - width // 2, int(round(y)) - width // 2, color)


def draw_marker(img, x: float, y: float, color, shape: str, size: int = 9) -> None:
    """A filled square or disc of diameter size centred on (x, y)."""
    r = size // 2
    yy, xx = np.mgrid[-r:r + 1, -r:r + 1]
    mask = np.ones_like(xx, bool) if shape == "square" else (xx * xx + yy * yy <= r * r + r)
    _paint(img, mask, int(round(x)) - r, int(round(y)) - r, color)


# ---------------------------------------------------------------------------------------------
# Axes


def nice_ticks(lo: float, hi: float, target: int = 5) -> list[float]:
    """Ticks at 1, 2 or 5 times a power of ten covering [lo, hi], about target of them."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / target
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(lo / step + 1e-9) * step
    last = math.ceil(hi / step - 1e-9) * step
    n = int(round((last - first) / step))
    return [first + i * step for i in range(n + 1)]


def tick_label(v: float) -> str:
    """1000 and up without decimals, 10000 and up in k when exact; below 10 with what the step needs."""
    if abs(v) >= 10000 and v % 1000 == 0:
        return f"{int(v) // 1000}k"
    if abs(v - round(v)) < 1e-9:
        return str(int(round(v)))
    return f"{v:.2f}".rstrip("0").rstrip(".")


WHITE, BLACK, GRID, AXIS_TEXT = (255, 255, 255), (0, 0, 0), (225, 225, 225), (60, 60, 60)


def line_chart(title: str, panels, series, x_label: str, y_label: str, panel_w: int = 560, panel_h: int = 400):
    """An RGB image: the title, a legend, and one panel per entry of panels side by side.

    panels: [(panel title, {series name: [(x, y), ...]})]; series: [(name, (r, g, b), marker)] in
    legend order, marker "square" or "disc". Each panel's y axis starts at 0 (so heights compare as
    ratios); its x axis spans the x values exactly, ticked where nice numbers fall inside.
    """
    head_h = 70
    width = max(panel_w * len(panels), text_width(title, 2) + 40)
    img = np.full((head_h + panel_h, width, 3), 255, np.uint8)
    panels_x = (width - panel_w * len(panels)) // 2  # the panels centred under a wider title
    draw_text(img, title, img.shape[1] // 2, 10, BLACK, scale=2, anchor="center")
    # legend: one line and marker per series, centred under the title
    items = [(name, color, marker, 60 + text_width(name, 2) + 30) for name, color, marker in series]
    x = (img.shape[1] - sum(w for *_, w in items)) // 2
    for name, color, marker, w in items:
        draw_line(img, x, 48, x + 44, 48, color, width=3)
        draw_marker(img, x + 22, 48, color, marker)
        draw_text(img, name, x + 56, 48 - GLYPH_H + 2, BLACK, scale=2)
        x += w

    left, right, top, bottom = 90, 40, 40, 60  # plot area margins inside a panel
    for p, (ptitle, data) in enumerate(panels):
        ox = panels_x + p * panel_w
        px0, px1, py0, py1 = ox + left, ox + panel_w - right, head_h + top, head_h + panel_h - bottom
        xs = [x for pts in data.values() for x, _ in pts]
        ys = [y for pts in data.values() for _, y in pts]
        xlo, xhi = min(xs, default=0.0), max(xs, default=1.0)
        if xhi > xlo:
            xt = [v for v in nice_ticks(xlo, xhi) if xlo - 1e-9 <= v <= xhi + 1e-9]
        else:  # one depth: in the middle of the axis, the only tick
            xt, xlo, xhi = [xlo], xlo - 1.0, xlo + 1.0
        yt = nice_ticks(0.0, max(ys, default=1.0) * 1.05)
        yhi = yt[-1]

        def to_px(x, y):
            return px0 + (x - xlo) / (xhi - xlo) * (px1 - px0), py1 - y / yhi * (py1 - py0)

        draw_text(img, ptitle, (px0 + px1) // 2, head_h + 12, BLACK, scale=2, anchor="center")
        for v in yt:
            _, y = to_px(xlo, v)
            if v > 0:
                draw_line(img, px0 + 1, y, px1, y, GRID)
            draw_line(img, px0 - 6, y, px0, y, BLACK)
            draw_text(img, tick_label(v), px0 - 10, int(round(y)) - 6, AXIS_TEXT, scale=2, anchor="right")
        for v in xt:
            x, _ = to_px(v, 0)
            draw_line(img, x, py1, x, py1 + 6, BLACK)
            draw_text(img, tick_label(v), int(round(x)), py1 + 12, AXIS_TEXT, scale=2, anchor="center")
        draw_line(img, px0, py0, px0, py1, BLACK, width=2)
        draw_line(img, px0, py1, px1, py1, BLACK, width=2)
        draw_text(img, x_label, (px0 + px1) // 2, py1 + 36, BLACK, scale=2, anchor="center")
        draw_text(img, y_label, ox + 14, (py0 + py1) // 2, BLACK, scale=2, rotate=True)
        for name, color, marker in series:
            pts = sorted(data.get(name, []))
            for (xa, ya), (xb, yb) in zip(pts, pts[1:]):
                draw_line(img, *to_px(xa, ya), *to_px(xb, yb), color, width=3)
            for x, y in pts:
                draw_marker(img, *to_px(x, y), color, marker)
    return img
