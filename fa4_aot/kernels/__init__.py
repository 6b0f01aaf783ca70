"""CuTe DSL kernel sources. Imported only by the build (they need nvidia-cutlass-dsl);
the runtime (``fa4_aot`` itself) never imports this package."""
