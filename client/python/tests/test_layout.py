"""The cffi declarations against the library itself."""
import numpy as np

import gpucd
from gpucd._ffi import ffi, lib


def test_tensor_struct_matches_the_library(client):
    with client.region(4096) as r:
        shape = ffi.new("int64_t[8]", [3, 5, 7, 11, 13, 17, 19, 23])
        t = lib.gpucd_tensor_region(r._ptr, 777, lib.GPUCD_I32, 8, shape)
        assert (t.dtype, t.ndim, list(t.shape), t.where, t.region, t.offset) == \
            (lib.GPUCD_I32, 8, [3, 5, 7, 11, 13, 17, 19, 23], lib.GPUCD_REGION, r._ptr, 777)
        assert t.resident == 0 and t.data == ffi.NULL


def test_info_and_version(client):
    info = client.info()
    assert info["backend"] in ("cpu", "cuda") and info["ready"] is True
    assert info["max_dims"] == 8 and info["protocol_version"] == 1
    assert "nmmo3_encode" in " ".join(info["operations"])
    assert info["multi_gpu"] == "not built" or (info["multi_gpu"].startswith("nccl ") and
                                                info["multi_gpu"].endswith(", no operations yet"))
    assert gpucd.__version__.count(".") == 2
    t = gpucd.Timings()
    client.ping(timings=t)
    assert t.round_trip_us > 0 and t.total_us <= t.round_trip_us


def test_dtypes_sizes_match_the_library():
    for code, nd in gpucd.dtypes.NUMPY.items():
        assert lib.gpucd_dtype_size(code) == nd.itemsize


def test_to_bf16_rounds_to_nearest_even():
    x = np.array([1.0, 1.00390625, 1.01171875, -2.5, np.inf, np.nan], np.float32)
    bits = gpucd.to_bf16(x)
    np.testing.assert_array_equal(bits[:5], [0x3F80, 0x3F80, 0x3F82, 0xC020, 0x7F80])
    assert np.isnan(gpucd.from_bf16(bits)[5])


def test_pool_structs_match_the_library(daemon):
    o = ffi.new("gpucd_pool_options *")
    lib.gpucd_pool_options_init(o)
    assert (o.client.timeout_ms, o.client.spin_us, o.probe_min_ms, o.probe_max_ms,
            o.probe_timeout_ms) == (30000, 0, 100, 5000, 2000)
    with gpucd.Pool([daemon.url]) as pool:
        pool.run(lambda c: c.ping())
        assert pool.stats() == [{"url": daemon.url, "up": True, "last_error": 0, "calls": 1,
                                 "failures": 0, "retries": 0, "downs": 0, "in_flight": 0,
                                 "connected": True}]
