"""FlashAttention forward kernels for sm_90a (CuTe DSL): the prefill kernel and the decode
kernel, two classes over :class:`~.base.FlashFwdSm90Base`.

Modules: ``base`` (launch, pipelines, the MMA warpgroups' tile loop), ``mainloop`` (per key
block: wgmmas, softmax, masks), ``lazy_reference`` (Tile.lazy_reference's steps and guard),
``epilogue`` (O and LSE stores), ``ptx`` (inline-PTX wrappers), ``state`` (what the warps
carry), ``prefill``, ``decode``, ``prefill_fp8`` and ``decode_fp8`` (the kernel classes; ``fp8``:
what the FP8 ones share)."""

from .decode import FlashFwdSm90Decode
from .decode_fp8 import FlashFwdSm90DecodeFp8
from .prefill import FlashFwdSm90Prefill
from .prefill_fp8 import FlashFwdSm90PrefillFp8


def kernel_class(cfg):
    """The kernel class of an sm_90a forward configuration (fa4_aot.configs.KernelConfig)."""
    if cfg.fp8:
        return FlashFwdSm90DecodeFp8 if cfg.decode else FlashFwdSm90PrefillFp8
    return FlashFwdSm90Decode if cfg.decode else FlashFwdSm90Prefill


__all__ = ["FlashFwdSm90Prefill", "FlashFwdSm90Decode", "FlashFwdSm90DecodeFp8",
           "FlashFwdSm90PrefillFp8", "kernel_class"]
