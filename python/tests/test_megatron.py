"""dpa.torch.attention_from_config (issue 19): a Megatron-style config onto DotProductAttention,
against megatron-core's real TransformerConfig and window rule when it is installed."""

from types import SimpleNamespace

import pytest
import torch

import dpa
from dpa.torch import attention_from_config
from dpa.torch.megatron import layer_has_window


def config(**overrides):
    fields = dict(num_attention_heads=8, num_query_groups=2, kv_channels=16, hidden_size=128,
                  attention_dropout=0.0, softmax_type="learnable", window_size=(31, 0),
                  window_attn_skip_freq=None, attn_logit_softcapping=30.0, softmax_scale=None,
                  apply_query_key_layer_scaling=False)
    fields.update(overrides)
    return SimpleNamespace(**fields)


def test_fields_reach_the_layer():
    layer = attention_from_config(config(apply_query_key_layer_scaling=True), layer_number=3)
    assert layer.num_attention_heads == 8 and layer.num_gqa_groups == 2
    assert layer.kv_channels == (16, 16)
    assert layer.softcap == 30.0 and layer.softmax_type == "learnable"
    assert layer.softmax_offset is not None and layer.softmax_offset.shape == (8,)
    assert layer.window_size == (31, 0)
    assert layer.layer_number == 3  # qk-layer-scaling takes the layer number
    assert attention_from_config(config(), layer_number=3).layer_number is None


def test_cap_of_zero_or_below_is_rejected_at_config_time():
    for cap in (0, 0.0, -1.0):
        with pytest.raises(dpa.InvalidArgumentError, match="attn_logit_softcapping"):
            attention_from_config(config(attn_logit_softcapping=cap))
    assert attention_from_config(config(attn_logit_softcapping=None)).softcap == 0.0


def test_window_skip_frequency():
    every_fourth_full = [layer_has_window((7, 0), 4, n) for n in range(1, 9)]
    assert every_fourth_full == [True, True, True, False, True, True, True, False]
    assert [layer_has_window((7, 0), [1, 0, 1], n) for n in (1, 2, 3)] == [True, False, True]
    assert not layer_has_window(None, None, 1)
    layer = attention_from_config(config(window_attn_skip_freq=2), layer_number=2)
    assert layer.window_size is None
    with pytest.raises(dpa.InvalidArgumentError, match="window_attn_skip_freq"):
        layer_has_window((7, 0), [1, 0], 3)


def test_same_result_as_the_layer_built_by_hand():
    cfg = config(softmax_type="vanilla", attn_logit_softcapping=2.0)
    mapped = attention_from_config(cfg, qkv_format="bshd", backend="cpu_exact")
    by_hand = dpa.torch.DotProductAttention(8, 16, num_gqa_groups=2, qkv_format="bshd",
                                            attn_mask_type="causal", window_size=(31, 0),
                                            softcap=2.0, backend="cpu_exact")
    q = torch.randn(2, 40, 8, 16, dtype=torch.float64) * 2
    k = torch.randn(2, 40, 2, 16, dtype=torch.float64) * 2
    v = torch.randn(2, 40, 2, 16, dtype=torch.float64)
    torch.testing.assert_close(mapped(q, k, v), by_hand(q, k, v), rtol=0, atol=0)


def test_megatron_transformer_config():
    core = pytest.importorskip("megatron.core.transformer.transformer_config")
    utils = pytest.importorskip("megatron.core.transformer.utils")
    cfg = core.TransformerConfig(num_layers=4, hidden_size=128, num_attention_heads=8,
                                 num_query_groups=2, attention_dropout=0.0,
                                 softmax_type="off-by-one", window_size=(63, 0),
                                 window_attn_skip_freq=2)
    # megatron-core 0.16 has no attn_logit_softcapping field yet; Megatron-LM's newer configs
    # do, with the rule above. Set it as such a config would carry it.
    cfg.attn_logit_softcapping = 50.0
    for n in range(1, 5):
        layer = attention_from_config(cfg, layer_number=n)
        assert (layer.window_size is not None) == utils.is_layer_window_attention(
            cfg.window_size, cfg.window_attn_skip_freq, n)
        assert layer.kv_channels == (cfg.kv_channels, cfg.kv_channels)
        assert layer.num_gqa_groups == 2 and layer.softmax_type == "off-by-one"
        assert layer.softcap == 50.0
