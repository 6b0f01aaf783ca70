"""The GPU check scripts report a failure in their exit status (CPU: a fake compute-sanitizer)."""

import os
import shutil
import subprocess

import pytest

from conftest import ROOT

FAKE = """#!/usr/bin/env bash
# fake compute-sanitizer: prints what the real one would, from $FAKE_SUMMARY
echo "ok 0.5"
echo "========= $FAKE_SUMMARY"
exit ${FAKE_RC:-0}
"""


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("summary,rc,fails", [
    ("ERROR SUMMARY: 0 errors", 0, False),
    ("RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)", 0, False),
    ("ERROR SUMMARY: 2 errors", 0, True),
    ("RACECHECK SUMMARY: 3 hazards displayed (0 errors, 3 warnings)", 0, True),
    ("ERROR SUMMARY: 0 errors", 1, True),
])
def test_sanitize_exit_status(tmp_path, summary, rc, fails):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "compute-sanitizer"
    fake.write_text(FAKE)
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_SUMMARY": summary,
           "FAKE_RC": str(rc)}
    r = subprocess.run(["bash", str(ROOT / "bench/sanitize.sh"), str(tmp_path)], cwd=ROOT,
                       env=env, capture_output=True, text=True)
    assert (r.returncode != 0) == fails, r.stdout + r.stderr
    assert ("FAILED" in r.stdout) == fails
