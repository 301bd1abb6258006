"""make.py -- the ImageDecoder test images and Pillow's pixels for them.

    python3 tests/data/image/make.py      (needs Pillow and NumPy)

writes tests/data/image/*.{jpg,png,tif,webp,jp2} (a 7 x 5 picture in each
format, plus a grayscale JPEG, a palette PNG, a 16-bit PNG and files the
decoder must refuse: RGBA PNG and WebP, CMYK JPEG) and expected.lua, the
pixels Pillow decodes from each as ONNX's reference does (np.array(img),
convert("L") for Grayscale), which tests/lua/onnx_image.lua compares with
exactly.  Pillow's wheels bring their own libraries (libjpeg-turbo,
libwebp, libtiff, OpenJPEG), not Debian's: an exact match checks both.
Committed outputs of Pillow 13.0.0.
"""
import os

import numpy as np
from PIL import Image

here = os.path.dirname(os.path.abspath(__file__))
W, H = 7, 5
rgb = np.zeros((H, W, 3), np.uint8)
for y in range(H):
    for x in range(W):
        rgb[y, x] = ((x * 37 + y * 11) % 256, (y * 53 + x * 7 + 40) % 256, (x * y * 29 + 90) % 256)
img = Image.fromarray(rgb, "RGB")
rgba = img.copy()
rgba.putalpha(Image.fromarray((np.arange(W * H, dtype=np.uint8) * 7).reshape(H, W), "L"))

files = {
    "rgb.jpg": lambda p: img.save(p, quality=90),
    "gray.jpg": lambda p: img.convert("L").save(p, quality=90),
    "rgb.png": lambda p: img.save(p),
    "palette.png": lambda p: img.quantize(6).save(p),
    "rgb16.png": None,   # written below: Pillow saves no 16-bit RGB
    "rgb.tif": lambda p: img.save(p, compression="tiff_deflate"),
    "rgb.webp": lambda p: img.save(p, quality=80),
    "rgb.jp2": lambda p: img.save(p),
    "rgba.png": lambda p: rgba.save(p),
    "rgba.webp": lambda p: rgba.save(p, lossless=True),
    "cmyk.jpg": lambda p: img.convert("CMYK").save(p),
}


def png16(path):
    # a 16-bit RGB PNG by hand (zlib, one filter byte 0 per row)
    import struct
    import zlib
    raw = b"".join(b"\0" + b"".join(struct.pack(">HHH", *(int(v) * 256 + 7 for v in rgb[y, x]))
                                    for x in range(W)) for y in range(H))

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", W, H, 16, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


out = ["-- written by tests/data/image/make.py: Pillow's pixels, row-major", "return {"]
for name, save in files.items():
    p = os.path.join(here, name)
    (save or png16)(p)
    if name.startswith(("rgba", "cmyk")):
        continue
    im = Image.open(p)
    im.load()
    a = np.array(im)
    entry = {}
    if a.ndim == 3 and a.shape[2] == 3:
        entry["RGB"] = a
        entry["BGR"] = a[:, :, ::-1]
    entry["Grayscale"] = np.array(im.convert("L"))[:, :, None]
    if a.ndim == 2 and im.mode == "L":
        entry["RGB"] = np.array(im.convert("RGB"))
        entry["BGR"] = entry["RGB"][:, :, ::-1]
    if im.mode == "P":   # the spec's RGB: the palette's colors
        entry["RGB"] = np.array(im.convert("RGB"))
        entry["BGR"] = entry["RGB"][:, :, ::-1]
    out.append('  ["%s"] = {' % name)
    for k, v in entry.items():
        out.append('    %s = {shape = {%s}, %s},' % (k, ", ".join(map(str, v.shape)),
                                                   ", ".join(map(str, v.reshape(-1).tolist()))))
    out.append("  },")
out.append("}")
with open(os.path.join(here, "expected.lua"), "w") as f:
    f.write("\n".join(out) + "\n")
