"""Request colours that stay apart: a perceptual palette (OKLCH, at a chroma and two
lightnesses readable on dark and light backgrounds) walked by the golden angle, so
requests seen one after another get hues about 137° apart, and a hue that comes round
again five requests later comes at the other lightness: never two near-identical reds
side by side.

A request keeps its colour while it is seen; the map and the inspector share one
RequestColours, so a request has the same colour in both.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from functools import lru_cache

LIGHTNESS = (0.63, 0.76)  # alternated: hues that come round again differ in lightness
CHROMA = 0.14
GOLDEN_ANGLE = 137.50776405
START_HUE = 25.0  # the first request is red-orange
REMEMBERED = 1024  # ids kept (least recently seen forgotten first)


def oklch_hex(lightness: float, chroma: float, hue_degrees: float) -> str:
    """OKLCH to an sRGB hex colour (Björn Ottosson's OKLab), clipped to the gamut."""
    h = math.radians(hue_degrees)
    a, b = chroma * math.cos(h), chroma * math.sin(h)
    l_ = (lightness + 0.3963377774 * a + 0.2158037573 * b) ** 3
    m_ = (lightness - 0.1055613458 * a - 0.0638541728 * b) ** 3
    s_ = (lightness - 0.0894841775 * a - 1.2914855480 * b) ** 3
    linear = (4.0767416621 * l_ - 3.3077115913 * m_ + 0.2309699292 * s_,
              -1.2684380046 * l_ + 2.6097574011 * m_ - 0.3413193965 * s_,
              -0.0041960863 * l_ - 0.7034186147 * m_ + 1.7076147010 * s_)

    def encode(c: float) -> int:
        c = min(max(c, 0.0), 1.0)
        srgb = 12.92 * c if c <= 0.0031308 else 1.055 * c ** (1 / 2.4) - 0.055
        return round(srgb * 255)

    return "#" + "".join(f"{encode(c):02x}" for c in linear)


@lru_cache(maxsize=256)
def palette_colour(index: int) -> str:
    lightness = LIGHTNESS[index % len(LIGHTNESS)]
    return oklch_hex(lightness, CHROMA, (START_HUE + index * GOLDEN_ANGLE) % 360)


class RequestColours:
    def __init__(self) -> None:
        self._index: OrderedDict[str, int] = OrderedDict()
        self._next = 0

    def index(self, request_id: str) -> int:
        """The request's palette index, assigned when it is first seen."""
        index = self._index.get(request_id)
        if index is None:
            index = self._index[request_id] = self._next
            self._next += 1
            if len(self._index) > REMEMBERED:
                self._index.popitem(last=False)
        else:
            self._index.move_to_end(request_id)
        return index

    def colour(self, request_id: str) -> str:
        return palette_colour(self.index(request_id))

    def observe(self, request_ids: list[str]) -> None:
        """Give new requests their colours in the order the engine lists them."""
        for request_id in request_ids:
            self.index(request_id)
