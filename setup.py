"""fa4_aot: ahead-of-time compiled FlashAttention forward kernels (cubins + thin runtime).

`pip install .` ships the committed artifacts (cubins + manifest.json) inside the package as
fa4_aot/_artifacts; the runtime needs torch and cuda-python only.
"""

import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPyWithArtifacts(build_py):
    """Copy artifacts/ (manifest, cubins, kept PTX and ptxas logs) into the package."""

    def run(self):
        super().run()
        src = ROOT / "artifacts"
        if not (src / "manifest.json").is_file():
            raise SystemExit("artifacts/manifest.json is missing: run `make build` first")
        dst = Path(self.build_lib) / "fa4_aot" / "_artifacts"
        if dst.exists():
            shutil.rmtree(dst)
        shutil.copytree(src, dst)


setup(
    name="fa4_aot",
    version="0.1.0",
    description="Ahead-of-time compiled FlashAttention forward with work-stealing scheduling",
    packages=find_packages(include=["fa4_aot", "fa4_aot.*"]),
    python_requires=">=3.10",
    install_requires=["torch>=2.4", "cuda-bindings>=12.8"],
    cmdclass={"build_py": BuildPyWithArtifacts},
)
