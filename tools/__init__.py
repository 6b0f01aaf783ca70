"""Maintainer scripts, run from the repo root as ``python -m tools.<name>``; each module's
docstring says what it answers. Nothing in ``fa4_aot``, ``build_tools`` or ``tests/`` imports
them; their own tests are in ``tools/tests`` (``python -m pytest tools/tests``)."""
