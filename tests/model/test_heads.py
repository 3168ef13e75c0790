from __future__ import annotations

import torch
import torch.nn.functional as F

from memdpc.model import Classifier, LinearHead, MLPHead, OopsHead, create_model

from .conftest import TINY


def test_classifier_from_pretrained_shares_the_pretrained_features(clips):
    model = create_model("memdpc_r18", widths=TINY, seed=0).eval()
    clf = Classifier.from_pretrained(model, num_classes=5, dropout=0.9).eval()
    with torch.no_grad():
        torch.testing.assert_close(clf.features(clips), model.features(clips))
        assert clf(clips).shape == (2, 5)
    rebuilt = create_model(**clf.config)
    rebuilt.load_state_dict(clf.state_dict())
    assert clf.config["name"] == "classifier_r18" and clf.feature_dim == 128


def test_classifier_layers_and_finetune_step(clips):
    clf = create_model("classifier_r18", widths=TINY, num_classes=4, bidirectional=False, seed=0)
    assert clf.feature_dim == 64 and clf.head.final_bn.num_features == 64
    assert clf.head.final_fc[0].p == 0.9
    F.cross_entropy(clf(clips), torch.tensor([1, 3])).backward()
    assert clf.backbone.conv1.weight.grad.abs().sum() > 0 and clf.agg_b is None


def test_linear_head_is_batchnorm_dropout_linear():
    head = LinearHead(6, 3, dropout=0.5).eval()
    x = torch.randn(10, 6)
    bn = head.final_bn
    expected = F.linear(
        (x - bn.running_mean) / torch.sqrt(bn.running_var + bn.eps),
        head.final_fc[1].weight,
        head.final_fc[1].bias,
    )
    torch.testing.assert_close(head(x), expected)


def test_mlp_probe_learns_a_nonlinear_rule():
    torch.manual_seed(0)
    x = torch.randn(256, 2)
    y = ((x[:, 0] * x[:, 1]) > 0).long()  # XOR of signs: not linearly separable
    head = MLPHead(2, 2, hidden=32, dropout=0.0)
    opt = torch.optim.Adam(head.parameters(), lr=0.02)
    for _ in range(100):
        opt.zero_grad()
        F.cross_entropy(head(x), y).backward()
        opt.step()
    assert (head.eval()(x).argmax(1) == y).float().mean() > 0.9


def test_oops_head_concatenates_z_and_prediction_per_step():
    head = OopsHead(4)
    z, zhat = torch.randn(2, 7, 4), torch.randn(2, 7, 4)
    out = head(z, zhat)
    assert out.shape == (2, 7, 3)
    w, b = head.fc.weight, head.fc.bias
    torch.testing.assert_close(out, z @ w[:, :4].t() + zhat @ w[:, 4:].t() + b)
