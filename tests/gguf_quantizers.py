"""Numpy quantisers for the GGUF tensor types gguf-py can read but not write.

Tests need tiny GGUF files in every tensor type, and gguf 0.19's ``gguf.quants.quantize``
covers only the legacy types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, F16, BF16): Q2_K, Q3_K, Q4_K,
Q5_K, Q6_K, IQ4_NL and IQ4_XS have a ``dequantize`` there and no ``quantize``. This module
fills that gap with :func:`quantize`, which returns the same raw ``uint8`` blocks as
``gguf.quants.quantize`` (what ``GGUFWriter.add_tensor(..., raw_dtype=qtype)`` takes) and
delegates the legacy types to gguf-py.

Each quantiser follows ggml's reference (``quantize_row_q4_K_ref`` and friends in
``ggml/src/ggml-quants.c`` of llama.cpp, and ``quantize_iq4_nl``/``quantize_iq4_xs`` without
an importance matrix): the same scale searches, the same two-level scale quantisation and the
same bit layout. It is written over whole arrays of blocks, with Python loops only over the
few search steps, so a 50k-value tensor takes milliseconds. It is not bit-exact with ggml
(numpy sums in another order; where ggml requantises against a float32 scale we use the
float16 one actually stored, and codes under a scale of 0 are written as the code of 0
rather than left over from the search), but ``gguf.quants.dequantize`` reads its bytes as
ggml would, which is all a test file needs. Against a C transcription of those functions on
normal data, 90-100% of the blocks came out bit-identical per type, with the same error to
four digits.
"""

from __future__ import annotations

from collections.abc import Callable

import gguf.quants
import numpy as np
from gguf.constants import GGML_QUANT_SIZES, QK_K, GGMLQuantizationType

# ggml's GROUP_MAX_EPS: a group whose largest magnitude is below this is all zero
GROUP_MAX_EPS = 1e-15
# the 16 levels of IQ4_NL/IQ4_XS (kvalues_iq4nl), and the midpoints between neighbours
IQ4_VALUES = np.array(gguf.quants.IQ4_NL.kvalues, dtype=np.float32)
_IQ4_MIDPOINTS = (IQ4_VALUES[:-1] + IQ4_VALUES[1:]) / 2

Blocks = np.ndarray  # float32 (n_blocks, block_size) in, uint8 (n_blocks, type_size) out


# ---------------------------------------------------------------- helpers


def _div0(num: np.ndarray | float, den: np.ndarray) -> np.ndarray:
    """``num / den``, and 0 where ``den`` is 0: ggml's ``d ? 1/d : 0`` on whole arrays."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den != 0, np.divide(num, den), np.float32(0)).astype(np.float32)


def _f16(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n,) float32 -> the little-endian float16 bytes (n, 2) and the value they hold, which
    is what the codes must be rounded against for the file to decode as intended."""
    half = np.ascontiguousarray(values, dtype="<f2")
    return half.view(np.uint8).reshape(-1, 2), half.astype(np.float32)


def _signed_absmax(x: np.ndarray) -> np.ndarray:
    """The element of largest magnitude along the last axis, with its sign: ggml scales a
    group so that this element lands on the widest level of the grid."""
    idx = np.abs(x).argmax(axis=-1)[..., None]
    return np.take_along_axis(x, idx, axis=-1)[..., 0]


def _codes(values: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Round half to even (ggml's ``nearest_int``) and clamp to [lo, hi]."""
    return np.clip(np.rint(values), lo, hi)


def _iq4_index(values: np.ndarray) -> np.ndarray:
    """Index of the nearest IQ4 level, a tie going up (ggml's ``best_index_int8``)."""
    return np.searchsorted(_IQ4_MIDPOINTS, values, side="right").astype(np.uint8)


def _or_shifted(codes: np.ndarray, shifts: list[int], axis: int) -> np.ndarray:
    """OR together the slices of ``codes`` along ``axis``, each shifted left by its entry of
    ``shifts``: how ggml packs 1-, 2- and 4-bit fields into bytes."""
    shape = [1] * codes.ndim
    shape[axis] = len(shifts)
    shifted = codes.astype(np.uint16) << np.array(shifts, np.uint16).reshape(shape)
    return np.bitwise_or.reduce(shifted, axis=axis)


def _bytes(*parts: np.ndarray) -> np.ndarray:
    """Concatenate per-block fields (each (n_blocks, ...)) into (n_blocks, type_size) bytes."""
    n = parts[0].shape[0]
    return np.concatenate([p.reshape(n, -1).astype(np.uint8) for p in parts], axis=1)


# ---------------------------------------------------------------- scale searches


def _fit_affine(
    x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int, mad: bool
) -> tuple[np.ndarray, np.ndarray]:
    """ggml's ``make_qkx2_quants`` over the last axis: the scale s >= 0 and offset m >= 0 of
    x ~ s*q - m, q in [0, nmax], minimising the w-weighted squared (or, with ``mad``,
    absolute) error over ``nstep + 1`` trial scales, each refined by weighted least squares.
    The offset is capped at 0 from above (m >= 0) because the format stores -m unsigned."""
    lo = np.minimum(x.min(axis=-1), 0)
    hi = x.max(axis=-1)
    live = hi > lo
    sum_w = w.sum(axis=-1)
    sum_x = (w * x).sum(axis=-1)

    def codes_at(iscale: np.ndarray, offset: np.ndarray) -> np.ndarray:
        return _codes(iscale[..., None] * (x - offset[..., None]), 0, nmax)

    def error(scale: np.ndarray, offset: np.ndarray, q: np.ndarray) -> np.ndarray:
        diff = scale[..., None] * q + offset[..., None] - x
        return (w * (np.abs(diff) if mad else diff * diff)).sum(axis=-1)

    iscale = _div0(nmax, hi - lo)
    scale = _div0(1, iscale)
    offset = lo
    best = error(scale, offset, codes_at(iscale, offset))
    for step in range(nstep + 1):
        # like ggml, each trial starts from the best offset found so far
        q = codes_at(_div0(rmin + rdelta * step + nmax, hi - offset), offset)
        sum_l = (w * q).sum(axis=-1)
        sum_l2 = (w * q * q).sum(axis=-1)
        sum_xl = (w * q * x).sum(axis=-1)
        det = sum_w * sum_l2 - sum_l * sum_l
        this_scale = _div0(sum_w * sum_xl - sum_x * sum_l, det)
        this_offset = _div0(sum_l2 * sum_x - sum_l * sum_xl, det)
        positive = this_offset > 0
        this_scale = np.where(positive, _div0(sum_xl, sum_l2), this_scale)
        this_offset = np.where(positive, np.float32(0), this_offset)
        cur = error(this_scale, this_offset, q)
        better = (det > 0) & (cur < best)
        best = np.where(better, cur, best)
        scale = np.where(better, this_scale, scale)
        offset = np.where(better, this_offset, offset)
    return np.where(live, scale, np.float32(0)), -np.where(live, offset, lo)


def _fit_symmetric(x: np.ndarray, nmax: int) -> np.ndarray:
    """ggml's ``make_qx_quants(rmse_type=1)`` over the last axis: the scale s of
    x ~ s*q, q in [-nmax, nmax - 1], best in x**2-weighted least squares over 19 trial
    scales around the one that puts the largest element on -nmax."""
    mx = _signed_absmax(x)
    live = np.abs(mx) >= GROUP_MAX_EPS
    w = x * x

    def fit(iscale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        q = _codes(iscale[..., None] * x, -nmax, nmax - 1)
        return (w * x * q).sum(axis=-1), (w * q * q).sum(axis=-1)

    sum_lx, sum_l2 = fit(_div0(-nmax, mx))
    scale = _div0(sum_lx, sum_l2)
    best = scale * sum_lx
    for step in [s for s in range(-9, 10) if s != 0]:
        slx, sl2 = fit(_div0(-(nmax + 0.1 * step), mx))
        better = (sl2 > 0) & (slx * slx > best * sl2)
        scale = np.where(better, _div0(slx, sl2), scale)
        best = np.where(better, scale * slx, best)
    return np.where(live, scale, np.float32(0))


def _fit_q3(x: np.ndarray, nmax: int = 4, passes: int = 5) -> np.ndarray:
    """ggml's ``make_q3_quants(do_rmse=true)`` over the last axis: start from the scale that
    puts the largest element on -nmax, then move one code at a time whenever that raises the
    x**2-weighted fit, for up to ``passes`` sweeps. A sweep that changes nothing leaves the
    state as it was, so running every sweep for every group equals ggml's early exit."""
    mx = _signed_absmax(x)
    live = np.abs(mx) >= GROUP_MAX_EPS
    w = x * x
    q = _codes(_div0(-nmax, mx)[..., None] * x, -nmax, nmax - 1)
    sum_lx = (w * x * q).sum(axis=-1)
    sum_l2 = (w * q * q).sum(axis=-1)
    for _ in range(passes):
        for i in range(x.shape[-1]):
            xi, wi, qi = x[..., i], w[..., i], q[..., i]
            slx = sum_lx - wi * xi * qi
            sl2 = sum_l2 - wi * qi * qi
            new = _codes(xi * _div0(sl2, np.where(slx > 0, slx, 0)), -nmax, nmax - 1)
            new_lx = slx + wi * xi * new
            new_l2 = sl2 + wi * new * new
            take = (slx > 0) & (new != qi) & (new_l2 > 0)
            take &= new_lx * new_lx * sum_l2 > sum_lx * sum_lx * new_l2
            q[..., i] = np.where(take, new, qi)
            sum_lx = np.where(take, new_lx, sum_lx)
            sum_l2 = np.where(take, new_l2, sum_l2)
    return np.where(live & (sum_l2 > 0), _div0(sum_lx, sum_l2), np.float32(0))


def _fit_iq4(x: np.ndarray, ntry: int = 7) -> np.ndarray:
    """ggml's ``quantize_row_iq4_nl_impl`` search over the last axis (no importance matrix,
    so weights x**2): the scale d of x ~ d*IQ4_VALUES[q], best in weighted least squares
    over 2*ntry + 2 trial scales, with either sign (the grid is not symmetric)."""
    mx = _signed_absmax(x)
    live = np.abs(mx) >= GROUP_MAX_EPS
    w = x * x

    def fit(iscale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        q = IQ4_VALUES[_iq4_index(iscale[..., None] * x)]
        return (w * q * x).sum(axis=-1), (w * q * q).sum(axis=-1)

    sum_qx, sum_q2 = fit(_div0(-IQ4_VALUES[0], mx))
    scale = _div0(sum_qx, sum_q2)
    best = scale * sum_qx
    for itry in range(-ntry, ntry + 1):
        sqx, sq2 = fit(_div0(itry + IQ4_VALUES[0], mx))
        better = (sq2 > 0) & (sqx * sqx > best * sq2)
        scale = np.where(better, _div0(sqx, sq2), scale)
        best = np.where(better, scale * sqx, best)
    return np.where(live, scale, np.float32(0))


def _quantize_scales(values: np.ndarray, top: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sub-block scales (or offsets) >= 0, (n_blocks, n_sub) -> their codes in [0, top] on a
    per-block float16 step max/top, as ggml's k-quant references do; returns (codes, step
    bytes, each sub-block's stored scale code*step)."""
    vmax = values.max(axis=-1)
    codes = _codes(_div0(top, vmax)[:, None] * values, 0, top).astype(np.uint8)
    raw, step = _f16(vmax / top)
    return codes, raw, step[:, None] * codes


def _requant_affine(x: np.ndarray, scale: np.ndarray, offset: np.ndarray, nmax: int) -> np.ndarray:
    """Codes of x against the stored sub-block scales and offsets: x ~ scale*q - offset
    (code 0 where the scale is 0, which decodes to -offset whatever the code)."""
    return _codes(_div0(x + offset[..., None], scale[..., None]), 0, nmax).astype(np.uint8)


# ---------------------------------------------------------------- the formats


def _pack_2bit(q: np.ndarray) -> np.ndarray:
    """(n, 256) codes of 2 bits -> (n, 64): byte 32*h + l holds elements 128*h + 32*s + l
    at bits 2*s (the qs of Q2_K and Q3_K)."""
    return _or_shifted(q.reshape(-1, 2, 4, 32), [0, 2, 4, 6], axis=2)


def _pack_nibbles_64(q: np.ndarray) -> np.ndarray:
    """(n, 256) codes of 4 bits -> (n, 128): byte 32*h + l holds elements 64*h + l (low)
    and 64*h + 32 + l (high), the qs of Q4_K and Q5_K."""
    return _or_shifted(q.reshape(-1, 4, 2, 32), [0, 4], axis=2)


def _pack_bitplane(bits: np.ndarray) -> np.ndarray:
    """(n, 256) single bits -> (n, 32): bit j of byte l is element 32*j + l (Q3_K's hmask and
    Q5_K's qh)."""
    return _or_shifted(bits.reshape(-1, 8, 32), list(range(8)), axis=1)


def _pack_k4_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and eight 6-bit offsets -> the 12 bytes of Q4_K/Q5_K
    (``get_scale_min_k4``): the low six bits of the first four of each in bytes 0-7, the
    last four split into nibbles (bytes 8-11) and two high bits (bits 6-7 of bytes 0-7)."""
    head_sc = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    head_mn = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    tail = (sc[:, 4:] & 0xF) | ((mn[:, 4:] & 0xF) << 4)
    return _bytes(head_sc, head_mn, tail)


def _affine_k_quant(blocks: Blocks, nmax: int, rmin: float, nstep: int) -> tuple[np.ndarray, ...]:
    """The shared part of Q4_K and Q5_K (``quantize_row_q{4,5}_K_ref``): eight sub-blocks of
    32 with 6-bit scales and offsets; returns (d, dmin, scales bytes, codes (n, 256))."""
    x = blocks.reshape(-1, 8, 32)
    rms = np.sqrt((x * x).mean(axis=-1, keepdims=True))
    scales, offsets = _fit_affine(x, rms + np.abs(x), nmax, rmin, 0.1, nstep, mad=False)
    sc, d, scale = _quantize_scales(scales, 63)
    mn, dmin, offset = _quantize_scales(offsets, 63)
    q = _requant_affine(x, scale, offset, nmax).reshape(-1, QK_K)
    return d, dmin, _pack_k4_scales(sc, mn), q


def _q2_k(blocks: Blocks) -> np.ndarray:
    """Q2_K: sixteen sub-blocks of 16, 2-bit codes, 4-bit scales and offsets
    (``quantize_row_q2_K_ref``). Layout: scales[16] (scale | offset << 4), qs[64], d, dmin."""
    x = blocks.reshape(-1, 16, 16)
    scales, offsets = _fit_affine(x, np.abs(x), 3, -0.5, 0.1, 15, mad=True)
    sc, d, scale = _quantize_scales(scales, 15)
    mn, dmin, offset = _quantize_scales(offsets, 15)
    q = _requant_affine(x, scale, offset, 3).reshape(-1, QK_K)
    return _bytes(sc | (mn << 4), _pack_2bit(q), d, dmin)


def _q3_k(blocks: Blocks) -> np.ndarray:
    """Q3_K: sixteen sub-blocks of 16, signed 3-bit codes q in [-4, 3] (two low bits in qs,
    the third in hmask, set when q >= 0), signed 6-bit scales on one float16 step
    (``quantize_row_q3_K_ref``). Layout: hmask[32], qs[64], scales[12], d."""
    x = blocks.reshape(-1, 16, 16)
    scales = _fit_q3(x)
    max_scale = _signed_absmax(scales)
    iscale = _div0(-32, max_scale)
    sc = _codes(iscale[:, None] * scales, -32, 31)
    d, step = _f16(_div0(1, iscale))
    scale = step[:, None] * sc
    q = (_codes(_div0(x, scale[..., None]), -4, 3) + 4).astype(np.uint8).reshape(-1, QK_K)
    # ggml leaves all scale bytes 0 for an all-zero block
    sc6 = np.where(max_scale[:, None] != 0, sc + 32, 0).astype(np.uint8)
    low = sc6 & 0xF
    scale_bytes = _bytes(
        low[:, :8] | (low[:, 8:] << 4),
        # byte 8 + k: two high bits of sub-block 4*s + k at bits 2*s
        _or_shifted((sc6 >> 4).reshape(-1, 4, 4), [0, 2, 4, 6], axis=1),
    )
    return _bytes(_pack_bitplane(q >> 2), _pack_2bit(q & 3), scale_bytes, d)


def _q4_k(blocks: Blocks) -> np.ndarray:
    """Q4_K: eight sub-blocks of 32, 4-bit codes, 6-bit scales and offsets
    (``quantize_row_q4_K_ref``). Layout: d, dmin, scales[12], qs[128]."""
    d, dmin, scales, q = _affine_k_quant(blocks, 15, -1.0, 20)
    return _bytes(d, dmin, scales, _pack_nibbles_64(q))


def _q5_k(blocks: Blocks) -> np.ndarray:
    """Q5_K: Q4_K with a fifth code bit in a bit plane (``quantize_row_q5_K_ref``).
    Layout: d, dmin, scales[12], qh[32], qs[128]."""
    d, dmin, scales, q = _affine_k_quant(blocks, 31, -0.5, 15)
    return _bytes(d, dmin, scales, _pack_bitplane(q >> 4), _pack_nibbles_64(q & 0xF))


def _q6_k(blocks: Blocks) -> np.ndarray:
    """Q6_K: sixteen sub-blocks of 16, signed 6-bit codes, int8 scales on one float16 step
    (``quantize_row_q6_K_ref``). Layout: ql[128], qh[64], scales[16], d."""
    x = blocks.reshape(-1, 16, 16)
    scales = _fit_symmetric(x, 32)
    max_scale = _signed_absmax(scales)
    live = np.abs(max_scale) >= GROUP_MAX_EPS  # else ggml writes an all-zero block
    iscale = np.where(live, _div0(-128, max_scale), np.float32(0))
    sc = np.minimum(127, _codes(iscale[:, None] * scales, -128, 127))
    d, step = _f16(_div0(1, iscale))
    scale = step[:, None] * sc
    q = np.where(live[:, None, None], _codes(_div0(x, scale[..., None]), -32, 31) + 32, 0)
    q = q.astype(np.uint8).reshape(-1, 2, 2, 2, 32)  # (n, 128-half h, nibble, 32-half, l)
    # ql[64*h + 32*half + l] holds element 128*h + 64*nibble + 32*half + l
    ql = _or_shifted(q & 0xF, [0, 4], axis=2)
    # qh[32*h + l] holds the top two bits of element 128*h + 32*s + l at bits 2*s
    qh = _or_shifted((q >> 4).reshape(-1, 2, 4, 32), [0, 2, 4, 6], axis=2)
    return _bytes(ql, qh, sc.astype(np.int8).view(np.uint8), d)


def _iq4_nibbles(q: np.ndarray) -> np.ndarray:
    """(..., 32) level indices -> (..., 16): byte j holds elements j (low) and 16 + j."""
    return q[..., :16] | (q[..., 16:] << 4)


def _iq4_nl(blocks: Blocks) -> np.ndarray:
    """IQ4_NL: blocks of 32 on the non-linear 16-level grid with a float16 scale
    (``quantize_iq4_nl`` without an importance matrix, i.e. with the scale search that
    llama-quantize runs; the bare ``_ref`` skips it). Layout: d, qs[16]."""
    d, scale = _f16(_fit_iq4(blocks))
    q = _iq4_index(_div0(1, scale)[:, None] * blocks)
    return _bytes(d, _iq4_nibbles(q))


def _iq4_xs(blocks: Blocks) -> np.ndarray:
    """IQ4_XS: IQ4_NL's grid in super-blocks of 256, eight sub-blocks of 32 with signed 6-bit
    scales on one float16 step (``quantize_iq4_xs``). Layout: d, scales_h (uint16, two bits
    per sub-block), scales_l[4] (a nibble per sub-block), qs[128]."""
    x = blocks.reshape(-1, 8, 32)
    scales = _fit_iq4(x)
    d, step = _f16(-_signed_absmax(scales) / 32)
    sc = _codes(_div0(1, step)[:, None] * scales, -32, 31)
    scale = step[:, None] * sc
    q = _iq4_index(_div0(1, scale)[..., None] * x)
    sc6 = (sc + 32).astype(np.uint8)
    scales_l = (sc6[:, 0::2] & 0xF) | ((sc6[:, 1::2] & 0xF) << 4)
    scales_h = _or_shifted(sc6 >> 4, list(range(0, 16, 2)), axis=1).astype("<u2")
    return _bytes(d, scales_h.view(np.uint8), scales_l, _iq4_nibbles(q))


QUANTIZERS: dict[GGMLQuantizationType, Callable[[Blocks], np.ndarray]] = {
    GGMLQuantizationType.Q2_K: _q2_k,
    GGMLQuantizationType.Q3_K: _q3_k,
    GGMLQuantizationType.Q4_K: _q4_k,
    GGMLQuantizationType.Q5_K: _q5_k,
    GGMLQuantizationType.Q6_K: _q6_k,
    GGMLQuantizationType.IQ4_NL: _iq4_nl,
    GGMLQuantizationType.IQ4_XS: _iq4_xs,
}
"""The types this module quantises itself; :func:`quantize` hands any other to gguf-py."""


def quantize(data: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """Quantise ``data`` (float, (..., K) with K a multiple of the type's block size) to
    ``qtype``'s raw blocks: uint8 (..., K // block_size * type_size), the layout
    ``gguf.quants.quantize`` returns and ``GGUFWriter.add_tensor(name, raw,
    raw_dtype=qtype)`` writes. Types other than :data:`QUANTIZERS`' go to
    ``gguf.quants.quantize`` (which raises NotImplementedError for those it lacks)."""
    quantizer = QUANTIZERS.get(qtype)
    if quantizer is None:
        return gguf.quants.quantize(data, qtype)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    data = np.asarray(data, dtype=np.float32)
    if data.ndim == 0 or data.shape[-1] % block_size:
        raise ValueError(
            f"{qtype.name} needs rows of a multiple of {block_size} values, got shape {data.shape}"
        )
    if not np.isfinite(data).all():
        raise ValueError(f"{qtype.name} cannot hold inf or nan")
    raw = quantizer(data.reshape(-1, block_size))
    assert raw.shape == (data.size // block_size, type_size), (qtype.name, raw.shape)
    return raw.reshape(*data.shape[:-1], data.shape[-1] // block_size * type_size)
