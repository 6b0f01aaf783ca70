"""The generated parts of README.md and docs/design.md (build_tools/figures.py) against what the
tree gives today: a stale part fails here, naming the command that rewrites it."""

from build_tools import figures

WRITE = "run `python build_tools/figures.py --write`"


def test_kernel_choice_table_is_the_planners():
    assert figures.region(figures.DESIGN.read_text(), "kernel-choice") == \
        figures.kernel_choice_table(), f"docs/design.md#kernel-choice is stale: {WRITE}"
