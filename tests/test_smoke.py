import torch

from captum_attnflow import AttentionRollout


def test_rollout_rows_sum_to_one_on_tiny_bert(tiny_model_factory):
    model = tiny_model_factory("bert")
    scores = AttentionRollout(model).attribute(torch.tensor([[1, 5, 7, 2]]))
    assert scores.shape == (1, 4)
    torch.testing.assert_close(scores.sum(-1), torch.ones(1))
