"""Headless Chromium for the tests that check pictures: finding the browser,
taking a screenshot of a page, and decoding the PNG it writes (standard
library only), so a test can look at the pixels of what tfhost drew."""
import os
import shutil
import struct
import subprocess
import tempfile
import zlib

CHROMIUM_TIMEOUT = 120


def decode_png(data):
    """(width, height, channels, rows of bytes) of an 8-bit, non-interlaced
    greyscale/RGB/RGBA PNG: IHDR, the IDAT stream inflated, filters undone."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, header = 8, [], None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    width, height, depth, color, _, _, interlace = header
    channels = {0: 1, 2: 3, 4: 2, 6: 4}.get(color)
    if depth != 8 or channels is None or interlace != 0:
        raise ValueError(f"unsupported PNG: depth {depth}, colour type {color}, interlace {interlace}")
    raw = zlib.decompress(b"".join(idat))
    stride = width * channels
    rows, prev = [], bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        if kind == 1:  # Sub
            for i in range(channels, stride):
                line[i] = (line[i] + line[i - channels]) & 0xFF
        elif kind == 2:  # Up
            line = bytearray((a + b) & 0xFF for a, b in zip(line, prev))
        elif kind == 3:  # Average
            for i in range(stride):
                left = line[i - channels] if i >= channels else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
        elif kind == 4:  # Paeth
            for i in range(stride):
                a = line[i - channels] if i >= channels else 0
                b = prev[i]
                c = prev[i - channels] if i >= channels else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        elif kind != 0:
            raise ValueError(f"unknown PNG filter {kind}")
        rows.append(bytes(line))
        prev = line
    return width, height, channels, rows


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def screenshot(url, png, width, height, scratch):
    """Renders url at width x height into png; returns (width, height, channels, rows).
    Raises RuntimeError when Chromium is missing or fails."""
    exe = find_chromium()
    if exe is None:
        raise RuntimeError("chromium is not installed (apt-get install chromium; scripts/install-deps.sh installs it)")
    profile = tempfile.mkdtemp(prefix="chromium-", dir=scratch)
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
           f"--user-data-dir={profile}", f"--screenshot={png}", f"--window-size={width},{height}", url]
    r = subprocess.run(cmd, capture_output=True, timeout=CHROMIUM_TIMEOUT)
    if r.returncode != 0 or not os.path.exists(png):
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stderr.decode(errors='replace')[-3000:]}")
    with open(png, "rb") as f:
        return decode_png(f.read())
