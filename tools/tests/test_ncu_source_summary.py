"""tools/ncu_source_summary.py on a small synthetic ``ncu --page source --csv``
table (CPU only)."""

from tools.ncu_source_summary import kernels, main

CSV = '''"Kernel Name","k_demo",""
"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed","stall_barrier","stall_long_sb","stall_wait"
"0x7f00000000a0","HGMMA.64x128x16.F32.BF16 R24, gdesc[UR20], R24","10","400","0","0","9"
"0x7f00000000b0","BAR.SYNC.DEFER_BLOCKING R16, 0x100","30","400","28","0","0"
"0x7f00000000c0","LDS RZ, [RZ]","20","8","0","19","0"
'''


def test_summary_groups_loops_and_names_hot_instructions(tmp_path, capsys):
    p = tmp_path / "src.csv"
    p.write_text(CSV)
    [(name, header, rows)] = kernels(str(p))
    assert name == "k_demo" and len(rows) == 3 and header[0] == "Address"
    assert main([str(p), "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "samples 60" in out and "barrier 46.7%" in out
    assert "ex=       400      2 instr   66.7%" in out  # the two-instruction "loop"
    assert "BAR.SYNC.DEFER_BLOCKING" in out.split("top barrier:")[1].splitlines()[1]


def test_no_table_is_an_error(tmp_path, capsys):
    p = tmp_path / "empty.csv"
    p.write_text('"==PROF== nothing profiled"\n')
    assert main([str(p)]) == 2
    assert "no per-instruction table" in capsys.readouterr().err
