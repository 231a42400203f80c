import pytest

from diffeval.config import parse_ctx
from diffeval.errors import InputError
from diffeval.models import spec as spec_module
from diffeval.models.spec import ModelSpec
from diffeval.tasks import build_config


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
