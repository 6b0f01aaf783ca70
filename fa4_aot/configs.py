"""The configuration space: every kernel fa4_aot builds and ships is listed here, once.

Both sides read this module: the build (``build_tools/build.py``) compiles one cubin per
:class:`KernelConfig` in :data:`CONFIG_SPACE`, and the runtime selects among the configurations
that the manifest says were built. Pure Python, no cutlass, no torch.

A configuration's :attr:`KernelConfig.name` is stable: it names the kernel's files under
``artifacts/`` and its key in ``artifacts/manifest.json``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable

ARCHS = ("sm_90a",)
DTYPES = ("bf16", "fp16")
HEAD_DIMS = (64, 128)
SCHEDULERS = ("single", "static", "steal")

# Threads per CTA of the sm_90a forward kernel: one producer warpgroup + two MMA warpgroups.
SM90_THREADS = 384


@dataclass(frozen=True)
class Tile:
    """Tile shape and pipeline depth chosen per (arch, head_dim)."""

    m: int
    n: int
    kv_stages: int


# Tile shapes per head_dim on sm_90a (each MMA warpgroup owns 64 rows of the m tile).
SM90_TILES = {
    64: Tile(m=128, n=128, kv_stages=3),
    128: Tile(m=128, n=128, kv_stages=2),
}


@dataclass(frozen=True)
class KernelConfig:
    arch: str
    dtype: str
    head_dim: int
    causal: bool
    scheduler: str
    trace: bool = False
    # Experimental kernel variant (tokens joined by "-", e.g. "noovl-nopp"); "" = the shipped
    # kernel. Variants are built on demand for measurements (build.py --variants), never shipped.
    variant: str = ""

    def __post_init__(self):
        if self.arch not in ARCHS:
            raise ValueError(f"arch must be one of {ARCHS}, got {self.arch!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.head_dim not in HEAD_DIMS:
            raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {self.head_dim!r}")
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler must be one of {SCHEDULERS}, got {self.scheduler!r}")

    @property
    def tile(self) -> Tile:
        return SM90_TILES[self.head_dim]

    @property
    def name(self) -> str:
        mask = "causal" if self.causal else "full"
        t = self.tile
        name = (
            f"fwd_{self.arch}_{self.dtype}_hd{self.head_dim}_{mask}_{self.scheduler}"
            f"_m{t.m}n{t.n}s{t.kv_stages}"
        )
        name += "_trace" if self.trace else ""
        return name + ("_v_" + self.variant.replace("-", "_") if self.variant else "")

    @property
    def key(self) -> tuple:
        """What the runtime selects on (everything but the tile, which follows from it)."""
        return (self.arch, self.dtype, self.head_dim, self.causal, self.scheduler, self.trace,
                self.variant)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["tile"] = dataclasses.asdict(self.tile)
        return d

    @staticmethod
    def from_dict(d: dict) -> "KernelConfig":
        fields = {f.name for f in dataclasses.fields(KernelConfig)}
        return KernelConfig(**{k: v for k, v in d.items() if k in fields})


def _space() -> Iterable[KernelConfig]:
    for arch in ARCHS:
        for dtype in DTYPES:
            for hd in HEAD_DIMS:
                for causal in (False, True):
                    for sched in SCHEDULERS:
                        yield KernelConfig(arch, dtype, hd, causal, sched)
    # The schedule-trace variant: one configuration, not in the fast path.
    yield KernelConfig("sm_90a", "bf16", 128, True, "steal", trace=True)


CONFIG_SPACE: tuple[KernelConfig, ...] = tuple(_space())


def by_name() -> dict[str, KernelConfig]:
    return {c.name: c for c in CONFIG_SPACE}
