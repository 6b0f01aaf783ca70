"""Reading ``manifest.json`` and the cubins it lists. No GPU work, no cutlass.

The artifact folder is, in order: ``$FA4_AOT_ARTIFACTS``; the copy installed inside the
package (``fa4_aot/_artifacts``, put there by ``pip install .``); ``<repo>/artifacts``.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from functools import lru_cache
from pathlib import Path

from .configs import KernelConfig

SCHEMA_VERSION = 1
_PKG = Path(__file__).resolve().parent


class ManifestError(RuntimeError):
    pass


def artifacts_dir() -> Path:
    env = os.environ.get("FA4_AOT_ARTIFACTS")
    candidates = [Path(env)] if env else [_PKG / "_artifacts", _PKG.parent / "artifacts"]
    for c in candidates:
        if (c / "manifest.json").is_file():
            return c
    raise ManifestError(
        "no fa4_aot artifacts found (looked for manifest.json in "
        + ", ".join(str(c) for c in candidates)
        + "); run `make build` or install the package with its artifacts")


class Manifest:
    def __init__(self, root: Path):
        self.root = Path(root)
        path = self.root / "manifest.json"
        try:
            self.data = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ManifestError(f"cannot read {path}: {e}") from None
        if self.data.get("schema_version") != SCHEMA_VERSION:
            raise ManifestError(f"{path}: schema_version {self.data.get('schema_version')!r}, "
                                f"this fa4_aot reads {SCHEMA_VERSION}")
        self.kernels: dict[str, dict] = self.data["kernels"]
        self._by_key = {KernelConfig.from_dict(r["config"]).key: name
                        for name, r in self.kernels.items()}
        self._verified: dict[str, bytes] = {}
        self._found: dict[tuple, str] = {}  # find()'s arguments -> name (a planner miss is hot)
        self._lock = threading.Lock()

    def find(self, arch: str, dtype: str, head_dim: int, causal: bool, scheduler: str,
             trace: bool = False, local: bool = False, softcap: bool = False,
             **config) -> tuple[str, dict]:
        """The kernel of a configuration: (name, manifest record). ``config``: further
        :class:`KernelConfig` fields (left out: their defaults)."""
        args = (arch, dtype, head_dim, causal, scheduler, trace, local, softcap,
                tuple(sorted(config.items())))
        name = self._found.get(args)
        if name is not None:
            return name, self.kernels[name]
        try:
            key = KernelConfig(arch, dtype, head_dim, causal, scheduler, trace=trace,
                               local=local, softcap=softcap, **config).key
        except ValueError:  # not a configuration at all: report what was built
            key = None
        name = self._by_key.get(key)
        if name is not None:
            self._found[args] = name
        if name is None:
            avail = sorted({(c["arch"], c["dtype"], c["head_dim"])
                            for c in (r["config"] for r in self.kernels.values())})
            raise ValueError(
                f"no fa4_aot kernel for arch={arch}, dtype={dtype}, head_dim={head_dim}, "
                f"causal={causal}, local={local}, scheduler={scheduler}, softcap={softcap}"
                + "".join(f", {k}={v}" for k, v in config.items()) + "; built (arch, dtype, "
                "head_dim): "
                + ", ".join(f"({a}, {d}, {h})" for a, d, h in avail))
        return name, self.kernels[name]

    def cubin_bytes(self, name: str) -> bytes:
        """The cubin, checked against its sha256 the first time it is read."""
        with self._lock:
            if name not in self._verified:
                rec = self.kernels[name]
                path = self.root / rec["cubin"]
                try:
                    data = path.read_bytes()
                except OSError as e:
                    raise ManifestError(f"cubin for {name} missing: {path} ({e.strerror})") from None
                digest = hashlib.sha256(data).hexdigest()
                if digest != rec["sha256"]:
                    raise ManifestError(f"cubin {path} is corrupt: sha256 {digest[:16]}…, "
                                        f"manifest says {rec['sha256'][:16]}…")
                self._verified[name] = data
            return self._verified[name]


@lru_cache(maxsize=None)
def load_manifest(root: str | None = None) -> Manifest:
    return Manifest(Path(root) if root else artifacts_dir())
