"""The two 8-bit float formats from their definitions, for the fp8 tests: an independent model of
what PyTorch's torch.float8_e4m3fn / torch.float8_e5m2 casts give (values on a grid, nearest chosen
by exact comparison, ties to the even code), hand-made safetensors files, and the tfhost script
that casts every input it is given. Only numpy and the standard library.

The rules modelled (OCP 8-bit floats; PyTorch's non-saturating casts):
  e4m3: bias 7, 3 mantissa bits; 0x7f/0xff are NaN, no infinity; largest finite 448.
        A magnitude rounding above 448 (past the tie at 464), infinities and NaN give NaN.
  e5m2: bias 15, 2 mantissa bits; 0x7c infinity, 0x7d..0x7f NaN; largest finite 57344.
        A magnitude from the tie at 61440 up, and infinities, give infinity; NaN gives NaN.
  Rounding: to nearest, ties to the code whose last bit is 0, once, from the float32 value.
  NaN keeps its sign. Saturating: beyond the largest finite value (infinities too) gives it.
"""
import bisect
import math
import subprocess

import numpy as np

from safetensors_bytes import read_raw, write_raw  # noqa: F401 (write_raw: the tests write their inputs)

FORMATS = {
    # name: (exponent bits, mantissa bits, largest finite code, overflow code, safetensors dtype)
    "f8e4m3": (4, 3, 0x7E, 0x7F, "F8_E4M3"),
    "f8e5m2": (5, 2, 0x7B, 0x7C, "F8_E5M2"),
}


def value(fmt, code):
    """The value of an 8-bit code, by the definition (NaN as math.nan, infinity as math.inf)."""
    e_bits, m_bits, _, _, _ = FORMATS[fmt]
    sign = -1.0 if code & 0x80 else 1.0
    e = (code >> m_bits) & ((1 << e_bits) - 1)
    m = code & ((1 << m_bits) - 1)
    bias = (1 << (e_bits - 1)) - 1
    if fmt == "f8e4m3" and (code & 0x7F) == 0x7F:
        return math.nan
    if fmt == "f8e5m2" and e == 31:
        return sign * math.inf if m == 0 else math.nan
    if e == 0:
        return sign * math.ldexp(m, 1 - bias - m_bits)
    return sign * math.ldexp((1 << m_bits) + m, e - bias - m_bits)


def _grid(fmt):
    """(magnitudes, codes) from 0 up to the overflow code's value, which stands for NaN (e4m3) or
    infinity (e5m2): the value the overflow code would have if the format went on."""
    e_bits, m_bits, top, over, _ = FORMATS[fmt]
    mags = [value(fmt, c) for c in range(top + 1)]
    bias = (1 << (e_bits - 1)) - 1
    e, m = over >> m_bits, over & ((1 << m_bits) - 1)
    mags.append(math.ldexp((1 << m_bits) + m, e - bias - m_bits))
    return mags, list(range(top + 1)) + [over]


_GRIDS = {fmt: _grid(fmt) for fmt in FORMATS}


def encode(fmt, x, saturate=False):
    """The code of the float32 value x (a Python float holding it exactly)."""
    _, _, top, over, _ = FORMATS[fmt]
    sign = 0x80 if math.copysign(1.0, x) < 0 else 0
    if math.isnan(x):
        return sign | 0x7F
    a = abs(x)
    if saturate and a > value(fmt, top):
        return sign | top
    mags, codes = _GRIDS[fmt]
    if a >= mags[-1]:
        return sign | over
    i = bisect.bisect_left(mags, a)
    if mags[i] == a:
        return sign | codes[i]
    lo, hi = i - 1, i
    below, above = a - mags[lo], mags[hi] - a  # exact: both are short binary fractions
    pick = lo if below < above else hi if above < below else (lo if codes[lo] % 2 == 0 else hi)
    return sign | codes[pick]


def decoded_f32_bits(fmt, code):
    """The float32 bits a code decodes to: exact for numbers; for NaN, the bits PyTorch's CPU decoding
    gives (e4m3: 0x7ff00000; e5m2: the f16 NaN's payload widened and quieted), with the sign."""
    v = value(fmt, code)
    sign = 0x80000000 if code & 0x80 else 0
    if math.isnan(v):
        if fmt == "f8e4m3":
            return sign | 0x7FF00000
        return sign | 0x7F800000 | 0x400000 | ((code & 3) << 21)
    return int(np.array([v], np.float32).view(np.uint32)[0])


def f32(bits):
    """float32 values of uint32 bit patterns, as an array."""
    return np.asarray(bits, np.uint32).view(np.float32)


def f32_inputs(seed=1234, random_count=200000, with_f16=True):
    """uint32 patterns: every float16 value widened (with_f16), every grid point of both formats,
    their midpoints and two float32 ulps either side of each, the ranges' edges, NaNs, infinities,
    zeros, float32 subnormals, and random patterns."""
    pats = set()
    if with_f16:
        pats |= set(np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32).view(np.uint32).tolist())
    points = []
    for fmt in FORMATS:
        mags, _ = _GRIDS[fmt]
        points += mags
        points += [(a + b) / 2 for a, b in zip(mags, mags[1:])]
    points += [448.0, 464.0, 480.0, 57344.0, 61440.0, 65536.0, 2.0**-6, 2.0**-9, 2.0**-10, 2.0**-14,
               2.0**-16, 2.0**-17, 3.4028234663852886e38, 2.0**-149, 2.0**-126]
    for p in points:
        b = int(np.array([p], np.float32).view(np.uint32)[0])
        for d in (-2, -1, 0, 1, 2):
            if 0 <= b + d < 0x7F800000:
                pats.add(b + d)
    pats |= {0x00000000, 0x00000001, 0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0x7F800000, 0x7F800001, 0x7FC00000,
             0x7FFFFFFF, 0x7FA00000}
    pats |= {p | 0x80000000 for p in list(pats)}
    rng = np.random.default_rng(seed)
    pats |= set(rng.integers(0, 2**32, size=random_count, dtype=np.uint64).astype(np.uint32).tolist())
    return np.array(sorted(pats), np.uint32)


def f64_inputs():
    """Doubles that round to float32 at, or a hair either side of, the formats' ties: f64 goes through
    float32 first (PyTorch's rule), so a double just above a tie may still land on the tie."""
    out = []
    for fmt in FORMATS:
        mags, _ = _GRIDS[fmt]
        for a, b in zip(mags, mags[1:]):
            t = (a + b) / 2
            out += [t, -t, t * (1 + 2.0**-30), t * (1 - 2.0**-30), t * (1 + 2.0**-20)]
    out += [math.inf, -math.inf, math.nan, 1e300, -1e-300, 0.0, -0.0]
    return np.array(out, np.float64)


def read_safetensors(path):
    """{name: (dtype, shape, bytes)} of a safetensors file."""
    header, data = read_raw(path)
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in header.items() if k != "__metadata__"}


# Loads arg[1] on device arg[3] and writes to arg[2]: every input tensor x<src> cast to both formats,
# plain (<src>.<fmt>) and saturating (<src>.<fmt>.sat); every code tensor c.<fmt> decoded to f32,
# f16, bf16 and f64 (c.<fmt>.<dtype>) and itself (c.<fmt>, the round trip).
CAST_SCRIPT = """\
local inputs = tf.safetensors.load(arg[1], { device = arg[3] })
local out = {}
for name, t in pairs(inputs) do
  if name:sub(1, 2) == "c." then
    out[name] = t:cpu()
    for _, d in ipairs({ "f32", "f16", "bf16", "f64" }) do out[name .. "." .. d] = t:to(d):cpu() end
  else
    for _, f in ipairs({ "f8e4m3", "f8e5m2" }) do
      out[name .. "." .. f] = t:to(f):cpu()
      out[name .. "." .. f .. ".sat"] = tf.cast(t, f, { saturate = true }):cpu()
    end
  end
end
tf.safetensors.save(arg[2], out)
"""


def run_casts(tfhost, script_path, inputs_path, outputs_path, device, timeout=300):
    """Runs CAST_SCRIPT (written at script_path) and returns the outputs file's tensors."""
    with open(script_path, "w") as f:
        f.write(CAST_SCRIPT)
    r = subprocess.run([tfhost, script_path, inputs_path, outputs_path, device], capture_output=True, text=True,
                       timeout=timeout)
    if r.returncode != 0:
        raise AssertionError(f"tfhost failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return read_safetensors(outputs_path)


def code_entries():
    """The safetensors entries of all 256 codes of both formats."""
    return [(f"c.{fmt}", FORMATS[fmt][4], [256], bytes(range(256))) for fmt in FORMATS]
