"""The build's compile workers and its interrupt handling (moved out of build.py).

One fresh process per configuration (``_WorkerPool``: each ``python -c _WORKER_BOOT``, in its
own session, runs ``_worker_main``, which imports build.py's ``_compile_worker`` (or the one
tools/variants.py puts in its place) by module or by path and writes the result as JSON), and
SIGINT / SIGTERM turned into ``_Interrupted`` during the build loop (``_signals_interrupt``),
reported to the user as ``BuildInterrupted``. build.py re-exports every name here.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fa4_aot.configs import KernelConfig  # noqa: E402


class _Interrupted(BaseException):
    """SIGINT / SIGTERM during the build loop (a BaseException: no ``except Exception``
    swallows it)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class BuildInterrupted(Exception):
    """The build stopped on SIGINT / SIGTERM; ``message`` is the one line for the user and
    ``exit_code`` 128 + the signal (130 for Ctrl-C, 143 for SIGTERM)."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum, self.message, self.exit_code = signum, message, 128 + signum


@contextlib.contextmanager
def _signals_interrupt():
    """SIGINT and SIGTERM raise _Interrupted in the main thread (once: a second signal during
    the cleanup is ignored); the previous handlers come back on exit."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    sigs = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.getsignal(s) for s in sigs}

    def handler(signum, frame):
        for s in sigs:
            signal.signal(s, signal.SIG_IGN)
        raise _Interrupted(signum)

    for s in sigs:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)



# The worker process: `python -c WORKER_BOOT ROOT TARGET CFG_JSON PTX RESULT`.
_WORKER_BOOT = "import sys; sys.path.insert(0, sys.argv[1]); " \
    "from build_tools.workers import _worker_main; sys.exit(_worker_main(sys.argv[2:]))"
# Tests: a compile worker whose configuration name matches this regex kills itself (SIGKILL),
# as an out-of-memory kill would.
KILL_WORKER_ENV = "FA4_AOT_TEST_KILL_WORKER"


def _worker_target(fn) -> str:
    """How a worker finds ``fn``, build.py's ``_compile_worker`` (tools/variants.py replaces it):
    ``module:name``, or ``path:FILE:name`` for a function of a script run as __main__."""
    module = fn.__module__
    if module in ("__main__", "__mp_main__"):
        return f"path:{Path(sys.modules[module].__file__).resolve()}:{fn.__qualname__}"
    return f"{module}:{fn.__qualname__}"


def _worker_main(argv: list[str]) -> int:
    """One configuration's DSL compile in a fresh process (the DSL names entries with a
    per-process counter); the result (or the error) goes to a JSON file."""
    target, cfg_json, ptx_path, result_path = argv
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the build process ends its workers
    cfg_dict = json.loads(cfg_json)
    pattern = os.environ.get(KILL_WORKER_ENV)
    if pattern and re.search(pattern, KernelConfig.from_dict(cfg_dict).name):
        os.kill(os.getpid(), signal.SIGKILL)
    import importlib
    import importlib.util
    if target.startswith("path:"):
        _, file, name = target.split(":", 2)
        spec = importlib.util.spec_from_file_location("_fa4aot_build_worker_target", file)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        modname, name = target.split(":", 1)
        module = importlib.import_module(modname)
    try:
        result, rc = {"ok": getattr(module, name)(cfg_dict, ptx_path)}, 0
    except Exception as e:  # reported by the build, named with the configuration
        import traceback
        traceback.print_exc()
        result, rc = {"error": f"{type(e).__name__}: {e}"}, 1
    tmp = f"{result_path}.tmp"
    Path(tmp).write_text(json.dumps(result))
    os.replace(tmp, result_path)
    return rc


class _WorkerPool:
    """Up to ``jobs`` compile workers, one fresh process per configuration, each in its own
    session (a terminal's Ctrl-C reaches the build process alone, which ends them: kill())."""

    POLL_S = 0.1

    def __init__(self, jobs: int, compile_worker):
        self.jobs = max(1, jobs)
        self.compile_worker = compile_worker  # build._compile_worker, looked up by build()
        self.tmp = Path(tempfile.mkdtemp(prefix="fa4aot_build_"))
        self.running: dict[subprocess.Popen, tuple] = {}

    def _start(self, task, n: int):
        cfg, fp, ptx = task
        result = self.tmp / f"{n}.json"
        log = tempfile.TemporaryFile(dir=self.tmp)
        proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER_BOOT, str(ROOT), _worker_target(self.compile_worker),
             json.dumps(cfg.to_dict()), ptx, str(result)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
            start_new_session=True)
        self.running[proc] = (task, result, log, time.time())

    def run(self, tasks, on_done, on_fail):
        """Compile every task ``(cfg, fingerprint, ptx_path)``; call ``on_done(cfg, fp,
        compiled)`` (``compiled["seconds"]``: the worker's wall time) or ``on_fail(cfg, why)``
        in this thread as each worker ends."""
        queue = list(tasks)
        queue.reverse()
        n = 0
        while queue or self.running:
            while queue and len(self.running) < self.jobs:
                self._start(queue.pop(), n)
                n += 1
            ended = [p for p in self.running if p.poll() is not None]
            if not ended:
                time.sleep(self.POLL_S)
                continue
            outcomes = [(p, self.running.pop(p)) for p in ended]
            while queue and len(self.running) < self.jobs:  # refill before the ptxas work
                self._start(queue.pop(), n)
                n += 1
            for proc, ((cfg, fp, _), result, log, started) in outcomes:
                try:
                    data = json.loads(result.read_text()) if result.exists() else {}
                finally:
                    log.seek(0)
                    tail = log.read().decode(errors="replace").strip().splitlines()[-3:]
                    log.close()
                    result.unlink(missing_ok=True)
                if proc.returncode == 0 and "ok" in data:
                    on_done(cfg, fp, {**data["ok"], "seconds": time.time() - started})
                elif "error" in data:
                    on_fail(cfg, data["error"])
                elif proc.returncode < 0:
                    on_fail(cfg, f"the compile worker died of {signal.Signals(-proc.returncode).name}"
                            + (f" ({' | '.join(tail)})" if tail else ""))
                else:
                    on_fail(cfg, f"the compile worker exited with status {proc.returncode}"
                            + (f": {' | '.join(tail)}" if tail else ""))

    def kill(self):
        """End every running worker (and anything it started) at once."""
        for proc in self.running:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                proc.kill()
        for proc, (_, _, log, _) in list(self.running.items()):
            proc.wait()
            log.close()
        self.running.clear()

    def close(self):
        self.kill()
        shutil.rmtree(self.tmp, ignore_errors=True)

