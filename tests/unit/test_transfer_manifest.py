"""Weight manifest: aligned layout, zero-copy unpack, chunk checksums, strict JSON round-trip."""
import json

import numpy as np
import pytest

from gyre_hpc.errors import TransferError
from gyre_hpc.transfer.manifest import ALIGNMENT, WeightManifest, pack_weights, plan_layout, unpack_weights


def weights():
    rng = np.random.default_rng(0)
    return {
        "embed.weight": rng.standard_normal((37, 16)).astype(np.float32),
        "layers.0.bias": np.arange(5, dtype=np.int64),
        "layers.0.mask": np.array([True, False, True]),
        "head.weight": rng.standard_normal((3, 7)).astype(np.float16),
        "scalar": np.float64(2.5),
        "empty": np.zeros((0, 4), dtype=np.float32),
    }


def test_offsets_are_aligned_ordered_and_disjoint():
    entries, total = plan_layout(weights())
    assert [e.name for e in entries] == list(weights())
    end = 0
    for e in entries:
        assert e.offset % ALIGNMENT == 0 and e.offset >= end
        end = e.offset + e.nbytes
    assert total == end


@pytest.mark.parametrize("algorithm", ["xxh3_64", "crc32"])
def test_unpack_returns_equal_arrays_as_views_of_the_buffer(algorithm):
    w = weights()
    data, manifest = pack_weights(w, version=4, algorithm=algorithm, chunk_bytes=100)
    out = unpack_weights(data, manifest)
    for name, array in w.items():
        assert out[name].dtype == np.asarray(array).dtype and out[name].shape == np.shape(array)
        np.testing.assert_array_equal(out[name], array)
        assert np.shares_memory(out[name], data) or out[name].size == 0
    data[manifest.tensors[0].offset] ^= 0xFF  # a write through the buffer shows in the view: no copy was made
    assert not np.array_equal(out["embed.weight"], w["embed.weight"])


def test_non_contiguous_input_is_packed_by_value():
    base = np.arange(24, dtype=np.int32).reshape(4, 6)
    data, manifest = pack_weights({"t": base.T, "s": base[:, ::2]})
    out = unpack_weights(data, manifest)
    np.testing.assert_array_equal(out["t"], base.T)
    np.testing.assert_array_equal(out["s"], base[:, ::2])


def test_changed_byte_is_found_in_its_chunk_and_named_tensor():
    data, manifest = pack_weights(weights(), chunk_bytes=256)
    assert manifest.bad_chunks(data) == []
    entry = next(e for e in manifest.tensors if e.name == "head.weight")
    data[entry.offset + 3] ^= 0x01
    bad = manifest.bad_chunks(data)
    assert bad == [(entry.offset + 3) // 256]
    assert "head.weight" in manifest.tensors_in(bad[0])


def test_whole_buffer_checksum_depends_on_every_chunk():
    w = weights()
    _, m1 = pack_weights(w, chunk_bytes=128)
    w["layers.0.bias"] = w["layers.0.bias"] + 1
    _, m2 = pack_weights(w, chunk_bytes=128)
    assert m1.checksum != m2.checksum and len(m1.checksum) == 16


def test_manifest_survives_json_round_trip():
    _, manifest = pack_weights(weights(), version=7, chunk_bytes=300)
    again = WeightManifest.from_dict(json.loads(json.dumps(manifest.to_dict())))
    assert again == manifest


@pytest.mark.parametrize("path, value, message", [
    (("version",), -1, r"manifest: version"),
    (("tensors", 1, "offset"), 65, r"manifest\.tensors\[1\]\.offset: 65 is not"),
    (("tensors", 0, "dtype"), "nonsense", r"manifest\.tensors\[0\]\.dtype: 'nonsense'"),
    (("tensors", 0, "nbytes"), 8, r"manifest\.tensors\[0\]\.nbytes: 8 does not match"),
    (("tensors", 2, "offset"), 0, r"manifest\.tensors\[2\]\.offset: 0 overlaps"),
    (("total_bytes",), 1 << 30, r"manifest\.total_bytes: 1073741824 but the last tensor ends"),
    (("checksum_algorithm",), "md5", r"manifest\.checksum_algorithm: 'md5' is not one of"),
    (("chunk_checksums",), ["00"], r"manifest\.chunk_checksums: expected \d+ 16-digit"),
    (("tensors", 0, "shape"), [1.5], r"manifest\.tensors\[0\]\.shape"),
])
def test_malformed_manifest_names_the_field(path, value, message):
    _, manifest = pack_weights(weights())
    data = json.loads(json.dumps(manifest.to_dict()))
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(TransferError, match=message):
        WeightManifest.from_dict(data)


def test_missing_field_is_named():
    _, manifest = pack_weights(weights())
    data = manifest.to_dict()
    del data["tensors"][0]["name"]
    with pytest.raises(TransferError, match=r"manifest\.tensors\[0\]\.name: missing"):
        WeightManifest.from_dict(data)


def test_object_dtype_and_bad_names_are_rejected():
    with pytest.raises(TransferError, match="dtype object cannot travel"):
        pack_weights({"x": np.array([object()])})
    with pytest.raises(TransferError, match="non-empty strings"):
        pack_weights({"": np.zeros(2)})


def test_unpack_rejects_a_short_buffer():
    data, manifest = pack_weights(weights())
    with pytest.raises(TransferError, match=f">= {manifest.total_bytes} bytes"):
        unpack_weights(data[:-1], manifest)
