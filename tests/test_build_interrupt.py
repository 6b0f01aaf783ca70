"""Ctrl-C / SIGTERM stop a real build within seconds and keep every finished kernel; a crashed
compile worker names its kernel and the others are kept (CPU: CuTe DSL + ptxas 13.1 from the
toolchain cache)."""

import hashlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import ROOT

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl not installed (make test installs it)")

# Three small combine kernels and one forward kernel (the slowest compile of the four).
ONLY = (r"^combine_sm_90a_bf16_hd(64|96|128)$|^combine_sm_90a_fp16_hd(64|96)$"
        r"|^fwd_sm_90a_fp16_hd64_full_single_m192n128s4$")
N_SELECTED = 6


class _Build:
    """build.py in its own session (as a shell starts a job), its stdout read line by line."""

    def __init__(self, out, *args, env=None):
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "build_tools/build.py"), "--ptxas", "13.1", "--out",
             str(out), "--jobs", "2", *args],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True, env={**os.environ, **(env or {})})
        self.lines: queue.Queue = queue.Queue()
        self.stdout: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_for(self, predicate, timeout=240):
        end = time.time() + timeout
        while time.time() < end:
            try:
                line = self.lines.get(timeout=max(0.1, end - time.time()))
            except queue.Empty:
                break
            if line is None:
                break
            self.stdout.append(line)
            if predicate(line):
                return line
        self.proc.kill()
        pytest.fail("the build ended or stalled before the expected line:\n"
                    + "\n".join(self.stdout) + "\n" + self.proc.stderr.read())

    def stop(self, sig, group=True, timeout=15):
        """Send ``sig`` (to the process group, as a terminal's Ctrl-C does); return (exit
        status, seconds to exit, stdout lines, stderr)."""
        t0 = time.time()
        if group:
            os.killpg(self.proc.pid, sig)
        else:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            pytest.fail(f"the build did not stop within {timeout}s of {sig!r}")
        took = time.time() - t0
        err = self.proc.stderr.read()
        while (line := self.lines.get(timeout=5)) is not None:
            self.stdout.append(line)
        return rc, took, self.stdout, err


def _check_interrupted(rc, took, out, err, expected_rc):
    assert rc == expected_rc, (rc, out, err)
    assert took < 8, f"took {took:.1f}s to stop"
    assert "Traceback" not in err and "Traceback" not in "\n".join(out), err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("fa4_aot build: interrupted"), err
    assert "run again to build the rest" in lines[0]
    return lines[0]


def test_ctrl_c_keeps_finished_kernels_and_the_next_run_builds_only_the_rest(tmp_path):
    b = _Build(tmp_path, "--only", ONLY)
    b.wait_for(lambda ln: " ok " in ln and ln.startswith("["))
    rc, took, out, err = b.stop(signal.SIGINT)
    line = _check_interrupted(rc, took, out, err, 130)
    finished = [ln.split()[3] for ln in out if ln.startswith("[") and " ok " in ln]
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    kernels = manifest["kernels"]
    assert sorted(kernels) == sorted(finished) and 1 <= len(kernels) < N_SELECTED, (out, kernels)
    assert f"; {len(kernels)} of {N_SELECTED} kernels kept in {tmp_path / 'manifest.json'}" in line
    for rec in kernels.values():
        cubin = tmp_path / rec["cubin"]
        assert hashlib.sha256(cubin.read_bytes()).hexdigest() == rec["sha256"]
        assert rec["fingerprint"] and rec["ptxas_version"] == "13.1.115"
    assert not list(tmp_path.glob(".manifest.json.*"))  # no temp file left
    # No compile worker outlives the build.
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(tmp_path) not in ps, ps

    # The next run keeps them and builds only the others; SIGTERM stops it the same way.
    b2 = _Build(tmp_path, "--only", ONLY)
    header = b2.wait_for(lambda ln: ln.startswith("fa4_aot build:"))
    n = len(kernels)
    assert f"{N_SELECTED} configurations, {n} up to date, {N_SELECTED - n} to build" in header
    time.sleep(1.0)  # workers running
    rc, took, out, err = b2.stop(signal.SIGTERM, group=False)
    _check_interrupted(rc, took, out, err, 143)
    again = json.loads((tmp_path / "manifest.json").read_text())["kernels"]
    assert set(kernels) <= set(again)
    assert all(again[k]["sha256"] == kernels[k]["sha256"] for k in kernels)


def test_a_crashed_worker_names_its_kernel_and_the_rest_is_kept(tmp_path):
    only = r"^combine_sm_90a_bf16_hd(64|96|128)$"
    b = _Build(tmp_path, "--only", only, env={"FA4_AOT_TEST_KILL_WORKER": "bf16_hd96$"})
    rc = b.proc.wait(timeout=240)
    err = b.proc.stderr.read()
    while (line := b.lines.get(timeout=5)) is not None:
        b.stdout.append(line)
    out = "\n".join(b.stdout)
    assert rc == 1, out + err
    assert "FAILED combine_sm_90a_bf16_hd96: the compile worker died of SIGKILL" in err, err
    assert "Traceback" not in err
    kernels = json.loads((tmp_path / "manifest.json").read_text())["kernels"]
    assert sorted(kernels) == ["combine_sm_90a_bf16_hd128", "combine_sm_90a_bf16_hd64"]
    assert out.splitlines()[-1].startswith("FAILED: 1 configuration did not build "
                                           "(combine_sm_90a_bf16_hd96); 2 kernels: 0 spill")
