"""The numpy GGUF quantisers of tests/gguf_quantizers.py, checked through gguf-py's own
``dequantize`` (the reader every GGUF test relies on): small error on random data, values
already on a format's grid coming back exactly (which pins every bit of the layout), blocks
that do not leak into each other, and a file written with GGUFWriter that reads back the same.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as QT

from tests.gguf_quantizers import IQ4_VALUES, QUANTIZERS, quantize

LEGACY = (QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0)
TYPES = (*QUANTIZERS, *LEGACY)

# Relative RMS error bounds on standard normal data, about 10% above the largest measured
# over the seeds and shapes of test_error_is_small (measured maxima in the comments).
ERROR_BOUND = {
    QT.Q2_K: 0.33,  # 0.301
    QT.Q3_K: 0.17,  # 0.153
    QT.Q4_K: 0.08,  # 0.073
    QT.Q5_K: 0.04,  # 0.0363
    QT.Q6_K: 0.02,  # 0.0178
    QT.IQ4_NL: 0.085,  # 0.077
    QT.IQ4_XS: 0.085,  # 0.078
    QT.Q4_0: 0.095,  # 0.087 (gguf-py's quantiser, for scale)
    QT.Q4_1: 0.09,  # 0.081
    QT.Q5_0: 0.05,  # 0.044
    QT.Q5_1: 0.043,  # 0.0385
    QT.Q8_0: 0.0062,  # 0.0055
}

SHAPES = ((8, 256), (4, 512))


def _normal(seed: int, shape: tuple[int, int]) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _round_trip(x: np.ndarray, qtype: QT) -> np.ndarray:
    return gguf.quants.dequantize(quantize(x, qtype), qtype)


def _rel_rms(y: np.ndarray, x: np.ndarray) -> float:
    return float(np.sqrt(np.mean((y - x) ** 2) / np.mean(x**2)))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_error_is_small(qtype: QT) -> None:
    errors = [
        _rel_rms(_round_trip(x, qtype), x)
        for seed in range(3)
        for shape in SHAPES
        for x in [_normal(seed, shape)]
    ]
    assert max(errors) < ERROR_BOUND[qtype], errors


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_raw_layout_size_and_determinism(qtype: QT) -> None:
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    for rows, k in SHAPES:
        x = _normal(rows + k, (rows, k))
        raw = quantize(x, qtype)
        assert raw.dtype == np.uint8
        assert raw.shape == (rows, k // block_size * type_size)
        assert np.array_equal(quantize(x.copy(), qtype), raw)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_blocks_are_quantised_independently(qtype: QT) -> None:
    """Vectorised over blocks, yet each block's bytes depend on that block alone: rows
    quantised one at a time, or reshaped, give the same bytes."""
    x = _normal(7, (6, 512))
    raw = quantize(x, qtype)
    assert np.array_equal(np.concatenate([quantize(row[None], qtype) for row in x]), raw)
    assert np.array_equal(quantize(x.reshape(12, 256), qtype).reshape(raw.shape), raw)


# (sub-block size, code range, levels or None for the codes themselves, scale range,
# offset range or None): how values on each format's grid are built, see _grid_values.
GRID = {
    QT.Q2_K: (16, (0, 3), None, (1, 15), (0, 15)),
    QT.Q3_K: (16, (-4, 3), None, (1, 32), None),
    QT.Q4_K: (32, (0, 15), None, (1, 63), (0, 63)),
    QT.Q5_K: (32, (0, 31), None, (1, 63), (0, 63)),
    QT.Q6_K: (16, (-32, 31), None, (1, 128), None),
    QT.IQ4_NL: (32, (0, 15), IQ4_VALUES, (1, 64), None),
    QT.IQ4_XS: (32, (0, 15), IQ4_VALUES, (1, 32), None),
    QT.Q4_0: (32, (-8, 7), None, (1, 64), None),
    QT.Q4_1: (32, (0, 15), None, (1, 64), (0, 64)),
    QT.Q5_0: (32, (-16, 15), None, (1, 64), None),
    QT.Q5_1: (32, (0, 31), None, (1, 64), (0, 64)),
    QT.Q8_0: (32, (-127, 127), None, (1, 64), None),
}


def _grid_values(qtype: QT, seed: int, rows: int, k: int) -> np.ndarray:
    """Random values the format holds exactly: 2**-7 * scale * level(code) - 2**-6 * offset,
    with integer scales and offsets. Each block has its largest scale and offset, and each
    sub-block its lowest code (the widest level of a symmetric grid) and its highest, so
    that the scales the quantiser derives from the extremes are these exactly."""
    sub, (qlo, qhi), levels, (slo, shi), offsets = GRID[qtype]
    block_size = GGML_QUANT_SIZES[qtype][0]
    rng = np.random.default_rng(seed)
    n_blocks, n_sub = rows * k // block_size, block_size // sub
    codes = rng.integers(qlo, qhi + 1, (n_blocks, n_sub, sub))
    codes[..., 0], codes[..., 1] = qlo, qhi
    scales = rng.integers(slo, shi + 1, (n_blocks, n_sub, 1))
    scales[:, 0] = shi
    value = codes.astype(np.float64) if levels is None else levels[codes].astype(np.float64)
    x = 2.0**-7 * scales * value
    if offsets is not None:
        off = rng.integers(offsets[0], offsets[1] + 1, (n_blocks, n_sub, 1))
        off[:, -1] = offsets[1]
        x -= 2.0**-6 * off
    assert np.array_equal(x.astype(np.float32), x)  # exact in float32
    return x.astype(np.float32).reshape(rows, k)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_values_on_the_grid_round_trip_exactly(qtype: QT) -> None:
    for seed, (rows, k) in enumerate(SHAPES):
        x = _grid_values(qtype, seed, rows, k)
        np.testing.assert_array_equal(_round_trip(x, qtype), x)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_zeros_stay_zero_without_warnings(qtype: QT) -> None:
    """All-zero rows, and a zero run of 32 (a whole sub-block in every format, so its scale
    is 0: the division-by-zero paths) inside random ones, decode to exact zeros, quietly."""
    x = _normal(3, (4, 512))
    x[0] = 0
    x[1, 32:64] = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = _round_trip(x, qtype)
    assert not y[0].any()
    assert not y[1, 32:64].any()


@pytest.mark.parametrize("qtype", LEGACY, ids=lambda t: t.name)
def test_legacy_types_are_gguf_py_s(qtype: QT) -> None:
    x = _normal(5, (4, 256))
    assert np.array_equal(quantize(x, qtype), gguf.quants.quantize(x, qtype))


def test_rejects_what_a_format_cannot_hold() -> None:
    with pytest.raises(ValueError, match="multiple of 256"):
        quantize(np.zeros((2, 288), np.float32), QT.Q4_K)
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize(np.zeros((2, 48), np.float32), QT.IQ4_NL)
    bad = np.zeros((1, 256), np.float32)
    bad[0, 3] = np.nan
    with pytest.raises(ValueError, match="nan"):
        quantize(bad, QT.Q6_K)


@pytest.mark.parametrize("qtype", list(QUANTIZERS), ids=lambda t: t.name)
def test_fast_enough_for_test_tensors(qtype: QT) -> None:
    """Tests quantise tensors of up to ~50k values; measured 10-60 ms each, so a second
    means someone brought back a Python loop per block."""
    x = _normal(0, (196, 256))
    start = time.perf_counter()
    quantize(x, qtype)
    assert time.perf_counter() - start < 1.0


def test_gguf_file_round_trip(tmp_path: Path) -> None:
    """One tensor of each type through GGUFWriter and GGUFReader: the same bytes, type and
    shape come back, and they decode to what was written."""
    path = tmp_path / "all-types.gguf"
    x = _normal(11, (4, 512))
    raws = {qtype: quantize(x, qtype) for qtype in TYPES}
    writer = gguf.GGUFWriter(path, "llama")
    for qtype, raw in raws.items():
        writer.add_tensor(f"t.{qtype.name}", raw, raw_shape=raw.shape, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    assert set(tensors) == {f"t.{qtype.name}" for qtype in TYPES}
    for qtype, raw in raws.items():
        tensor = tensors[f"t.{qtype.name}"]
        assert tensor.tensor_type == qtype
        assert tuple(tensor.shape) == (512, 4)  # ggml order: the row length first
        assert np.array_equal(tensor.data, raw)
        got = gguf.quants.dequantize(tensor.data, qtype)
        np.testing.assert_array_equal(got, gguf.quants.dequantize(raw, qtype))
        assert got.shape == x.shape
