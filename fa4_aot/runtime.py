"""Loading cubins and launching them through cuda-python (cuda.bindings.driver).

Generic over the manifest's launch record (``fa4_aot/abi.py``). Two layers:

* :class:`ParamLayout` (one per kernel record) lays the parameters out in one host buffer
  (64-byte aligned slots) and turns a dict of launch values into the bytes of that buffer:
  :meth:`ParamLayout.pack` packs everything (the reference, used by :func:`pack_params`), and
  :meth:`ParamLayout.template` packs everything that does not change from call to call and
  returns where the per-call addresses go (:class:`Template`).
* :class:`Launcher` (one per memoized call site and thread, built by ``fa4_aot.interface``) holds
  a template in its own parameter buffer, the parameter-pointer array and the
  ``CUlaunchConfig``; a call writes the 8-byte addresses of that call's tensors (its record of
  :data:`ADDRESSES`) into the buffer and calls ``cuLaunchKernelEx`` on the caller's stream. The
  driver copies the parameters when ``cuLaunchKernelEx`` is called, so the next call may
  overwrite the buffer.

TMA descriptors (``CUtensorMap``, 128 opaque bytes) are encoded once per prepared call with
``cuTensorMapEncodeTiled``; only their global-address field changes per call. The position of
that field is not assumed: :func:`tensormap_template` encodes a descriptor of each layout at two
addresses and accepts the layout only if the two images differ exactly in one 8-byte
little-endian field that holds the address (:func:`address_field`). Otherwise the descriptor is
re-encoded per address (:func:`tensormap_image`, LRU-cached).

Nothing here knows what the kernel computes. Imports ``cuda.bindings`` lazily, on the first
launch, so ``import fa4_aot`` stays cheap and works on machines without CUDA.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from collections import OrderedDict
from functools import lru_cache
from typing import NamedTuple

from .abi import AXES, SPECS

_lock = threading.Lock()
_modules: dict = {}  # (device index, kernel name, cubin sha256) -> (library, kernel handle)

# The per-call addresses: the launch ABI's pointer parameters (every family's, in spec order)
# whose values change from call to call; the work-stealing counter is the stream's, fixed per
# prepared call. A call's record is a list in this order, indexed by name through SLOT (the
# ``slot`` of a :class:`PerCall` value); the TMA descriptor of tensor t takes slot "<t>_ptr".
ADDRESSES = tuple(dict.fromkeys(a.name for spec in SPECS.values() for a in spec.args()
                                if a.kind == "ptr" and a.name != "sched_ptr"))
SLOT = {name: i for i, name in enumerate(ADDRESSES)}


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
    if err:  # CUresult is an int enum; CUDA_SUCCESS == 0
        drv = _driver()
        _, msg = drv.cuGetErrorString(err)
        name = getattr(err, "name", str(err))
        raise CudaError(f"{what} failed: {name}: "
                        f"{msg.decode() if isinstance(msg, bytes) else (msg or '')}")
    return rest[0] if len(rest) == 1 else rest


def get_kernel(device_index: int, name: str, cubin: bytes, record: dict):
    """Load (once per device and cubin: two artifact folders may hold different cubins of one
    name) and return the kernel handle for a manifest entry."""
    key = (device_index, name, record.get("sha256"))
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


# ------------------------------------------------------------------------------ TMA descriptors
_TMA_DTYPE = {"bf16": "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16", "fp16": "CU_TENSOR_MAP_DATA_TYPE_FLOAT16",
              "e4m3": "CU_TENSOR_MAP_DATA_TYPE_UINT8"}  # e4m3: TMA moves bytes
_SWIZZLE = {"128B": "CU_TENSOR_MAP_SWIZZLE_128B", "64B": "CU_TENSOR_MAP_SWIZZLE_64B",
            "32B": "CU_TENSOR_MAP_SWIZZLE_32B", "none": "CU_TENSOR_MAP_SWIZZLE_NONE"}
_L2 = {"none": "CU_TENSOR_MAP_L2_PROMOTION_NONE", "64B": "CU_TENSOR_MAP_L2_PROMOTION_L2_64B",
       "128B": "CU_TENSOR_MAP_L2_PROMOTION_L2_128B", "256B": "CU_TENSOR_MAP_L2_PROMOTION_L2_256B"}
_OOB = {"zero": "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE",
        "nan": "CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA"}

TMAP_BYTES = 128
# A second address for the layout probe: the first one with bits 4..46 flipped in a pattern
# (stays 16-byte aligned, differs from it in every byte of the low six).
_PROBE_XOR = 0x5A5A_5A5A_5A50
_TMAP_CACHE_SIZE = 1024
_tmap_cache: "OrderedDict[tuple, bytes]" = OrderedDict()  # full images, per address (fallback)
_fields: dict = {}  # descriptor layout -> address field offset, or None (not patchable)
_images: "OrderedDict[tuple, bytes]" = OrderedDict()  # settings key -> image (patchable layouts)
_UNKNOWN = object()


def tma_view(param: dict, shape, stride, elem_bytes: int) -> tuple:
    """(dims, byte strides) of the descriptor a ``tensormap`` parameter describes, for a
    (b, s, h, d) tensor of this shape and element stride."""
    return _view(tuple(AXES[d] for d in param["dims"]), shape, stride, elem_bytes)


def _view(axes: tuple, shape, stride, elem_bytes: int) -> tuple:
    return (tuple([shape[a] for a in axes]),
            tuple([stride[a] * elem_bytes for a in axes[1:]]))


def resolve_box(param: dict, values: dict) -> dict:
    """The ``tensormap`` record with its box as numbers: a box entry may name a launch value
    (the decode kernels' ``kv_box_rows``)."""
    if all(isinstance(x, int) for x in param["box"]):
        return param
    return {**param, "box": [values[x] if isinstance(x, str) else x for x in param["box"]]}


def _modes(param) -> tuple:
    return param["dtype"], param["swizzle"], param["l2_promotion"], param["oob_fill"]


def _keys(dims: tuple, strides: tuple, box: tuple, modes: tuple) -> tuple:
    """(settings key, layout key) of a descriptor: its image is a function of the first; the
    layout of its bytes (where the address goes) of the second, which leaves out the tensor's
    dims and strides."""
    return (dims, strides, box, modes), (len(dims), box, modes)


def _param_keys(param: dict, dims: tuple, strides: tuple) -> tuple:
    return _keys(dims, strides, tuple(param["box"]), _modes(param))


_ENCODE_ARGS = (ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p,
                ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int)
_encoder = None  # _raw_encoder(): (function, enum values, interleave none), or False


def _raw_encoder():
    """The driver's ``cuTensorMapEncodeTiled`` called through ctypes (its C signature:
    CUtensorMap*, data type, rank, address, dims, strides, box, element strides, interleave,
    swizzle, L2 promotion, OOB fill), with the enum values it takes; False where the driver
    does not give its address (then cuda-python's binding encodes, slower: it converts each
    argument to a Python object)."""
    global _encoder
    if _encoder is None:
        _encoder = False
        try:
            drv = _driver()
            res = drv.cuGetProcAddress(b"cuTensorMapEncodeTiled", 12000, 0)
            pfn = int(res[1]) if not res[0] else 0
        except Exception:  # noqa: BLE001 - no such entry point: the binding encodes
            pfn = 0
        if pfn:
            enums = {}
            for table, enum in ((_TMA_DTYPE, drv.CUtensorMapDataType),
                                (_SWIZZLE, drv.CUtensorMapSwizzle),
                                (_L2, drv.CUtensorMapL2promotion),
                                (_OOB, drv.CUtensorMapFloatOOBfill)):
                enums.update({k: int(getattr(enum, v)) for k, v in table.items()})
            fn = ctypes.CFUNCTYPE(ctypes.c_int, *_ENCODE_ARGS)(pfn)
            interleave = int(drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE)
            _encoder = (fn, enums, interleave)
    return _encoder


def encode_tensormap(param: dict, dims: tuple, strides: tuple, address: int) -> bytes:
    """One ``cuTensorMapEncodeTiled``: the 128-byte image."""
    raw = _raw_encoder()
    if raw:
        fn, enums, interleave = raw
        n = len(dims)
        out = (ctypes.c_uint64 * 16)()
        err = fn(out, enums[param["dtype"]], n, address, (ctypes.c_uint64 * n)(*dims),
                 (ctypes.c_uint64 * max(n - 1, 1))(*strides),
                 (ctypes.c_uint32 * n)(*param["box"]), (ctypes.c_uint32 * n)(*[1] * n),
                 interleave, enums[param["swizzle"]], enums[param["l2_promotion"]],
                 enums[param["oob_fill"]])
        if not err:
            return bytes(out)
        # an error: the binding encodes again and raises it with the driver's message
    drv = _driver()
    tmap = _check(drv.cuTensorMapEncodeTiled(
        getattr(drv.CUtensorMapDataType, _TMA_DTYPE[param["dtype"]]),
        len(dims), address,
        [drv.cuuint64_t(x) for x in dims], [drv.cuuint64_t(x) for x in strides],
        [drv.cuuint32_t(x) for x in param["box"]], [drv.cuuint32_t(1)] * len(dims),
        drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        getattr(drv.CUtensorMapSwizzle, _SWIZZLE[param["swizzle"]]),
        getattr(drv.CUtensorMapL2promotion, _L2[param["l2_promotion"]]),
        getattr(drv.CUtensorMapFloatOOBfill, _OOB[param["oob_fill"]]),
    ), f"cuTensorMapEncodeTiled({param['name']})")
    return struct.pack("<16Q", *[int(x) for x in tmap.opaque])


def tensormap_image(param: dict, dims: tuple, strides: tuple, address: int) -> bytes:
    """The descriptor for one address, LRU-cached on everything it depends on (the fallback
    when the address field cannot be patched: steady-state callers with a caching allocator
    pass the same buffers again and again)."""
    key = (address,) + _param_keys(param, dims, strides)[0]
    with _lock:
        hit = _tmap_cache.get(key)
        if hit is not None:
            _tmap_cache.move_to_end(key)
            return hit
    data = encode_tensormap(param, dims, strides, address)
    with _lock:
        _tmap_cache[key] = data
        if len(_tmap_cache) > _TMAP_CACHE_SIZE:
            _tmap_cache.popitem(last=False)
    return data


def address_field(image_a: bytes, address_a: int, image_b: bytes, address_b: int):
    """Byte offset of the global-address field, from two encodes of one descriptor at two
    addresses: the offset ``o`` (a multiple of 8) where ``image_a[o:o+8]`` is ``address_a`` and
    ``image_b[o:o+8]`` is ``address_b`` (little endian), every other byte being equal. None when
    no such field exists (the driver stores the address some other way: re-encode per call)."""
    if len(image_a) != len(image_b) or address_a == address_b:
        return None
    la, lb = address_a.to_bytes(8, "little"), address_b.to_bytes(8, "little")
    for off in range(0, len(image_a) - 7, 8):
        if (image_a[off:off + 8] == la and image_b[off:off + 8] == lb
                and image_a[:off] == image_b[:off] and image_a[off + 8:] == image_b[off + 8:]):
            return off
    return None


def tensormap_template(param: dict, dims: tuple, strides: tuple, address: int):
    """(image for ``address``, offset of the address field or None). The field is located once
    per descriptor layout (:func:`_keys`) by a second encode at a probe address
    (:func:`address_field`); every later encode of that layout must hold the address there
    (else it is located again). Images are kept per (dims, strides, settings) (LRU), so a
    descriptor seen before is only patched. With no such field the image goes to the
    per-address cache the launcher re-encodes through (:func:`tensormap_image`)."""
    return _tensormap_template(param, dims, strides, address,
                               *_param_keys(param, dims, strides))


def _tensormap_template(param, dims, strides, address, key, layout):
    with _lock:
        off = _fields.get(layout, _UNKNOWN)
        image = _images.get(key)
        if image is not None:
            _images.move_to_end(key)
    if off is None:
        return tensormap_image(param, dims, strides, address), None
    if image is None:
        image = encode_tensormap(param, dims, strides, address)
        if off is _UNKNOWN or (off is not None
                               and image[off:off + 8] != address.to_bytes(8, "little")):
            probe = address ^ _PROBE_XOR
            try:
                off = address_field(image, address,
                                    encode_tensormap(param, dims, strides, probe), probe)
            except CudaError:
                off = None
        with _lock:
            _fields[layout] = off
            if off is None:
                _tmap_cache[(address,) + key] = image
                return image, None
            _images[key] = image
            if len(_images) > _TMAP_CACHE_SIZE:
                _images.popitem(last=False)
    return image[:off] + address.to_bytes(8, "little") + image[off + 8:], off


def tensormap_bytes(param: dict, tensor) -> bytes:
    """The CUtensorMap a ``tensormap`` parameter describes, for a (b, s, h, d) tensor."""
    dims, strides = tma_view(param, tensor.shape, tensor.stride(), tensor.element_size())
    return tensormap_image(param, dims, strides, tensor.data_ptr())


# ------------------------------------------------------------------------------ parameters
_SCALAR_FORMATS = {"ptr": ("<Q", int), "i64": ("<q", int), "i32": ("<i", int), "f32": ("<f", float)}


class PerCall(NamedTuple):
    """A launch value known only at call time: the call's address of ``slot``, a name of
    :data:`ADDRESSES` (e.g. ``PerCall("o_ptr")``). Only ``ptr`` parameters take one."""

    slot: str


class TensorView(NamedTuple):
    """What a ``tensormap`` parameter needs of a tensor: its 4-D (b, s, h, d) shape and element
    strides, element size, the address it has now, and its per-call slot (ADDRESSES)."""

    shape: tuple
    stride: tuple
    elem_bytes: int
    address: int
    slot: str


class Template(NamedTuple):
    """A parameter buffer with everything but the per-call addresses filled in."""

    image: bytes
    offsets: tuple  # byte offset of each parameter
    ptr_patches: tuple  # (byte offset, slot): 8-byte addresses written per call
    tmap_patches: tuple  # (byte offset, param, dims, strides, slot): re-encoded per call


class _Tmap:
    """A ``tensormap`` parameter of a layout, worked out once for :meth:`ParamLayout.template`:
    its offset, the tensor it describes, the (b, s, h, d) axes of its dims (:func:`tma_view`),
    its modes (:func:`_modes`) and its box (an entry may name a launch value:
    :func:`resolve_box`)."""

    __slots__ = ("offset", "param", "tensor", "axes", "modes", "box", "named", "_by_box")

    def __init__(self, offset: int, param: dict):
        self.offset, self.param, self.tensor = offset, param, param["tensor"]
        self.axes = tuple(AXES[d] for d in param["dims"])
        self.modes = _modes(param)
        self.box = tuple(param["box"])
        self.named = any(isinstance(x, str) for x in self.box)
        self._by_box = {}  # resolved box -> the record with it (resolve_box's)

    def resolved(self, values: dict):
        """(the record with its box resolved, the box as numbers)."""
        if not self.named:
            return self.param, self.box
        box = tuple([values[x] if isinstance(x, str) else x for x in self.box])
        p = self._by_box.get(box)
        if p is None:
            p = self._by_box[box] = resolve_box(self.param, values)
        return p, box


class ParamLayout:
    """How one kernel's parameters are laid out and packed, worked out once per launch record.

    Every parameter gets a 64-byte aligned slot in one buffer; scalars and int tuples are
    written with precompiled ``struct.Struct`` objects, TMA descriptors come from the
    descriptor encoder, ``static`` placeholders stay zero."""

    def __init__(self, params: list[dict]):
        self.params = params
        self.offsets, pos = [], 0
        self.fields = []  # (offset, Struct, value names, cast, kind) for scalars and tuples
        self.tmaps = []  # the tensormap parameters (_Tmap)
        for p in params:
            pos = (pos + 63) & ~63
            self.offsets.append(pos)
            kind = p["kind"]
            if kind == "tensormap":
                self.tmaps.append(_Tmap(pos, p))
                size = TMAP_BYTES
            elif kind == "i32_tuple":
                st = struct.Struct(f"<{len(p['values'])}i")
                self.fields.append((pos, st, tuple(p["values"]), int, kind))
                size = st.size
            elif kind in _SCALAR_FORMATS:
                fmt, cast = _SCALAR_FORMATS[kind]
                st = struct.Struct(fmt)
                self.fields.append((pos, st, (p["value"],), cast, kind))
                size = st.size
            elif kind == "static":
                size = p["size"]
            else:
                raise ValueError(f"unknown parameter kind {kind!r} in the manifest")
            if size != p["size"]:
                raise ValueError(f"parameter {p['name']}: packed {size} bytes, record says {p['size']}")
            pos += size
        self.size = (pos + 7) & ~7
        # every scalar and tuple in one Struct (pad bytes between them), for template()
        fmt, end, self.names, self.ptr_fields = ["<"], 0, [], []
        for off, st, names, _, kind in self.fields:
            fmt.append(f"{off - end}x{st.format.lstrip('<')}")
            end = off + st.size
            if kind == "ptr":
                self.ptr_fields.append((len(self.names), off))
            self.names.extend(names)
        self.scalars = struct.Struct("".join(fmt))

    def pack(self, values: dict, tensors: dict):
        """Every parameter, packed into a fresh zeroed buffer (``tensors``: the (b, s, h, d)
        tensors the descriptors describe). The reference packer."""
        buf = (ctypes.c_char * self.size)()
        for off, st, names, cast, _ in self.fields:
            st.pack_into(buf, off, *[cast(values[n]) for n in names])
        for t in self.tmaps:
            p = resolve_box(t.param, values)
            buf[t.offset:t.offset + TMAP_BYTES] = tensormap_bytes(p, tensors[t.tensor])
        return buf

    def template(self, values: dict, views: dict) -> Template:
        """The constant part of the buffer; ``ptr`` values may be :class:`PerCall` (written per
        call), ``views`` maps each descriptor's tensor to a :class:`TensorView`. Byte for byte
        what :meth:`pack` writes for the same values and addresses."""
        vals = [values[n] for n in self.names]
        ptr_patches, tmap_patches = [], []
        for i, off in self.ptr_fields:
            if isinstance(vals[i], PerCall):
                ptr_patches.append((off, vals[i].slot))
                vals[i] = 0
        buf = bytearray(self.size)
        try:
            self.scalars.pack_into(buf, 0, *vals)
        except struct.error as e:
            bad = [(n, x) for n, x in zip(self.names, vals)
                   if isinstance(x, (PerCall, tuple)) or not isinstance(x, (int, float))]
            what = ("only pointer parameters take a per-call value"
                    if any(isinstance(x, PerCall) for _, x in bad) else str(e))
            raise ValueError(f"{[n for n, _ in bad]}: {what}") from None
        for t in self.tmaps:
            tv = views[t.tensor]
            dims, strides = _view(t.axes, tv.shape, tv.stride, tv.elem_bytes)
            p, box = t.resolved(values)
            image, field = _tensormap_template(p, dims, strides, tv.address,
                                               *_keys(dims, strides, box, t.modes))
            buf[t.offset:t.offset + TMAP_BYTES] = image
            if field is not None:
                ptr_patches.append((t.offset + field, tv.slot))
            else:
                tmap_patches.append((t.offset, p, dims, strides, tv.slot))
        return Template(bytes(buf), tuple(self.offsets), tuple(ptr_patches), tuple(tmap_patches))


_layouts: dict = {}


def param_layout(name: str, params: list[dict]) -> ParamLayout:
    """The (cached) parameter layout of a manifest kernel."""
    layout = _layouts.get(name)
    if layout is None or layout.params is not params:
        layout = _layouts[name] = ParamLayout(params)
    return layout


def pack_params(params: list[dict], values: dict, tensors: dict) -> list[bytes]:
    """One bytes object per kernel parameter, each exactly ``size`` bytes.

    Pure function of the record and the values (no GPU work except ``tensormap`` encoding),
    so it is tested on the CPU against the PTX entry signatures."""
    layout = ParamLayout(params)
    buf = layout.pack(values, tensors)
    return [bytes(buf[off:off + p["size"]]) for off, p in zip(layout.offsets, params)]


# ------------------------------------------------------------------------------ launching
class Launcher:
    """One kernel launch of a memoized call site, for one thread: the template in its own
    64-byte aligned parameter buffer, the parameter-pointer array, the ``CUlaunchConfig`` (grid,
    block, shared memory, stream, cluster) and the 8-byte words to fill per call, each with
    its index in the call's address record (:data:`SLOT`)."""

    __slots__ = ("_raw", "buf", "u64", "ptrs", "params", "cfg", "func", "launch", "patches",
                 "tmaps", "template")

    def __init__(self, kernel, template: Template, grid: tuple, block, smem: int,
                 stream_handle: int, cluster=None):
        size = len(template.image)
        self._raw = ctypes.create_string_buffer(size + 64)
        base = (ctypes.addressof(self._raw) + 63) & ~63
        self.buf = (ctypes.c_char * size).from_address(base)
        self.u64 = (ctypes.c_uint64 * (size // 8)).from_address(base)
        self._take(template)
        n = len(template.offsets)
        self.ptrs = (ctypes.c_uint64 * n)()
        _u64s(n).pack_into(self.ptrs, 0, *[base + o for o in template.offsets])
        self.params = ctypes.addressof(self.ptrs)
        self.cfg, self.func = _launch_config(kernel, grid, block, smem, stream_handle, cluster)
        self.launch = _driver().cuLaunchKernelEx

    def _take(self, template: Template):
        """The template's bytes into the buffer, and where its per-call words go."""
        for off, _ in template.ptr_patches:
            if off % 8:
                raise ValueError(f"per-call address at byte {off} is not 8-byte aligned")
        ctypes.memmove(self.buf, template.image, len(template.image))
        self.patches = tuple((off // 8, SLOT[s]) for off, s in template.ptr_patches)
        self.tmaps = tuple((off, p, dims, strides, SLOT[s])
                           for off, p, dims, strides, s in template.tmap_patches)
        self.template = template

    def retarget(self, template: Template, grid: tuple):
        """Take the parameters of another call of the same kernel (``template``, of the same
        parameter layout) and ``grid``: a prepared call retargeted to new sizes. The driver
        copied the previous parameters at their launch: nothing in flight reads this buffer."""
        if len(template.image) != len(self.template.image):
            raise ValueError("retarget: a template of another parameter layout")
        self._take(template)
        self.cfg.gridDimX, self.cfg.gridDimY, self.cfg.gridDimZ = grid

    def __call__(self, addresses):
        """Write this call's addresses (its record: a sequence in :data:`ADDRESSES` order)
        and launch."""
        u64 = self.u64
        for i, s in self.patches:
            u64[i] = addresses[s]
        for off, p, dims, strides, s in self.tmaps:
            self.buf[off:off + TMAP_BYTES] = tensormap_image(p, dims, strides, addresses[s])
        err = self.launch(self.cfg, self.func, self.params, 0)[0]
        if err:
            _check((err,), "cuLaunchKernelEx")


@lru_cache(maxsize=None)
def _u64s(n: int) -> struct.Struct:
    return struct.Struct(f"<{n}Q")


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
