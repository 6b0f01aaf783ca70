"""The shipped manifest: schema, files, sha256, ptxas version, and the launch ABI against the
PTX entry signatures (CPU)."""

import hashlib
import json
import re

import pytest

from build_tools.inspect_cubin import parse_ptx_entries
from conftest import ROOT
from fa4_aot import abi
from fa4_aot.configs import CONFIG_SPACE, KernelConfig
from fa4_aot.manifest import Manifest, ManifestError

jsonschema = pytest.importorskip("jsonschema")

ART = ROOT / "artifacts"
MANIFEST = json.loads((ART / "manifest.json").read_text())

PARAM = {
    "type": "object",
    "required": ["name", "kind", "size", "align"],
    "properties": {
        "kind": {"enum": ["tensormap", "i32_tuple", "ptr", "i64", "i32", "f32", "static"]},
        "size": {"type": "integer", "minimum": 1},
        "align": {"type": "integer", "minimum": 1},
    },
}
SCHEMA = {
    "type": "object",
    "required": ["schema_version", "build", "kernels"],
    "properties": {
        "schema_version": {"const": 1},
        "build": {
            "type": "object",
            "required": ["cutlass_dsl_version", "ptxas_release", "ptxas_version",
                         "ptx_isa_accepted", "ptx_isa_rewritten", "cuobjdump_version",
                         "source_fingerprint", "abi_version"],
        },
        "kernels": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "required": ["config", "arch", "entry", "ptx", "cubin", "sha256", "ptxas_version",
                             "resources", "launch", "fingerprint"],
                "properties": {
                    "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                    "resources": {
                        "type": "object",
                        "required": ["registers", "stack_frame", "spill_store_bytes",
                                     "spill_load_bytes", "ldl", "stl", "lane_loops",
                                     "shared_bytes", "threads"],
                    },
                    "launch": {
                        "type": "object",
                        "required": ["params", "block", "cluster", "dynamic_smem_bytes", "grid"],
                        "properties": {"params": {"type": "array", "items": PARAM}},
                    },
                },
            },
        },
    },
}


def test_manifest_schema():
    jsonschema.validate(MANIFEST, SCHEMA)


def test_manifest_covers_config_space():
    shipped = set(MANIFEST["kernels"])
    assert shipped == {c.name for c in CONFIG_SPACE}


def test_pins_recorded():
    b = MANIFEST["build"]
    assert b["cutlass_dsl_version"] == "4.8.1"
    assert b["ptxas_release"] == "13.1" and b["ptxas_version"].startswith("13.1.")
    for rec in MANIFEST["kernels"].values():
        assert rec["ptxas_version"] == b["ptxas_version"]


@pytest.mark.parametrize("name", sorted(MANIFEST["kernels"]))
def test_files_and_sha256(name):
    rec = MANIFEST["kernels"][name]
    data = (ART / rec["cubin"]).read_bytes()
    assert hashlib.sha256(data).hexdigest() == rec["sha256"]
    assert (ART / rec["ptx"]).is_file()


def test_shared_memory_fits_one_cta():
    """sm_90a and sm_100a give a CTA at most 227 KB of shared memory: a kernel above it builds
    but cannot launch (the sm_90a kernel also asserts it while tracing)."""
    over = {n: r["launch"]["dynamic_smem_bytes"] for n, r in MANIFEST["kernels"].items()
            if r["launch"]["dynamic_smem_bytes"] > 227 * 1024}
    assert over == {}


@pytest.mark.parametrize("name", sorted(MANIFEST["kernels"]))
def test_launch_abi_matches_ptx_entry(name):
    """The runtime packs parameters from this record: count, sizes and alignment must equal
    the PTX .entry signature."""
    rec = MANIFEST["kernels"][name]
    entries = parse_ptx_entries((ART / rec["ptx"]).read_text())
    assert list(entries) == [rec["entry"]]
    assert abi.check_against_ptx(rec["launch"]["params"], entries[rec["entry"]]) == []
    cfg = KernelConfig.from_dict(rec["config"])
    assert rec["launch"] == abi.launch_record(cfg, rec["launch"]["dynamic_smem_bytes"])


@pytest.mark.parametrize("name", sorted(n for n, r in MANIFEST["kernels"].items()
                                        if r["config"]["arch"] == "sm_90a"
                                        and r["config"]["kind"] == "fwd"))
def test_staged_o_store_in_the_ptx(name):
    """Kernels whose tile has ``staged_store`` write O as 16-byte stores read back from shared
    memory (st.global.v4; the only 32-bit global stores left are the two LSE rows); the others
    write O as 32-bit words, hd / 4 of them per thread. With ``o_buffer`` the warpgroups hand
    the O buffer on through an mbarrier that every thread arrives on right after its last read
    of the buffer."""
    rec = MANIFEST["kernels"][name]
    cfg = KernelConfig.from_dict(rec["config"])
    ptx = (ART / rec["ptx"]).read_text()
    staged = cfg.tile.staged_store and not cfg.decode
    assert ("st.global.v4.b32" in ptx) == staged
    if staged:
        assert ptx.count("st.global.b32") == 2
    elif not cfg.decode:
        assert ptx.count("st.global.b32") >= cfg.head_dim // 4
    if staged:
        # The O buffer's hand-over: an arrive by every thread of the warpgroup right after the
        # last read of the buffer (within the next few lines), before the global stores.
        after_reads = ptx[ptx.rindex("ld.shared.v4.b32"):].splitlines()[1:5]
        handed_over = any(re.match(r"\s*mbarrier\.arrive\.shared\.b64", ln) for ln in after_reads)
        assert bool(handed_over) == cfg.tile.o_buffer


@pytest.mark.parametrize("name", sorted(n for n, r in MANIFEST["kernels"].items()
                                        if r["config"]["arch"] == "sm_90a"
                                        and r["config"]["kind"] == "fwd"))
def test_lazy_rescale_votes_in_the_ptx(name):
    """``lazy_rescale`` kernels skip O's rescale by a warp vote (no row of the warp moved its
    max); no other sm_90a kernel votes."""
    rec = MANIFEST["kernels"][name]
    cfg = KernelConfig.from_dict(rec["config"])
    ptx = (ART / rec["ptx"]).read_text()
    assert ("vote.sync.any.pred" in ptx) == cfg.tile.lazy_rescale


def test_check_against_ptx_reports_differences():
    params = abi.ptx_params(abi.FWD_SM90, "bf16", 128, 128, 128)
    ptx = [{"size": p["size"], "align": p["align"]} for p in params]
    assert abi.check_against_ptx(params, ptx) == []
    ptx[1] = {"size": 16, "align": 4}
    assert "param 1" in abi.check_against_ptx(params, ptx)[0]
    assert "count" in abi.check_against_ptx(params, ptx[:-1])[0]


def test_sha256_mismatch_detected(tmp_path):
    import shutil
    shutil.copytree(ART, tmp_path / "a")
    name = sorted(MANIFEST["kernels"])[0]
    cubin = tmp_path / "a" / MANIFEST["kernels"][name]["cubin"]
    data = bytearray(cubin.read_bytes())
    data[len(data) // 2] ^= 0xFF  # flip one byte in the middle
    cubin.write_bytes(bytes(data))
    m = Manifest(tmp_path / "a")
    with pytest.raises(ManifestError, match="corrupt"):
        m.cubin_bytes(name)
    cubin.unlink()
    m = Manifest(tmp_path / "a")
    with pytest.raises(ManifestError, match="missing"):
        m.cubin_bytes(name)


def test_unsupported_combination_lists_available():
    m = Manifest(ART)
    with pytest.raises(ValueError, match=r"built \(arch, dtype, head_dim\).*sm_90a, bf16, 128"):
        m.find("sm_90a", "bf16", 80, False, "single")


def test_shipped_kernels_do_not_spill():
    """CI gate: no shipped kernel spills (ptxas -v spill bytes, and LDL/STL in the SASS, which
    is where spills inside a setmaxnreg role show up)."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, str(ROOT / "build_tools/spill_report.py"),
                        "--fail-on-spill", "--format", "csv"], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    for rec in MANIFEST["kernels"].values():
        res = rec["resources"]
        assert res["spill_store_bytes"] == res["spill_load_bytes"] == res["ldl"] == res["stl"] == 0


def test_shipped_kernels_have_no_ptxas_performance_warnings():
    """CI gate: ptxas reported no "Potential Performance Loss" for any shipped kernel, above all
    C7512 (wgmma serialised: every wgmma waits for the previous one; it cost hd128 6-20 %
    before v7 of docs/perf-notes.md, with no spill to show for it)."""
    flagged = {n: r["ptxas_diagnostics"] for n, r in MANIFEST["kernels"].items()
               if r["ptxas_diagnostics"]}
    assert flagged == {}


def test_decode_kernels_have_no_lane_loops():
    """CI gate: no decode kernel issues its TMA copies in ``BRA.U.ANY`` loops (once per distinct
    lane value: ptxas does that when it cannot keep the operands in uniform registers). In the
    128-row decode kernels they cost 12-46 % (docs/perf-notes.md v13). The spill report's
    U-loops column shows the prefill kernels that have some (hd192 causal, hd128 window: v14)."""
    looped = {n: r["resources"]["lane_loops"] for n, r in MANIFEST["kernels"].items()
              if r["config"].get("decode") and r["resources"].get("lane_loops")}
    assert looped == {}
