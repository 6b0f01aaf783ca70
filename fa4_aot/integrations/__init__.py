"""Adapters that plug fa4_aot into model libraries. Nothing here is imported by ``import fa4_aot``:
``fa4_aot.integrations.transformers`` imports transformers only inside :func:`register`."""
