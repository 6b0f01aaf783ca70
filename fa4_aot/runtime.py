"""Loading cubins and launching them through cuda-python (cuda.bindings.driver).

Generic over the manifest's launch record (``fa4_aot/abi.py``): it builds one byte buffer per
kernel parameter and calls ``cuLaunchKernelEx`` on the caller's stream. Nothing here knows
what the kernel computes.

Imports ``cuda.bindings`` lazily, on the first launch, so ``import fa4_aot`` stays cheap and
works on machines without CUDA.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from collections import OrderedDict

from .abi import AXES

_lock = threading.Lock()
_modules: dict = {}  # (device index, kernel name) -> (library, kernel handle)


class CudaError(RuntimeError):
    pass


def _driver():
    try:
        from cuda.bindings import driver
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise ImportError("fa4_aot needs cuda-python (pip install cuda-bindings) to launch "
                          "kernels") from e
    return driver


def _check(result, what: str):
    err, *rest = result if isinstance(result, tuple) else (result,)
    drv = _driver()
    if err != drv.CUresult.CUDA_SUCCESS:
        _, msg = drv.cuGetErrorString(err)
        raise CudaError(f"{what} failed: {err.name}: {msg.decode() if msg else ''}")
    return rest[0] if len(rest) == 1 else rest


def get_kernel(device_index: int, name: str, cubin: bytes, record: dict):
    """Load (once per device) and return the kernel handle for a manifest entry."""
    key = (device_index, name)
    with _lock:
        hit = _modules.get(key)
        if hit is not None:
            return hit[1]
        drv = _driver()
        lib = _check(drv.cuLibraryLoadData(cubin, None, None, 0, None, None, 0),
                     f"cuLibraryLoadData({name})")
        kernel = _check(drv.cuLibraryGetKernel(lib, record["entry"].encode()),
                        f"cuLibraryGetKernel({record['entry']})")
        dev = _check(drv.cuDeviceGet(device_index), "cuDeviceGet")
        smem = record["launch"]["dynamic_smem_bytes"]
        _check(drv.cuKernelSetAttribute(
            drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem, kernel, dev), f"setting {smem} bytes of dynamic shared memory for {name}")
        _modules[key] = (lib, kernel)
        return kernel


_TMA_DTYPE = {"bf16": "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16", "fp16": "CU_TENSOR_MAP_DATA_TYPE_FLOAT16"}
_SWIZZLE = {"128B": "CU_TENSOR_MAP_SWIZZLE_128B", "64B": "CU_TENSOR_MAP_SWIZZLE_64B",
            "32B": "CU_TENSOR_MAP_SWIZZLE_32B", "none": "CU_TENSOR_MAP_SWIZZLE_NONE"}
_L2 = {"none": "CU_TENSOR_MAP_L2_PROMOTION_NONE", "64B": "CU_TENSOR_MAP_L2_PROMOTION_L2_64B",
       "128B": "CU_TENSOR_MAP_L2_PROMOTION_L2_128B", "256B": "CU_TENSOR_MAP_L2_PROMOTION_L2_256B"}
_OOB = {"zero": "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE",
        "nan": "CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA"}


_TMAP_CACHE_SIZE = 1024
_tmap_cache: "OrderedDict[tuple, bytes]" = OrderedDict()


def tensormap_bytes(param: dict, tensor) -> bytes:
    """Encode the CUtensorMap a ``tensormap`` parameter describes, for a (b, s, h, d) tensor.

    Cached (LRU) on everything the descriptor depends on — address, dims, strides, dtype and
    the record's box/swizzle/L2/OOB settings — because steady-state callers (benchmarks,
    serving loops with a caching allocator) pass the same buffers again and again and an
    encode through cuda-python costs tens of microseconds."""
    axes = [AXES[d] for d in param["dims"]]
    elem = tensor.element_size()
    dims = tuple(tensor.shape[a] for a in axes)
    strides = tuple(tensor.stride(a) * elem for a in axes[1:])
    key = (tensor.data_ptr(), dims, strides, param["dtype"], tuple(param["box"]),
           param["swizzle"], param["l2_promotion"], param["oob_fill"])
    with _lock:
        hit = _tmap_cache.get(key)
        if hit is not None:
            _tmap_cache.move_to_end(key)
            return hit
    drv = _driver()
    tmap = _check(drv.cuTensorMapEncodeTiled(
        getattr(drv.CUtensorMapDataType, _TMA_DTYPE[param["dtype"]]),
        len(dims), tensor.data_ptr(),
        [drv.cuuint64_t(x) for x in dims], [drv.cuuint64_t(x) for x in strides],
        [drv.cuuint32_t(x) for x in param["box"]], [drv.cuuint32_t(1)] * len(dims),
        drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        getattr(drv.CUtensorMapSwizzle, _SWIZZLE[param["swizzle"]]),
        getattr(drv.CUtensorMapL2promotion, _L2[param["l2_promotion"]]),
        getattr(drv.CUtensorMapFloatOOBfill, _OOB[param["oob_fill"]]),
    ), f"cuTensorMapEncodeTiled({param['name']})")
    data = struct.pack("<16Q", *[int(x) for x in tmap.opaque])
    with _lock:
        _tmap_cache[key] = data
        if len(_tmap_cache) > _TMAP_CACHE_SIZE:
            _tmap_cache.popitem(last=False)
    return data


def pack_params(params: list[dict], values: dict, tensors: dict) -> list[bytes]:
    """One bytes object per kernel parameter, each exactly ``size`` bytes.

    Pure function of the record and the values (no GPU work except ``tensormap`` encoding),
    so it is tested on the CPU against the PTX entry signatures."""
    out = []
    for p in params:
        kind = p["kind"]
        if kind == "tensormap":
            b = tensormap_bytes(p, tensors[p["tensor"]])
        elif kind == "i32_tuple":
            b = struct.pack(f"<{len(p['values'])}i", *(int(values[v]) for v in p["values"]))
        elif kind == "ptr":
            b = struct.pack("<Q", int(values[p["value"]]))
        elif kind == "i64":
            b = struct.pack("<q", int(values[p["value"]]))
        elif kind == "i32":
            b = struct.pack("<i", int(values[p["value"]]))
        elif kind == "f32":
            b = struct.pack("<f", float(values[p["value"]]))
        elif kind == "static":
            b = bytes(p["size"])
        else:
            raise ValueError(f"unknown parameter kind {kind!r} in the manifest")
        if len(b) != p["size"]:
            raise ValueError(f"parameter {p['name']}: packed {len(b)} bytes, record says {p['size']}")
        out.append(b)
    return out


def launch(kernel, grid: tuple, block: list, smem: int, stream_handle: int, packed: list[bytes],
           cluster: list | None = None):
    """cuLaunchKernelEx with one host pointer per parameter (the driver copies the values at
    launch, so the host buffer only has to live for the call)."""
    drv = _driver()
    offsets, pos = [], 0
    for b in packed:  # one contiguous host buffer, each parameter 64-byte aligned
        pos = (pos + 63) & ~63
        offsets.append(pos)
        pos += len(b)
    buf = ctypes.create_string_buffer(pos + 64)
    base = (ctypes.addressof(buf) + 63) & ~63
    for off, b in zip(offsets, packed):
        ctypes.memmove(base + off, b, len(b))
    ptrs = (ctypes.c_void_p * len(packed))(*[base + off for off in offsets])
    cfg = drv.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block
    cfg.sharedMemBytes = smem
    cfg.hStream = drv.CUstream(stream_handle)
    if cluster and list(cluster) != [1, 1, 1]:
        a = drv.CUlaunchAttribute()
        a.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z = cluster
        cfg.attrs = [a]
        cfg.numAttrs = 1
    _check(drv.cuLaunchKernelEx(cfg, drv.CUfunction(int(kernel)), ctypes.addressof(ptrs), 0),
           "cuLaunchKernelEx")
