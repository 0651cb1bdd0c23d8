"""The GGUF header reader (models/gguf/header.py) against gguf-py's GGUFReader."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from recallspec.errors import ModelLoadError
from recallspec.models import resolve_model
from recallspec.models.gguf.header import read_header

ARRAY = gguf.GGUFValueType.ARRAY


def assert_like_reader(path: Path) -> None:
    header = read_header(path)
    reader = gguf.GGUFReader(path)
    scalars = {k: f.contents() for k, f in reader.fields.items()
               if not k.startswith("GGUF.") and f.types[0] != ARRAY}
    assert header.metadata == scalars
    assert [(t.name, t.ggml_type, t.shape, t.offset, t.n_bytes) for t in header.tensors] == [
        (t.name, t.tensor_type, tuple(int(d) for d in reversed(t.shape)), t.data_offset,
         t.n_bytes) for t in reader.tensors]


def test_real_file_like_reader() -> None:
    assert_like_reader(resolve_model(None))


@pytest.mark.parametrize("endian", [gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG])
def test_written_file_like_reader(tmp_path: Path, endian: gguf.GGUFEndian) -> None:
    """Every value type, arrays of strings and of arrays, an odd alignment, both byte
    orders, tensors of several types."""
    path = tmp_path / "t.gguf"
    w = gguf.GGUFWriter(path, "llama", endianess=endian)
    w.add_custom_alignment(64)
    w.add_uint8("a.u8", 7)
    w.add_int8("a.i8", -7)
    w.add_uint16("a.u16", 700)
    w.add_int16("a.i16", -700)
    w.add_uint32("a.u32", 70000)
    w.add_int32("a.i32", -70000)
    w.add_float32("a.f32", 0.1)
    w.add_bool("a.bool", True)
    w.add_uint64("a.u64", 1 << 40)
    w.add_int64("a.i64", -(1 << 40))
    w.add_float64("a.f64", 0.1)
    w.add_string("a.str", "héllo")
    w.add_array("a.strings", ["x", "", "yz" * 50])
    w.add_array("a.ints", [1, 2, 3])
    w.add_array("a.nested", [[1, 2], [3]])
    rng = np.random.default_rng(0)
    w.add_tensor("f32", rng.standard_normal((3, 32)).astype(np.float32))
    q = gguf.quants.quantize(rng.standard_normal((4, 64)).astype(np.float32), T.Q8_0)
    w.add_tensor("q8", q, raw_dtype=T.Q8_0)
    w.add_tensor("norm", rng.standard_normal(32).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert_like_reader(path)
    reader = gguf.GGUFReader(path)
    h = read_header(path, arrays={"a.strings", "a.nested"})
    # (GGUFReader flattens a nested array's values: that one is checked against what was
    # written)
    assert h.array_counts == {"a.strings": 3, "a.ints": 3, "a.nested": 2}
    assert h.arrays == {"a.strings": reader.fields["a.strings"].contents(),
                        "a.nested": [[1, 2], [3]]}
    h = read_header(path)
    assert h.arrays == {}
    assert h.metadata["a.str"] == "héllo" and h.metadata["general.alignment"] == 64
    assert [t.shape for t in h.tensors] == [(3, 32), (4, 64), (32,)]
    assert all(t.offset % 64 == 0 for t in h.tensors)


def test_errors(tmp_path: Path) -> None:
    src = resolve_model(None).read_bytes()
    cases = {"empty": b"", "magic": b"GGUX" + src[4:], "header": src[:200_000],
             "data": src[:len(src) - 1000]}
    for name, data in cases.items():
        p = tmp_path / f"{name}.gguf"
        p.write_bytes(data)
        with pytest.raises(ModelLoadError, match=r"corrupt or truncated|not a GGUF"):
            read_header(p)


def test_a_type_we_do_not_read(tmp_path: Path) -> None:
    """A Q3_K tensor (a type the kernels do not read, outside ggml_types' table): its size
    comes from gguf, its type stays a bare id, and the quantized path names it."""
    from recallspec.kernels.ggml_types import GGMLType, type_name
    from recallspec.kernels.qlinear import QuantizedWeight

    path = tmp_path / "q3.gguf"
    w = gguf.GGUFWriter(path, "llama")
    raw = np.arange(4 * 110, dtype=np.uint8).reshape(4, 110)  # 4 rows of one 256-block
    w.add_tensor("q3", raw, raw_dtype=T.Q3_K)
    w.add_tensor("q8", gguf.quants.quantize(np.ones((2, 32), np.float32), T.Q8_0),
                 raw_dtype=T.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert_like_reader(path)
    q3, q8 = read_header(path).tensors
    assert not isinstance(q3.ggml_type, GGMLType) and q3.ggml_type == int(T.Q3_K)
    assert (q3.shape, q3.n_bytes) == ((4, 256), 440)
    assert type_name(q3.ggml_type) == "Q3_K"
    assert q8.ggml_type is GGMLType.Q8_0
    with pytest.raises(ValueError, match="Q3_K is not supported"):
        QuantizedWeight.from_gguf_rows(q3.ggml_type, 4, 256, [(0, raw)])
