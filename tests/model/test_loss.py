from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from memdpc.model.loss import RELATION_TEMPERATURE, content_share, dense_infonce, relation_loss, topk_accuracy


def _targets(b=3, t=3, d=32, hw=2):
    return torch.randn(b, t, d, hw, hw, generator=torch.Generator().manual_seed(1))


def test_matches_a_loop_over_every_prediction():
    pred, tgt = _targets(), _targets() + 0.3 * torch.randn(3, 3, 32, 2, 2)
    rows = [(b, t, i, j) for b in range(3) for t in range(3) for i in range(2) for j in range(2)]
    losses = []
    for n, (b, t, i, j) in enumerate(rows):
        scores = torch.stack([pred[b, t, :, i, j] @ tgt[b2, t2, :, i2, j2] for b2, t2, i2, j2 in rows])
        losses.append(F.cross_entropy(scores[None], torch.tensor([n])))
    torch.testing.assert_close(dense_infonce(pred, tgt)["loss"], torch.stack(losses).mean())


@pytest.mark.parametrize("negatives", ["same_position", "other_clips", "own_clip"])
def test_restricted_negatives_match_a_loop_over_every_prediction(negatives):
    pred, tgt = (
        _targets(),
        _targets() + 0.3 * torch.randn(3, 3, 32, 2, 2, generator=torch.Generator().manual_seed(2)),
    )
    losses, hits = [], []
    for b, t, i, j in [(b, t, i, j) for b in range(3) for t in range(3) for i in range(2) for j in range(2)]:
        # the candidates at (i, j): every clip's at every step, or at step t only; or the clip's own steps
        cands = {
            "same_position": [(b2, t2) for b2 in range(3) for t2 in range(3)],
            "other_clips": [(b2, t) for b2 in range(3)],
            "own_clip": [(b, t2) for t2 in range(3)],
        }[negatives]
        scores = torch.stack([pred[b, t, :, i, j] @ tgt[b2, t2, :, i, j] for b2, t2 in cands])
        own = cands.index((b, t))
        losses.append(F.cross_entropy(scores[None], torch.tensor([own])))
        hits.append(float(scores.argmax() == own))
    out = dense_infonce(pred, tgt, negatives=negatives)
    torch.testing.assert_close(out["loss"], torch.stack(losses).mean())
    assert out["top1"].item() == pytest.approx(sum(hits) / len(hits))


def test_other_clips_ignore_what_changes_within_a_clip():
    pred, tgt = _targets(), _targets()
    step = 5 * torch.randn(1, 3, 32, 1, 1, generator=torch.Generator().manual_seed(4))  # one vector per step
    other = [dense_infonce(pred, tgt + shift, negatives="other_clips")["loss"] for shift in (0, step)]
    torch.testing.assert_close(other[0], other[1])
    same = [dense_infonce(pred + step, tgt + shift, negatives="same_position")["loss"] for shift in (0, step)]
    assert same[1] < same[0] - 1  # with the clip's other steps as negatives, telling the steps apart pays


def test_own_clip_negatives_ignore_what_a_clip_keeps_and_need_the_order_of_its_steps():
    pred, tgt = _targets(), _targets()
    clip = 5 * torch.randn(3, 1, 32, 1, 1, generator=torch.Generator().manual_seed(5))  # one vector per clip
    own = [dense_infonce(pred, tgt + shift, negatives="own_clip")["loss"] for shift in (0, clip)]
    torch.testing.assert_close(own[0], own[1])  # what every step of a clip shares cancels
    step = 5 * torch.randn(1, 3, 32, 1, 1, generator=torch.Generator().manual_seed(4))
    ordered = dense_infonce(pred + step, tgt + step, negatives="own_clip")["loss"]
    shuffled = dense_infonce(pred + step, tgt + step[:, [2, 0, 1]], negatives="own_clip")["loss"]
    assert (
        ordered < math.log(3) - 1 < math.log(3) + 1 < shuffled
    )  # steps in time order pay, out of order cost


def test_only_same_position_negatives_ignore_what_tells_positions_apart():
    pred, tgt = _targets(), _targets()
    where = 5 * torch.randn(
        1, 1, 32, 2, 2, generator=torch.Generator().manual_seed(3)
    )  # one vector per position
    same = [dense_infonce(pred, tgt + shift, negatives="same_position")["loss"] for shift in (0, where)]
    every = [dense_infonce(pred + where, tgt + shift)["loss"] for shift in (0, where)]
    torch.testing.assert_close(same[0], same[1])  # the position term is equal for every candidate: it cancels
    assert every[1] < every[0] - 1  # with all negatives, matching positions alone lowers the loss
    assert same[0] < dense_infonce(pred, tgt)["loss"]  # fewer candidates: B·T instead of B·T·H·W
    with pytest.raises(ValueError, match="negatives must be one of all, same_position"):
        dense_infonce(pred, tgt, negatives="pooled")


def test_true_targets_beat_shuffled_targets():
    tgt = _targets()
    right = dense_infonce(tgt.clone(), tgt)
    perm = torch.randperm(tgt.shape[0] * tgt.shape[1], generator=torch.Generator().manual_seed(0))
    shuffled = tgt.flatten(0, 1)[perm].view_as(tgt)
    wrong = dense_infonce(shuffled, tgt)
    assert right["loss"] < wrong["loss"]
    assert right["top1"] == 1.0 and wrong["top1"] < 0.5


def test_uninformative_predictions_give_log_n():
    tgt = _targets()
    n = tgt.numel() // tgt.shape[2]
    out = dense_infonce(torch.zeros_like(tgt), tgt)
    assert math.isclose(out["loss"].item(), math.log(n), rel_tol=1e-6)


@pytest.mark.parametrize(
    "negatives, candidates",
    [("all", 3 * 3 * 2 * 2), ("same_position", 3 * 3), ("other_clips", 3), ("own_clip", 3)],
)
def test_chance_is_the_loss_of_a_uniform_guess_over_each_predictions_candidates(negatives, candidates):
    tgt = _targets()
    uniform = dense_infonce(torch.zeros_like(tgt), tgt, negatives=negatives)  # every score equal
    assert uniform["chance"].item() == pytest.approx(math.log(candidates))
    assert uniform["loss"].item() == pytest.approx(uniform["chance"].item(), rel=1e-6)
    learnt = dense_infonce(tgt.clone(), tgt, negatives=negatives)
    assert learnt["chance"].item() == uniform["chance"].item() > learnt["loss"].item()


def test_normalised_critic_with_temperature():
    tgt = _targets()
    out = dense_infonce(5 * tgt, tgt, temperature=0.07)
    p = F.normalize(tgt.permute(0, 1, 3, 4, 2).reshape(-1, 32), dim=1)
    expected = F.cross_entropy(p @ p.t() / 0.07, torch.arange(p.shape[0]))
    torch.testing.assert_close(out["loss"], expected)
    assert dense_infonce(5 * tgt, tgt)["loss"] < out["loss"]  # raw scores grow with the norm, cosine does not


def test_topk_accuracy_counts_hits_and_caps_k():
    scores = torch.tensor([[0.9, 0.5, 0.1], [0.2, 0.1, 0.7], [0.3, 0.6, 0.1]])
    top1, top2 = topk_accuracy(scores, torch.tensor([0, 0, 2]), (1, 2))
    assert top1.item() == pytest.approx(1 / 3) and top2.item() == pytest.approx(2 / 3)
    assert topk_accuracy(scores, torch.tensor([0, 0, 2]), (5,))[0].item() == 1.0


def test_content_share_separates_what_tells_clips_apart_from_what_tells_positions_apart():
    g = torch.Generator().manual_seed(2)
    where = torch.randn(1, 1, 8, 3, 3, generator=g).expand(
        4, 3, 8, 3, 3
    )  # the same map for every clip and step
    which = torch.randn(4, 3, 8, 1, 1, generator=g).expand(4, 3, 8, 3, 3)  # the same vector at every position
    assert content_share(where).item() == pytest.approx(0.0, abs=1e-6)
    assert content_share(which).item() == pytest.approx(1.0)
    assert content_share(where + 1e-2 * which).item() < 1e-3 < content_share(where + which).item()
    # the positional shortcut: features that only say where they are take the loss from ln(B·T·H·W) to ln(B·T)
    onehot = 10 * torch.eye(9).view(1, 1, 9, 3, 3).expand(4, 3, 9, 3, 3)
    assert content_share(onehot).item() == 0.0
    assert dense_infonce(onehot, onehot)["loss"].item() == pytest.approx(math.log(4 * 3), rel=1e-3)


def test_topk_accuracy_ranks_equal_scores_by_column():
    """A label tied with other columns counts as ranked below the lower ones and above the higher ones."""
    scores = torch.tensor(
        [[0.5, 0.5, 0.5, 0.1], [0.5, 0.5, 0.5, 0.1], [0.2, 0.2, 0.2, 0.2], [0.1, 0.3, 0.3, 0.3]]
    )
    labels = torch.tensor([0, 2, 3, 1])  # ranks 0, 2, 3 and 0 (the tie at 0.3 goes to the lowest column)
    top1, top2, top3 = topk_accuracy(scores, labels, (1, 2, 3))
    assert (top1.item(), top2.item(), top3.item()) == (0.5, 0.5, 0.75)


def _relation_by_loop(student: torch.Tensor, teacher: torch.Tensor) -> float:
    """The relation loss written out clip by clip."""
    s = F.normalize(student - student.mean(0), dim=1)
    t = F.normalize(teacher - teacher.mean(0), dim=1)
    total = 0.0
    for i in range(len(s)):
        others = [j for j in range(len(s)) if j != i]
        target = F.softmax(torch.stack([t[i] @ t[j] for j in others]) / RELATION_TEMPERATURE, dim=0)
        log_p = F.log_softmax(torch.stack([s[i] @ s[j] for j in others]) / RELATION_TEMPERATURE, dim=0)
        total += -(target * log_p).sum().item()
    return total / len(s)


def test_relation_loss_matches_a_loop_over_every_clip_and_ignores_scale_and_shift():
    g = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(6, 8, generator=g), torch.randn(6, 5, generator=g)
    loss = relation_loss(student, teacher).item()
    assert loss == pytest.approx(_relation_by_loop(student, teacher), rel=1e-5)
    assert relation_loss(3 * student + 1, teacher).item() == pytest.approx(loss, rel=1e-5)


def test_relation_loss_is_lowest_where_the_student_finds_alike_what_the_teacher_does():
    """Two groups of clips under the teacher (alike motion); a student that groups them the same way scores lower
    than one that groups them by something else (their looks), and the gradient moves the student towards it."""
    g = torch.Generator().manual_seed(1)
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    across = torch.tensor([0, 1, 0, 1, 0, 1])  # another grouping of the same clips
    teacher = F.one_hot(groups).float() + 0.05 * torch.randn(6, 2, generator=g)
    noise = 0.05 * torch.randn(6, 2, generator=g)
    alike = relation_loss(F.one_hot(groups).float() + noise, teacher)
    other = relation_loss(F.one_hot(across).float() + noise, teacher)
    assert alike < other
    student = (F.one_hot(across).float() + noise).requires_grad_()
    relation_loss(student, teacher).backward()
    with torch.no_grad():
        assert relation_loss(student - 0.5 * student.grad, teacher) < other


def test_relation_loss_refuses_batches_it_cannot_compare():
    with pytest.raises(ValueError, match="3 or more"):
        relation_loss(torch.randn(2, 4), torch.randn(2, 4))
    with pytest.raises(ValueError, match="same batch"):
        relation_loss(torch.randn(4, 4), torch.randn(5, 4))
