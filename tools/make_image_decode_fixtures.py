#!/usr/bin/env python3
"""Images whose decoding depends on more than their pixels, and the RGB bytes vLLM 0.33's
image loader makes of them (`multimodal/media/image.py` ImageMediaIO.load_bytes:
`open_image`, `normalize_image` = `ImageOps.exif_transpose`, `load`, then
`multimodal/image.py` `convert_image_mode(image, "RGB")`: an image with transparency
(RGBA, LA, PA, or a `transparency` entry such as PNG's tRNS) is converted to RGBA and pasted
onto white through its alpha). Writes tests/fixtures/vision/decode/: each source file and
`expected.json` (name → width, height, and the RGB bytes' SHA-256) plus `<name>.rgb`.

Run by hand (outputs are committed): python tools/make_image_decode_fixtures.py
Needs Pillow (13; any recent one decodes these formats alike).
"""

import hashlib
import io
import json
import os

import numpy as np
from PIL import Image, ImageOps

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "vision", "decode")


def vllm_rgb(data):
    """vLLM 0.33's `load_bytes` then `convert_image_mode(…, "RGB")`, restated."""
    image = Image.open(io.BytesIO(data))
    try:
        image = ImageOps.exif_transpose(image)
    except Exception:
        pass
    image.load()
    transparent = image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info
    if transparent:
        if image.mode != "RGBA":
            image = image.convert("RGBA")
        out = Image.new("RGB", image.size, (255, 255, 255))
        out.paste(image, mask=image.split()[3])
        return out
    return image.convert("RGB")


def sources():
    rng = np.random.default_rng(7)
    rgba = rng.integers(0, 256, (5, 7, 4), dtype=np.uint8)
    rgba[0, :, 3] = 0
    rgba[1, :, 3] = 255
    la = rng.integers(0, 256, (6, 3, 2), dtype=np.uint8)
    pal = Image.fromarray(rng.integers(0, 4, (4, 6), dtype=np.uint8), "P")
    pal.putpalette([255, 0, 0, 0, 255, 0, 0, 0, 255, 10, 20, 30])
    rgb = rng.integers(0, 256, (3, 5, 3), dtype=np.uint8)
    out = {}

    def png(img, **kw):
        b = io.BytesIO()
        img.save(b, "PNG", **kw)
        return b.getvalue()

    out["rgba.png"] = png(Image.fromarray(rgba, "RGBA"))
    out["la.png"] = png(Image.fromarray(la, "LA"))
    out["palette_trns.png"] = png(pal, transparency=2)
    b = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(b, "WEBP", lossless=True)
    out["rgba.webp"] = b.getvalue()
    for orientation in (3, 6, 8):
        exif = Image.Exif()
        exif[0x0112] = orientation
        out[f"orient{orientation}.png"] = png(Image.fromarray(rgb, "RGB"), exif=exif)
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    expected = {}
    for name, data in sorted(sources().items()):
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
        rgb = vllm_rgb(data)
        raw = np.asarray(rgb, dtype=np.uint8).tobytes()
        with open(os.path.join(OUT, name + ".rgb"), "wb") as f:
            f.write(raw)
        expected[name] = {"width": rgb.width, "height": rgb.height,
                          "sha256": hashlib.sha256(raw).hexdigest()}
        print(name, rgb.size)
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
