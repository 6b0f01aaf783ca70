"""fa4_aot: ahead-of-time compiled FlashAttention forward kernels.

``import fa4_aot`` loads no cutlass module and does no GPU work; the first call of
:func:`attention` loads the needed cubin through cuda-python.
"""

from .interface import attention

__all__ = ["attention"]
__version__ = "0.1.0"
