"""tools/variants.py: variant tokens and the names a variant makes two configurations share
(CPU only; moved here from tests/test_configs.py)."""

import copy

import pytest

import fa4_aot.configs as configs
from tools.variants import apply, shared_names, tile_overrides


def test_variant_that_gives_two_tables_one_tile_reports_the_shared_names(monkeypatch):
    assert shared_names() == {}  # the shipped space: one name per configuration
    for table in ("TILES", "TILES_WIDE_N", "TILES_LONG_KV", "TILES_M128", "DECODE_TILES",
                  "DECODE_WIDE_TILES"):
        monkeypatch.setattr(configs, table, copy.deepcopy(getattr(configs, table)))
    apply("m192-n128")
    shared = shared_names("fwd_sm_90a_bf16_hd128_causal_steal")
    assert "fwd_sm_90a_bf16_hd128_causal_steal_m192n128s2" in shared
    assert {c.long_kv for c in shared["fwd_sm_90a_bf16_hd128_causal_steal_m192n128s2"]} == {
        False, True}


def test_experiment_variant_tokens_override_the_tile():
    assert tile_overrides("noovl-nopp-s3-n176") == {"overlap": False, "pingpong": False,
                                                     "kv_stages": 3, "n": 176}
    assert tile_overrides("pp-re") == {"pingpong": True, "rescale_early": True}
    assert tile_overrides("q1") == {"q_stages": 1}
    assert tile_overrides("ss-s3") == {"staged_store": True, "kv_stages": 3}
    assert tile_overrides("noss") == {"staged_store": False}
    assert tile_overrides("ss-ob") == {"staged_store": True, "o_buffer": True}
    assert tile_overrides("nolr") == {"lazy_rescale": False}
    assert tile_overrides("e80") == {"edge_width": 80}
    assert tile_overrides("e0") == {"edge_width": 0}
    assert tile_overrides("") == {}
    with pytest.raises(ValueError, match="unknown kernel variant token 'n100'"):
        tile_overrides("n100")
    with pytest.raises(ValueError, match="unknown kernel variant token 'e100'"):
        tile_overrides("e100")
