"""fa4_aot: ahead-of-time compiled FlashAttention forward kernels.

``import fa4_aot`` loads no cutlass module and does no GPU work (it imports torch and registers
the ``torch.ops.fa4_aot.fwd`` operator); the first call of :func:`attention` loads the needed
cubin through cuda-python.
"""

from .interface import attention, check_varlen

try:
    import torch  # noqa: F401
except ImportError:  # the build imports fa4_aot.configs / fa4_aot.abi without torch
    pass
else:
    from . import ops  # noqa: F401  (registers torch.ops.fa4_aot.fwd)

__all__ = ["attention", "check_varlen"]
__version__ = "0.1.0"
