"""The config estimate's parts (diffeval/speed.py): FLOPs from a config, checked by hand on tiny configs, and the
matmul benchmark's cache per machine."""

import json
from types import SimpleNamespace

import pytest

from diffeval import speed


def tiny(architecture: str = "LlamaForCausalLM", model_type: str = "llama", **extra) -> SimpleNamespace:
    """hidden 8, 2 query heads and 1 KV head of 4 dimensions, MLP 16, vocabulary 10, 2 layers."""
    fields = dict(
        architectures=[architecture], model_type=model_type, hidden_size=8, num_attention_heads=2,
        num_key_value_heads=1, head_dim=4, intermediate_size=16, vocab_size=10, num_hidden_layers=2,
    )  # fmt: skip
    return SimpleNamespace(**{**fields, **extra})


def test_the_shape_of_a_tiny_llama():
    # per layer: q and o 8·(2·4) = 64 each, k and v 8·(1·4) = 32 each, the gated MLP 3·8·16 = 384: 576; 2 layers
    shape = speed.shape_of(tiny())
    assert shape == speed.Shape(layer_weights=1152, head_weights=80, attention=((8, None), (8, None)), layers=2)


def test_flops_of_a_prompt_and_its_generated_tokens():
    shape = speed.shape_of(tiny())
    # a 3-token prompt: 2·1152·3 = 6912 through the layers, 2·80 = 160 for one position's logits, attention 4·8 per
    # (query, key) pair over the 1 + 2 + 3 = 6 causal pairs in each of 2 layers = 384
    assert speed.flops(shape, 3, 0) == 6912 + 160 + 384 == 7456
    assert speed.flops(shape, 3, 1) == 7456  # the prefill's logits give the first token
    # the second generated token: one token through layers and head, 2·(1152 + 80) = 2464, attending to 4 keys in
    # each layer, 2·4·8·4 = 256
    assert speed.flops(shape, 3, 2) == 7456 + 2464 + 256 == 10176


def test_a_diff_layer_computes_two_maps():
    shape = speed.shape_of(tiny("DiffLlamaForCausalLM", "diffllama"))
    assert shape.attention == ((16, None), (16, None))  # 2 heads · 4 dimensions · 2 maps
    assert speed.flops(shape, 3, 0) == 6912 + 160 + 2 * 384


def test_a_sliding_window_caps_the_keys_a_query_sees():
    shape = speed.shape_of(tiny(sliding_window=2, layer_types=["sliding_attention", "full_attention"]))
    assert shape.attention == ((8, 2), (8, None))
    # the sliding layer sees 1 + 2 + 2 = 5 pairs of a 3-token prompt, the full one 6
    assert speed.flops(shape, 3, 0) == 6912 + 160 + 4 * 8 * (5 + 6)
    # the second generated token: 2 keys in the sliding layer, 4 in the full one
    assert speed.flops(shape, 3, 2) == speed.flops(shape, 3, 0) + 2464 + 4 * 8 * (2 + 4)


def test_seconds_are_flops_at_the_efficient_rate_plus_each_layer_call():
    calibration = speed.Calibration(0.5, 0.01, 1.5, 2, "1K", "here", "today")
    shape = speed.shape_of(tiny())
    # 10176 FLOPs at 1000 FLOP/s × 0.5, and 2 forward calls × 2 layers × 0.01 s
    assert speed.sample_seconds(shape, 3, 2, 1000, calibration) == pytest.approx(10176 / 500 + 0.04)
    assert speed.sample_parts(shape, 3, 0, 1000) == (7.456, 2)  # no generation: the prompt's one call


def test_a_config_without_a_dense_decoders_sizes_is_refused():
    config = tiny()
    del config.intermediate_size
    with pytest.raises(AttributeError):
        speed.shape_of(config)


@pytest.fixture
def measured(monkeypatch, tmp_path) -> list[tuple]:
    """The benchmark replaced by a recorder (a rate of 1e9 per call), the cache in an empty folder."""
    monkeypatch.setenv("DIFFEVAL_CACHE_DIR", str(tmp_path))
    calls: list[tuple] = []

    def measure(device, dtype, threads):
        calls.append((device, dtype, threads))
        return 1e9 * len(calls)

    monkeypatch.setattr(speed, "measure_matmul", measure)
    return calls


def test_the_matmul_rate_is_measured_once_per_machine(measured, monkeypatch, tmp_path):
    first = speed.matmul_rate("cpu", "float32", 1)
    assert measured == [("cpu", "float32", 1)] and first.flops_per_s == 1e9
    again = speed.matmul_rate("cpu", "float32", 1)  # read from the cache: not measured again
    assert measured == [("cpu", "float32", 1)] and again == first
    cache = json.loads((tmp_path / speed.CACHE_FILE).read_text())
    [key] = cache
    assert json.loads(key)["threads"] == 1 and cache[key]["flops_per_s"] == 1e9

    speed.matmul_rate("cpu", "float32", 2)  # other threads: another measurement
    assert measured[-1] == ("cpu", "float32", 2)
    monkeypatch.setattr(speed, "cpu_model", lambda: "another CPU")  # another machine sharing the cache folder
    other = speed.matmul_rate("cpu", "float32", 1)
    assert len(measured) == 3 and other.flops_per_s == 3e9
    monkeypatch.undo()
    monkeypatch.setenv("DIFFEVAL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(speed, "measure_matmul", lambda *args: pytest.fail("measured again"))
    assert speed.matmul_rate("cpu", "float32", 1) == first  # this machine's entry is still there


def test_a_damaged_cache_is_measured_again(measured, tmp_path):
    (tmp_path / speed.CACHE_FILE).write_text("{not json")
    assert speed.matmul_rate("cpu", "float32", 1).flops_per_s == 1e9 and len(measured) == 1
    assert speed.matmul_rate("cpu", "float32", 1).flops_per_s == 1e9 and len(measured) == 1


def test_the_benchmark_measures_a_rate_and_restores_the_threads():
    import torch

    before = torch.get_num_threads()
    rate = speed.measure_matmul("cpu", "float32", 1)
    assert torch.get_num_threads() == before
    assert 1e8 < rate < 1e14  # a CPU's fp32 rate: more than 0.1 GFLOP/s, less than 100 TFLOP/s
