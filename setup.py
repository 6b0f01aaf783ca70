"""fa4_aot: ahead-of-time compiled FlashAttention forward kernels (cubins + thin runtime).

`pip install .` ships the committed cubins and artifacts/manifest.json inside the package as
fa4_aot/_artifacts: what the runtime loads. The PTX and the ptxas -v logs stay in artifacts/
(and the sdist): the wheel holds no .ptx / .log files. `build_tools/spill_report.py --manifest
<site-packages>/fa4_aot/_artifacts/manifest.json` still reports every kernel (from the manifest
records and the cubins). The runtime needs torch, cuda-bindings and numpy (torch warns "Failed to
initialize NumPy" on import without it).
"""

import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
# What stays out of the wheel: the PTX (3/4 of artifacts/), the ptxas logs, editor/temp files.
NOT_SHIPPED = ("*.ptx", "*.log", "*.tmp", ".*")


class BuildPyWithArtifacts(build_py):
    """Copy artifacts/ (manifest and cubins; no PTX, no ptxas logs) into the package."""

    def run(self):
        super().run()
        src = ROOT / "artifacts"
        if not (src / "manifest.json").is_file():
            raise SystemExit("artifacts/manifest.json is missing: run `make build` first")
        dst = Path(self.build_lib) / "fa4_aot" / "_artifacts"
        if dst.exists():
            shutil.rmtree(dst)
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns(*NOT_SHIPPED))


setup(
    name="fa4_aot",
    version="0.1.0",
    description="Ahead-of-time compiled FlashAttention forward with work-stealing scheduling",
    packages=find_packages(include=["fa4_aot", "fa4_aot.*"]),
    python_requires=">=3.10",
    install_requires=["torch>=2.4", "cuda-bindings>=12.8", "numpy"],
    cmdclass={"build_py": BuildPyWithArtifacts},
)
