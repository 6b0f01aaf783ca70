"""tools/sass_loops.py on a small synthetic ``cuobjdump -sass`` listing (CPU only)."""

from tools.sass_loops import instructions, loops, main, pacing_order


def _sass(lines):
    """cuobjdump's layout: ``/*addr*/  instruction ;  /* encoding */`` plus a control line."""
    out = ["\tcode for sm_90a", "\t\tFunction : k_demo"]
    for i, ins in enumerate(lines):
        out.append(f"        /*{16 * i:04x}*/                   {ins} ;   /* 0x0 */")
        out.append("                                                    /* 0x0 */")
    return "\n".join(out) + "\n"


# An outer loop (0x00..0x90) around an inner one (0x10..0x80), then a retry stub that branches
# back into the inner loop from the end, as ptxas lays out mbarrier waits.
LISTING = _sass([
    "S2R R0, SR_TID.X",                                        # 0x00, outer loop head
    "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4+0x10], R2",       # 0x10, inner loop head
    "BAR.SYNC.DEFER_BLOCKING R9, 0x100",
    "HGMMA.64x160x16.F32.BF16 R24, gdesc[UR20], R24",
    "HGMMA.64x160x16.F32.BF16 R24, gdesc[UR20], R24, gsb0",
    "WARPGROUP.DEPBAR.LE gsb0, 0x1",
    "@!P1 SYNCS.ARRIVE.TRANS64.A1T0 RZ, [UR19+0x20], RZ",
    "MUFU.EX2 R40, R40",
    "MUFU.EX2 R41, R41",
    "@P0 BRA 0x10",                                            # 0x80, inner back edge
    "@P1 BRA 0x0",                                             # 0x90, outer back edge
    "EXIT",
    "@!P0 NANOSLEEP.SYNCS 0x989680",                           # 0xb0, retry stub
    "BRA 0x10",
])


def test_innermost_loop_and_its_pacing_order(tmp_path, capsys):
    ins = instructions(LISTING)
    assert len(ins) == 14 and ins[3][1].startswith("HGMMA")
    assert loops(ins, 2) == [(1, 9)]  # neither the outer loop nor the stub's span
    assert pacing_order(ins[1:10]) == "TRYW BAR HGMMAx2 DEPBAR.1 ARV MUFUx2"
    p = tmp_path / "k.sass"
    p.write_text(LISTING)
    assert main([str(p), "--min", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("9 instr  ") and "HGMMA 2" in out[0]
    assert out[1] == "  TRYW BAR HGMMAx2 DEPBAR.1 ARV MUFUx2"
    assert main([str(p), "--min", "10"]) == 0 and capsys.readouterr().out == ""
