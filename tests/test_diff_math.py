import math

import torch

from diffeval.models.diff import differential_map, lambda_init, layer_lambdas
from diffeval.models.loading import load_model
from diffeval.models.spec import ModelSpec


def test_seed_example_rows_sum_to_one_minus_lambda_and_13_negative():
    torch.manual_seed(0)
    q1, k1, q2, k2 = torch.randn(4, 6, 8)
    weights = differential_map(q1, k1, q2, k2, 0.8, scaling=1 / math.sqrt(8))
    assert torch.allclose(weights.sum(-1), torch.full((6,), 0.2), atol=1e-6)
    assert int((weights < 0).sum()) == 13


def test_lambda_init_follows_paper_equation():
    assert lambda_init(0) == 0.8 - 0.6  # layer l = 1 in the paper
    assert abs(lambda_init(3) - (0.8 - 0.6 * math.exp(-0.9))) < 1e-12


def test_learned_lambda_is_eq2_of_each_layers_parameters(tiny_models):
    loaded = load_model(ModelSpec("diff", str(tiny_models["diff"])), "cpu")
    rows = layer_lambdas(loaded.model)
    attention = loaded.model.model.layers[1].self_attn
    expected = (
        torch.exp((attention.lambda_q1 * attention.lambda_k1).sum())
        - torch.exp((attention.lambda_q2 * attention.lambda_k2).sum())
        + attention.lambda_init
    )
    assert [r["layer"] for r in rows] == [0, 1]
    assert abs(rows[1]["lambda"] - float(expected.detach())) < 1e-6
    assert rows[1]["lambda_init"] == lambda_init(1)
    assert loaded.info.is_diff and loaded.info.lambdas == rows
