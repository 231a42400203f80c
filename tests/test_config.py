import re
import sys
from types import SimpleNamespace

import pytest

from diffeval.config import parse_ctx
from diffeval.errors import InputError
from diffeval.models import spec as spec_module
from diffeval.models.engines.hf_options import HFOptions
from diffeval.models.engines.vllm_options import VLLMOptions
from diffeval.models.spec import ModelSpec
from diffeval.tasks import build_config

# every test here touches transformers' internals: .ci/run runs them again at the low end of its range
pytestmark = pytest.mark.transformers_floor


@pytest.mark.parametrize(
    ("text", "expected"),
    [("4k", [4096]), ("64K", [65536]), ("65536", [65536]), ("4k,8k", [4096, 8192]), (" 1k , 2048 ", [1024, 2048])],
)
def test_parse_ctx(text, expected):
    assert parse_ctx(text) == expected


@pytest.mark.parametrize("text", ["4x", "", "k", "0", "-4k", "4.5k"])
def test_parse_ctx_rejects(text):
    with pytest.raises(InputError, match="bad context length"):
        parse_ctx(text)


def test_model_spec_forms():
    assert ModelSpec.parse("diff=./ckpt/diff-3b") == ModelSpec("diff", "./ckpt/diff-3b", "auto")
    assert ModelSpec.parse("./ckpt/diff-3b/") == ModelSpec("diff-3b", "./ckpt/diff-3b/", "auto")
    assert ModelSpec.parse("mine=org/model:diff") == ModelSpec("mine", "org/model", "diff")
    assert ModelSpec.parse({"name": "b", "spec": "x/y", "kind": "base"}) == ModelSpec("b", "x/y", "base")


def test_flags_override_yaml_and_lists_broadcast():
    config = build_config(
        "needle",
        {"ctx": "4k", "needles": [1, 2, 4, 6], "queries": [1, 2, 2, 2], "samples": 50, "models": {"d": "a/b"}},
        {"ctx": "1k,2k", "samples": None, "models": None},
    )
    assert config.options.ctx == [1024, 2048]
    assert config.options.samples == 50
    assert config.options.nr_pairs() == [(1, 1), (2, 2), (4, 2), (6, 2)]
    assert config.models == [ModelSpec("d", "a/b")]
    one_r = build_config("needle", {}, {"needles": "2,4", "queries": "2", "models": ["x/y"]})
    assert one_r.options.nr_pairs() == [(2, 2), (4, 2)]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"needles": "1", "queries": "2"}, "need 1 <= R <= N"),
        ({"depths": "0,150"}, "outside 0-100"),
        ({"dtype": "int3"}, "bad --dtype"),
        ({"bogus": 1}, "unknown option"),
        ({"needles": "1,2", "queries": "1,1,1"}, "differ in length"),
        ({"ctx": "64"}, "leaves no room"),
    ],
)
def test_bad_input(flags, message):
    flags = {"models": ["a/b"], **flags}
    with pytest.raises(InputError, match=message):
        build_config("needle", {}, flags)


def test_identity_ignores_sample_counts():
    a = build_config("needle", {}, {"models": ["a/b"], "samples": 5, "limit": 2})
    b = build_config("needle", {}, {"models": ["a/b"], "samples": 50})
    c = build_config("needle", {}, {"models": ["a/b"], "seed": 1})
    assert a.identity_hash() == b.identity_hash() != c.identity_hash()
    assert str(a.out_dir()).startswith("results/needle-")


def test_no_model_and_no_builtin_pair_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(spec_module, "BUILTIN_MODELS", tmp_path)  # a checkout without the shipped weights
    with pytest.raises(InputError, match="no model given"):
        build_config("needle", {}, {})


VLLM_SETTINGS = {"tensor_parallel_size": 2, "gpu_memory_utilization": 0.5, "max_model_len": 4096, "kv_cache_gib": 1.5}


def test_engine_options_go_to_the_runs_engine_and_stay_out_of_its_identity():
    """Presets and flags give an engine's options by the names they always had; RunConfig.engine holds the run's
    engine's, run.json records them beside the run's own options, and they leave the folder's name alone."""
    plain = build_config("needle", {"backend": "vllm"}, {"models": ["a/b"]})
    tuned = build_config("needle", {"backend": "vllm", **VLLM_SETTINGS}, {"models": ["a/b"], "enforce_eager": True})
    assert tuned.engine == VLLMOptions(enforce_eager=True, **VLLM_SETTINGS)
    assert plain.identity_hash() == tuned.identity_hash()
    assert not set(VLLM_SETTINGS) & set(tuned.identity())
    stored = tuned.to_dict()
    assert {k: stored[k] for k in VLLM_SETTINGS} == VLLM_SETTINGS and "engine" not in stored
    # a run folder's run.json rebuilds the same config (as `diffeval view` does)
    rebuilt = build_config("needle", {k: v for k, v in stored.items() if k != "options"}, {})
    assert rebuilt.engine == tuned.engine
    hf = build_config("needle", {"threads": 2}, {"models": ["a/b"]})
    assert hf.engine == HFOptions(threads=2) and "tensor_parallel_size" not in hf.to_dict()


def test_an_old_run_json_with_every_engines_defaults_still_configures():
    """Folders from before engines owned their options hold all of them, at their defaults on the engine not run."""
    old = {"backend": "hf", "threads": 2, "tensor_parallel_size": 1, "gpu_memory_utilization": 0.9}
    old |= {"enforce_eager": False, "max_model_len": None, "kv_cache_gib": None}
    assert build_config("needle", old, {"models": ["a/b"]}).engine == HFOptions(threads=2)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"kv_cache_gib": 1.0, "enforce_eager": True}, "--enforce-eager, --kv-cache-gib set(s) the vllm engine"),
        ({"max_model_len": 4096}, "--max-model-len set(s) the vllm engine, not hf: add --backend vllm, or leave it"),
        ({"backend": "vllm", "threads": 2}, "--threads set(s) the hf engine, not vllm: add --backend hf, or leave it"),
        ({"backend": "vllm", "gpu_memory_utilization": 1.5}, "--gpu-memory-utilization in (0, 1]"),
        ({"tensor_parallel_size": "two", "backend": "vllm"}, "option tensor_parallel_size must be an int"),
    ],
)
def test_another_engines_option_or_a_bad_value_is_refused(values, message):
    with pytest.raises(InputError, match=re.escape(message)):
        build_config("needle", values, {"models": ["a/b"]})


def test_an_engine_says_how_many_gpus_a_ray_worker_holds(monkeypatch):
    """scale.py asks the engine's options (vllm: --tensor-parallel-size; hf: 1); the cluster is a stand-in for Ray's."""
    from diffeval.scale import gpus_per_worker

    cluster = {"GPU": 4, "CPU": 8}
    monkeypatch.setitem(sys.modules, "ray", SimpleNamespace(cluster_resources=lambda: cluster))
    vllm = build_config("needle", {"backend": "vllm", "tensor_parallel_size": 2}, {"models": ["a/b"]})
    assert gpus_per_worker(vllm) == 2
    assert gpus_per_worker(build_config("needle", {}, {"models": ["a/b"]})) == 1
    assert gpus_per_worker(build_config("needle", {"gpus_per_worker": 0.5}, {"models": ["a/b"]})) == 0.5
    cluster.pop("GPU")
    assert gpus_per_worker(vllm) == 0
