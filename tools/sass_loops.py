"""What does a kernel's key-block loop look like in SASS? (CPU only, repo root.)

The loops of a kernel's SASS: length, instruction mix, and the order of the instructions that
pace a key block (wgmma issue and waits, barriers, exponentials, conversions), runs compressed.

    cuobjdump -sass artifacts/sm_90a/<kernel>.cubin > k.sass   # the build's cuobjdump, with
                                                              # its nvdisasm on PATH
    python -m tools.sass_loops k.sass [--min 400]

Two lines per innermost loop of at least ``--min`` instructions, e.g. the unmasked key-block
loop of the 160-key causal kernel, where the wait for the PV wgmma (``DEPBAR.0``) comes right
after the row max's shuffles, before any exponential (docs/perf-notes.md v33):

    559 instr  FMNMX 84, FFMA 84, MUFU 82, FADD 78, FMUL 66, F2FP 40, UMOV 29, UIADD3 24
      TRYW BAR HGMMAx8 TRYW HGMMAx10 BAR DEPBAR.1 ARV SHFLx2 DEPBAR.0 ARV FFMAx2 SHFL ...

(``TRYW``: an mbarrier try-wait, ``ARV``: an mbarrier arrive, ``DEPBAR.N``: wgmma.wait_group N,
``BAR``: a named barrier.) Stdlib and the build's own SASS line pattern only.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import re
import sys

from build_tools.inspect_cubin import _SASS_INSN_RE

PACING = ("HGMMA", "WARPGROUP.DEPBAR", "MUFU", "F2FP", "BAR.", "SHFL", "SYNCS", "FFMA", "FADD",
          "VOTE")


def instructions(text: str) -> list[tuple[int, str, str]]:
    """(address, opcode with its modifiers, operands) of each instruction of cuobjdump -sass
    (the line format the build's SASS inspection reads, ``inspect_cubin._SASS_INSN_RE``)."""
    return [(int(m["addr"], 16), m["op"], m["args"].strip())
            for m in map(_SASS_INSN_RE.match, text.splitlines()) if m]


def loops(ins: list[tuple[int, str, str]], min_len: int) -> list[tuple[int, int]]:
    """(first, last) indices of each innermost backward branch's body of at least ``min_len``
    instructions (a body that holds another loop is left out: the tile loop, and the spans of
    the retry stubs at the kernel's end that branch back into it)."""
    at = {a: i for i, (a, _, _) in enumerate(ins)}
    found = []
    for i, (a, op, args) in enumerate(ins):
        m = re.search(r"0x([0-9a-f]+)", args) if op.startswith("BRA") else None
        target = int(m.group(1), 16) if m else None
        if target is not None and target < a and target in at:
            found.append((at[target], i))
    inner = [(s, e) for s, e in found
             if not any((s2, e2) != (s, e) and s <= s2 and e2 <= e for s2, e2 in found)]
    return [(s, e) for s, e in inner if e - s + 1 >= min_len]


def pacing_order(body: list[tuple[int, str, str]]) -> str:
    """The pacing instructions of ``body`` in order, runs of one kind as ``KINDxN``."""
    seq = []
    for _, op, args in body:
        if not op.startswith(PACING):
            continue
        if op.startswith("WARPGROUP.DEPBAR"):
            seq.append("DEPBAR." + args.split()[-1].replace("0x", ""))
        elif op.startswith("SYNCS"):
            seq.append("ARV" if "ARRIVE" in op else "TRYW")
        else:
            seq.append(op.split(".")[0])
    runs = [(k, len(list(g))) for k, g in itertools.groupby(seq)]
    return " ".join(k if n == 1 else f"{k}x{n}" for k, n in runs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sass", help="cuobjdump -sass output")
    ap.add_argument("--min", type=int, default=400, help="shortest loop body shown")
    a = ap.parse_args(argv)
    ins = instructions(open(a.sass).read())
    for first, last in loops(ins, a.min):
        body = ins[first:last + 1]
        mix = collections.Counter(op.split(".")[0] for _, op, _ in body)
        print(f"{len(body)} instr  " + ", ".join(f"{k} {n}" for k, n in mix.most_common(8)))
        print("  " + pacing_order(body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
