from __future__ import annotations

import torch

from memdpc.model.resnet2d3d import FrameMaxPool, ResNet2d3d


def test_r18_stage_shapes_for_a_5x128_block():
    net = ResNet2d3d(18).eval()
    with torch.no_grad():
        stages = net.stages(torch.randn(1, 3, 5, 128, 128))
    # (C, T, H, W) of stem conv, pool, res2, res3, res4, res5 (paper appendix table)
    expected = [
        (64, 5, 64, 64),
        (64, 5, 32, 32),
        (64, 5, 32, 32),
        (128, 5, 16, 16),
        (256, 3, 8, 8),
        (256, 2, 4, 4),
    ]
    assert [tuple(s.shape[1:]) for s in stages] == expected
    with torch.no_grad():
        assert torch.equal(
            net(torch.zeros(1, 3, 5, 128, 128)), net.stages(torch.zeros(1, 3, 5, 128, 128))[-1]
        )


def test_frame_max_pool_is_the_reference_max_pool_3d_forward_and_backward():
    x = torch.randn(2, 4, 3, 11, 10, requires_grad=True)
    ours, ref = FrameMaxPool()(x), torch.nn.MaxPool3d((1, 3, 3), (1, 2, 2), (0, 1, 1))(x)
    assert torch.equal(ours, ref)
    g = torch.randn_like(ref)
    assert torch.equal(*(torch.autograd.grad(y, x, g)[0] for y in (ours, ref)))


def test_frame_max_pool_keeps_channels_last_3d_without_a_copy():
    """In channels_last_3d (the CUDA fast defaults) the pool reads its input as a view and gives the reference's
    values in that layout, forward and backward."""
    x = torch.randn(2, 4, 3, 11, 10).contiguous(memory_format=torch.channels_last_3d).requires_grad_()
    ours, ref = FrameMaxPool()(x), torch.nn.MaxPool3d((1, 3, 3), (1, 2, 2), (0, 1, 1))(x)
    assert torch.equal(ours, ref) and ours.is_contiguous(memory_format=torch.channels_last_3d)
    grad = torch.autograd.grad(ours, x, torch.ones_like(ours))[0]
    assert grad.is_contiguous(memory_format=torch.channels_last_3d)
    assert torch.equal(grad, torch.autograd.grad(ref, x, torch.ones_like(ref))[0])


def test_last_block_is_not_rectified_and_earlier_ones_are():
    net = ResNet2d3d(18, widths=(8, 8, 16, 16)).eval()
    with torch.no_grad():
        stages = net.stages(torch.randn(2, 3, 5, 64, 64))
    assert all((s >= 0).all() for s in stages[:-1])
    assert (stages[-1] < 0).any()


def test_widths_and_depth_set_channels_and_blocks():
    net = ResNet2d3d(34, widths=(8, 8, 16, 24))
    assert net.out_channels == 24
    assert [len(getattr(net, f"layer{i}")) for i in range(1, 5)] == [3, 4, 6, 3]
    kernels = {
        name: m.kernel_size for name, m in net.named_modules() if name.endswith("conv1") and "." in name
    }
    assert kernels["layer2.0.conv1"] == (1, 3, 3) and kernels["layer3.0.conv1"] == (3, 3, 3)


def test_batchnorm_tracks_running_stats_by_default():
    net = ResNet2d3d(18, widths=(8, 8, 16, 16))
    before = net.bn1.running_mean.clone()
    net.train()(torch.randn(2, 3, 5, 32, 32) + 3)
    assert not torch.equal(before, net.bn1.running_mean)
    assert ResNet2d3d(18, widths=(8, 8, 16, 16), track_running_stats=False).bn1.running_mean is None
