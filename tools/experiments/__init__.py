"""Experiment tooling, out of the shipped path: nothing in ``fa4_aot`` or ``build_tools``
imports it. ``variants.py`` builds kernels with another tile or mainloop schedule into a
separate artifacts folder; ``name_experiment.py`` measures what an entry name containing
"cutlass" does to ptxas."""
