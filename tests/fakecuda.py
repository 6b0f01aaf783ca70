"""A stand-in for ``cuda.bindings.driver`` and the CUDA-only bits of ``fa4_aot.interface``, so
that the whole host path (memo, packing, descriptor patching, launch) runs on CPU tensors.

``install(monkeypatch)`` swaps them in and returns the fake driver; every launch is recorded as
(kernel, grid, block, shared memory, stream, parameter buffer bytes, parameter offsets)."""

from __future__ import annotations

import ctypes
import zlib


class _Names:
    """Enum namespace: any attribute is its own name."""

    def __getattr__(self, name):
        return name


class _Int(int):
    pass


class _Success(int):
    name = "CUDA_SUCCESS"


class _Result(int):
    @property
    def name(self):
        return f"CUDA_ERROR_{int(self)}"


class FakeConfig:
    attrs = ()
    numAttrs = 0


class FakeTmap:
    def __init__(self, words):
        self.opaque = [_Int(w) for w in words]


class FakeDriver:
    """``addr_word``: the 8-byte word of the descriptor holding the global address (None: the
    address is stored shifted right by 4 bits in word 1, i.e. not patchable)."""

    CUresult = _Names()
    CUtensorMapDataType = _Names()
    CUtensorMapInterleave = _Names()
    CUtensorMapSwizzle = _Names()
    CUtensorMapL2promotion = _Names()
    CUtensorMapFloatOOBfill = _Names()
    CUfunction_attribute = _Names()
    CUlaunchAttributeID = _Names()

    def __init__(self, addr_word=3, fail_launch=False):
        self.addr_word = addr_word
        self.fail_launch = fail_launch
        self.encodes = 0
        self.boxes = []  # the box of every descriptor encoded, in order
        self.launches = []
        self.record = True  # False: count launches only (profiling)
        self.count = 0

    # value wrappers
    cuuint64_t = staticmethod(int)
    cuuint32_t = staticmethod(int)
    CUstream = staticmethod(int)

    @staticmethod
    def CUfunction(x):
        return int(x)

    CUlaunchConfig = FakeConfig

    def cuGetErrorString(self, err):
        return _Success(0), b"fake error"

    def cuTensorMapEncodeTiled(self, dtype, rank, address, dims, strides, box, *rest):
        """``rest``: element strides, interleave, swizzle, L2 promotion, OOB fill (the
        driver's arguments, in its order)."""
        elem_strides, *modes = rest
        self.encodes += 1
        self.boxes.append([int(x) for x in box])
        desc = repr((dtype, rank, list(dims), list(strides), list(box), list(elem_strides),
                     *modes)).encode()
        words = [zlib.crc32(desc + bytes([i])) | (i << 40) for i in range(16)]
        if self.addr_word is None:
            words[1] = (words[1] & ~((1 << 44) - 1)) | (address >> 4)
        else:
            words[self.addr_word] = address
        return _Success(0), FakeTmap(words)

    def cuLaunchKernelEx(self, cfg, func, params, extra):
        if self.fail_launch:
            return (_Result(700),)
        if not self.record:
            self.count += 1
            return (_Success(0),)
        n, size = cfg.param_count, cfg.buffer_size
        ptrs = (ctypes.c_void_p * n).from_address(params)
        base = ptrs[0]
        data = ctypes.string_at(base, size)
        self.launches.append({"func": func, "grid": (cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ),
                              "block": (cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ),
                              "smem": cfg.sharedMemBytes, "stream": cfg.hStream,
                              "buffer": data, "offsets": [p - base for p in ptrs]})
        return (_Success(0),)


def fwd_params(dtype="bf16", head_dim=128, tile_m=128, tile_n=128):
    """The sm_90a forward parameter list of whichever launch ABI fa4_aot.abi defines."""
    from fa4_aot import abi
    if hasattr(abi, "fwd_params"):
        return abi.fwd_params(dtype, head_dim, tile_m, tile_n)
    return abi.ptx_params(abi.FWD_SM90, dtype, head_dim, tile_m, tile_n)


_SPACES = {}


def _space(configs):
    return _SPACES.setdefault(id(configs), frozenset(configs))


class FakeManifest:
    """Every configuration of fa4_aot.configs.CONFIG_SPACE exists (and nothing else, as in a
    full build); records are what the build writes (``abi.launch_record``). ``found`` lists
    the lookups."""

    def __init__(self):
        self.found = []
        self.records = {}

    def find(self, arch, dtype, head_dim, causal, scheduler, trace=False, local=False,
             softcap=False, **kw):
        from fa4_aot.configs import CONFIG_SPACE, KernelConfig
        self.found.append((arch, dtype, head_dim, causal, scheduler, trace, local, softcap))
        cfg = KernelConfig(arch, dtype, head_dim, causal, scheduler, trace=trace, local=local,
                           softcap=softcap, **kw)
        if cfg not in _space(CONFIG_SPACE):
            raise ValueError(f"no fa4_aot kernel {cfg.name} (not in CONFIG_SPACE)")
        return self._record(cfg)

    def _record(self, cfg):
        from fa4_aot import abi
        name = "fake_" + cfg.name
        if name not in self.records:
            self.records[name] = {"arch": cfg.arch, "entry": name, "config": cfg.to_dict(),
                                  "launch": abi.launch_record(cfg, 200000)}
        return name, self.records[name]

    @property
    def kernels(self):
        """{name: record} of every configuration (what the planner's refusals read)."""
        from fa4_aot.configs import CONFIG_SPACE
        for cfg in CONFIG_SPACE:
            self._record(cfg)
        return self.records

    def cubin_bytes(self, name):
        return b"\0"


def install(monkeypatch, addr_word=3, sms=132, arch="sm_90a", stream=0x5000):
    """Patch fa4_aot so that CPU tensors take the CUDA path with a fake driver and manifest."""
    from fa4_aot import buffers, interface, prepared, runtime
    drv = FakeDriver(addr_word)
    drv.manifest = FakeManifest()
    monkeypatch.setattr(interface, "load_manifest", lambda: drv.manifest)
    monkeypatch.setattr(runtime, "_driver", lambda: drv)
    monkeypatch.setattr(runtime, "_encoder", None)  # resolved again: from the fake driver
    monkeypatch.setattr(runtime, "_fields", {})
    monkeypatch.setattr(runtime, "_images", type(runtime._images)())
    monkeypatch.setattr(runtime, "_tmap_cache", type(runtime._tmap_cache)())
    monkeypatch.setattr(runtime, "get_kernel", lambda index, name, cubin, rec: 0xC0DE)
    monkeypatch.setattr(interface, "_DEVICE_TYPE", "cpu")
    monkeypatch.setattr(interface, "_raw_stream", lambda index: drv.stream)
    monkeypatch.setattr(interface, "_device_arch", lambda device: arch)
    monkeypatch.setattr(interface, "num_sms", lambda device: sms)
    monkeypatch.setattr(prepared, "_capturing", lambda: False)
    monkeypatch.setattr(buffers, "_counters", {})
    drv.stream = stream
    orig_init = runtime.Launcher.__init__

    def init(self, kernel, template, *a, **kw):
        orig_init(self, kernel, template, *a, **kw)
        self.cfg.param_count = len(template.offsets)  # read back by the fake launch
        self.cfg.buffer_size = len(template.image)
    monkeypatch.setattr(runtime.Launcher, "__init__", init)
    interface.clear_memo()
    return drv


