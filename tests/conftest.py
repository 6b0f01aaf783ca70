import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Count kernel launches by name (fa4_aot reads this once, at import): the kernel-coverage test
# (tests/test_gpu_zz_kernel_coverage.py) names the sm_90a kernels no GPU test launched.
os.environ.setdefault("FA4_AOT_COUNT_LAUNCHES", "1")
COVERAGE_TEST = "test_gpu_zz_kernel_coverage.py"
FULL_GPU_SUITE = pytest.StashKey[bool]()

REPRODUCIBLE_SKIP = ("full rebuild of every kernel (the Makefile's FULL_REBUILD_MINUTES): "
                     "`make reproducible` runs it (CI does); here only with pytest "
                     "--run-reproducible")


def pytest_addoption(parser):
    parser.addoption("--run-reproducible", action="store_true",
                     help="also run the tests marked 'reproducible' (rebuild every kernel)")


def pytest_configure(config):
    config.addinivalue_line("markers", "reproducible: rebuilds every shipped kernel; skipped "
                            "unless --run-reproducible (`make reproducible`)")


def pytest_collection_modifyitems(config, items):
    # The kernel-coverage test runs last, and counts only when every GPU test file is in.
    items.sort(key=lambda item: item.path.name == COVERAGE_TEST)
    gpu_files = {p.name for p in (ROOT / "tests").glob("test_gpu_*.py")}
    collected = {item.path.name for item in items}
    config.stash[FULL_GPU_SUITE] = (gpu_files <= collected and not config.option.keyword
                                    and not config.option.markexpr
                                    and not config.getoption("lf", False))
    if config.getoption("--run-reproducible"):
        return
    skip = pytest.mark.skip(reason=REPRODUCIBLE_SKIP)
    for item in items:
        if "reproducible" in item.keywords:
            item.add_marker(skip)


def run_in_threads(worker, n):
    """Run ``worker(i)`` for i in range(n), each in its own thread, all started before any is
    joined; re-raise the first exception a worker raised (an assert failing inside a thread
    would otherwise only be printed)."""
    import threading
    errors = []

    def wrapped(i):
        try:
            worker(i)
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread below
            errors.append(e)
    threads = [threading.Thread(target=wrapped, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def memo_plan():
    """The launch plan (:class:`fa4_aot.plan.LaunchPlan`) of the one call this thread's memo
    holds (a test clears it before the call): ``.launches`` are the kernels with their
    manifest records and launch values."""
    from fa4_aot import interface
    (plan,) = interface.memo_plans()
    return plan


# README.md states the fast suite's counts on a machine without a GPU (build_tools/figures.py
# writes them). A whole run of tests/ there checks them against its own: a test added or removed
# fails the run until the README says so. FA4_AOT_FIGURES=1: figures.py is counting.
_README_COUNTS = {}


def _whole_run_without_gpu(session) -> bool:
    config = session.config
    if (os.environ.get("FA4_AOT_FIGURES") or config.option.keyword or config.option.markexpr
            or config.getoption("--run-reproducible") or config.option.collectonly
            or [Path(a).resolve() for a in config.args] != [ROOT / "tests"]):
        return False
    try:
        import torch
    except ImportError:
        return False
    return not torch.cuda.is_available()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if exitstatus != 0 or reporter is None or not _whole_run_without_gpu(session):
        return
    if reporter.stats.get("deselected"):
        return
    from build_tools.figures import README, TESTS_PATTERN, region
    ran = f"{len(reporter.stats.get('passed', []))} passed, " \
          f"{len(reporter.stats.get('skipped', []))} skipped"
    said = region(README.read_text(), "tests") or ""
    if not re.fullmatch(TESTS_PATTERN, said) or said != ran:
        _README_COUNTS["stale"] = (said, ran)
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if "stale" in _README_COUNTS:
        said, ran = _README_COUNTS["stale"]
        terminalreporter.write_line(
            f"README.md says the fast suite ends with {said!r}; this run: {ran!r}. Run "
            "`python build_tools/figures.py --write` (or edit the figures:tests part).", red=True)
