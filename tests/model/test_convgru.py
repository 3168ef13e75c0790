from __future__ import annotations

import torch

from memdpc.model.convgru import ConvGRU, ConvGRUCell


def test_cell_matches_gru_equations():
    torch.manual_seed(0)
    cell = ConvGRUCell(3, 4, 1)
    x, h = torch.randn(2, 3, 5, 5), torch.randn(2, 4, 5, 5)

    def gate(conv, inp):  # a 1×1 conv is a per-position linear map
        return torch.einsum("oi,bihw->bohw", conv.weight[:, :, 0, 0], inp) + conv.bias[None, :, None, None]

    xh = torch.cat([x, h], 1)
    u, r = torch.sigmoid(gate(cell.update_gate, xh)), torch.sigmoid(gate(cell.reset_gate, xh))
    o = torch.tanh(gate(cell.out_gate, torch.cat([x, h * r], 1)))
    torch.testing.assert_close(cell(x, h), h * (1 - u) + o * u)
    torch.testing.assert_close(cell(x, None), cell(x, torch.zeros_like(h)))


def test_sequence_returns_last_or_all_states_and_drops_out_in_training():
    gru = ConvGRU(3, 4, 1, dropout=0.5)
    x = torch.randn(2, 6, 3, 2, 2)
    gru.eval()
    states = gru(x, return_all=True)
    assert states.shape == (2, 6, 4, 2, 2)
    torch.testing.assert_close(gru(x), states[:, -1])
    torch.testing.assert_close(gru(x[:, 3:], states[:, 2]), states[:, -1])
    gru.train()
    assert (gru(x) == 0).float().mean() > 0.2
