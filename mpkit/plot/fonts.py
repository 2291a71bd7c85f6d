"""A font with Hangul for every figure, chosen once and set per figure (never on global rcParams).

matplotlib's default DejaVu Sans has no Hangul, so Korean labels would draw as tofu boxes.
The family list keeps DejaVu Sans after the Hangul font: glyphs Nanum lacks (−, ·, →) fall back.
"""
from __future__ import annotations

import functools
import importlib.util
import warnings
from pathlib import Path

from matplotlib import font_manager

# Tried in order: the pip-installable package (Binder, laptops), then Debian/Ubuntu packages.
_SYSTEM_FONTS = (
    "/usr/share/fonts/truetype/nanum/NanumGothic.ttf",           # fonts-nanum
    "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc",    # fonts-noto-cjk
    "/usr/share/fonts/truetype/noto/NotoSansCJK-Regular.ttc",
)
INSTALL_HINT = ("no font with Hangul found, Korean labels will show as boxes; "
                "install one with `pip install koreanize-matplotlib` (or apt-get install fonts-nanum)")


def _candidates() -> list[Path]:
    paths = []
    spec = importlib.util.find_spec("koreanize_matplotlib")
    if spec is not None and spec.origin is not None:
        paths.append(Path(spec.origin).parent / "fonts" / "NanumGothic.ttf")
    paths.extend(Path(p) for p in _SYSTEM_FONTS)
    return paths


@functools.cache
def hangul_family() -> str | None:
    """Register the first Hangul font found with matplotlib and return its family name (warns once if none)."""
    for path in _candidates():
        if path.is_file():
            bold = path.with_name(path.name.replace("Regular", "Bold") if "Regular" in path.name
                                  else f"{path.stem}Bold{path.suffix}")
            for font in (path, bold):  # bold too, or bold titles fall back to a synthetic weight
                if font.is_file():
                    font_manager.fontManager.addfont(str(font))
            return font_manager.FontProperties(fname=str(path)).get_name()
    warnings.warn(INSTALL_HINT, stacklevel=3)
    return None


def rc() -> dict:
    """rcParams for ``matplotlib.rc_context`` while a figure's artists are made."""
    family = hangul_family()
    return {"font.family": [family, "DejaVu Sans"] if family else ["DejaVu Sans"]}
