"""Loading cubins and launching them through cuda-python (cuda.bindings.driver).

Generic over the manifest's launch record (``fa4_aot/abi.py``): a :class:`LaunchPlan` per
kernel packs the parameters into one host buffer and calls ``cuLaunchKernelEx`` on the
caller's stream. Nothing here knows
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


_SCALAR_FORMATS = {"ptr": ("<Q", int), "i64": ("<q", int), "i32": ("<i", int), "f32": ("<f", float)}


class LaunchPlan:
    """How one kernel's parameters are laid out and packed, worked out once per launch record.

    Every parameter gets a 64-byte aligned slot in one host buffer; scalars and int tuples are
    written with precompiled ``struct.Struct`` objects, TMA descriptors copied in from the
    descriptor cache, ``static`` placeholders stay zero. The buffer, the array of parameter
    pointers into it and the ``CUlaunchConfig`` objects are kept per thread and reused: the
    driver copies the parameter values when ``cuLaunchKernelEx`` is called, so the next call
    may overwrite them."""

    def __init__(self, params: list[dict]):
        self.params = params
        self.offsets, pos = [], 0
        self.fields = []  # (offset, Struct, value names, cast) for scalars and tuples
        self.tensormaps = []  # (offset, param)
        for p in params:
            pos = (pos + 63) & ~63
            self.offsets.append(pos)
            kind = p["kind"]
            if kind == "tensormap":
                self.tensormaps.append((pos, p))
                size = 128
            elif kind == "i32_tuple":
                st = struct.Struct(f"<{len(p['values'])}i")
                self.fields.append((pos, st, tuple(p["values"]), int))
                size = st.size
            elif kind in _SCALAR_FORMATS:
                fmt, cast = _SCALAR_FORMATS[kind]
                st = struct.Struct(fmt)
                self.fields.append((pos, st, (p["value"],), cast))
                size = st.size
            elif kind == "static":
                size = p["size"]
            else:
                raise ValueError(f"unknown parameter kind {kind!r} in the manifest")
            if size != p["size"]:
                raise ValueError(f"parameter {p['name']}: packed {size} bytes, record says {p['size']}")
            pos += size
        self.size = pos
        self._local = threading.local()

    def _state(self):
        st = getattr(self._local, "state", None)
        if st is None:
            raw = ctypes.create_string_buffer(self.size + 64)  # zeroed: static params stay 0
            base = (ctypes.addressof(raw) + 63) & ~63
            buf = (ctypes.c_char * self.size).from_address(base)
            ptrs = (ctypes.c_void_p * len(self.offsets))(*[base + o for o in self.offsets])
            st = self._local.state = (raw, buf, ptrs, {})
        return st

    def pack(self, values: dict, tensors: dict):
        """Write every parameter into this thread's buffer; returns the buffer."""
        _, buf, _, _ = self._state()
        for off, st, names, cast in self.fields:
            st.pack_into(buf, off, *[cast(values[n]) for n in names])
        for off, p in self.tensormaps:
            buf[off:off + 128] = tensormap_bytes(p, tensors[p["tensor"]])
        return buf

    def launch(self, kernel, grid: tuple, block: list, smem: int, stream_handle: int,
               values: dict, tensors: dict, cluster: list | None = None):
        """Pack and ``cuLaunchKernelEx`` on the given stream."""
        self.pack(values, tensors)
        _, _, ptrs, configs = self._state()
        key = (int(kernel), tuple(grid), tuple(block), smem, stream_handle,
               tuple(cluster or (1, 1, 1)))
        hit = configs.get(key)
        if hit is None:
            if len(configs) > 64:
                configs.clear()
            hit = configs[key] = _launch_config(kernel, grid, block, smem, stream_handle, cluster)
        cfg, func = hit
        _check(_driver().cuLaunchKernelEx(cfg, func, ctypes.addressof(ptrs), 0), "cuLaunchKernelEx")


_plans: dict = {}


def launch_plan(name: str, params: list[dict]) -> LaunchPlan:
    """The (cached) plan of a manifest kernel."""
    plan = _plans.get(name)
    if plan is None or plan.params is not params:
        plan = _plans[name] = LaunchPlan(params)
    return plan


def pack_params(params: list[dict], values: dict, tensors: dict) -> list[bytes]:
    """One bytes object per kernel parameter, each exactly ``size`` bytes (what
    :class:`LaunchPlan` writes into its buffer, sliced per parameter).

    Pure function of the record and the values (no GPU work except ``tensormap`` encoding),
    so it is tested on the CPU against the PTX entry signatures."""
    plan = LaunchPlan(params)
    buf = plan.pack(values, tensors)
    return [bytes(buf[off:off + p["size"]]) for off, p in zip(plan.offsets, params)]


def _launch_config(kernel, grid, block, smem, stream_handle, cluster):
    drv = _driver()
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
    return cfg, drv.CUfunction(int(kernel))
