"""CLLM losses: consistency (student on a noisy block vs stop-gradient teacher at the fixed
point) and the AR loss that keeps the model's own distribution (prevents collapse)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vllm_cllm.training.quality import repeated_ngram_ends


def consistency_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                     mask: torch.Tensor) -> torch.Tensor:
    """Forward KL(teacher || student), averaged over masked positions.

    Shapes: logits [B, n, V] (the predictions for the n block positions), mask [B, n]: bool,
    or float weights (a weighted mean). The teacher is detached here: gradients flow only
    through the student.
    """
    teacher = F.log_softmax(teacher_logits.detach().float(), dim=-1)
    student = F.log_softmax(student_logits.float(), dim=-1)
    kl = (teacher.exp() * (teacher - student)).sum(-1)
    weight = mask.to(kl.dtype)
    return (kl * weight).sum() / weight.sum().clamp_min(1.0)


def ar_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy; labels aligned with inputs, -100 where ignored."""
    shifted = logits[:, :-1].float()
    target = labels[:, 1:]
    return F.cross_entropy(shifted.reshape(-1, shifted.shape[-1]), target.reshape(-1),
                           ignore_index=-100)


@dataclass
class AnchoredAnswer:
    """The clean answer's next-token logits, the model's beside the frozen base's."""

    answer: torch.Tensor  # [B, W - 1] bool: the positions whose next token is an answer token
    logits: torch.Tensor  # [N, V] the model's at those positions
    reference: torch.Tensor  # [N, V] the base's there
    loss: torch.Tensor  # KL(base || model), averaged over them: the anchored AR term
    greedy_agreement: float  # the share of them whose greedy token is the base's


def anchored_answer(logits: torch.Tensor, reference: torch.Tensor, labels: torch.Tensor
                    ) -> AnchoredAnswer:
    """The AR term anchored on a frozen base, for packed rows whose clean sequence comes first.

    ``logits`` [B, L, V] are the model's on the packed rows, ``reference`` [B, W, V] the base's
    on their clean parts (:func:`~vllm_cllm.training.trainer.base_logits`), ``labels`` [B, L]
    the answer tokens (-100 elsewhere). The KL holds the base's whole distribution there, not
    only its greedy token (which a cross-entropy on the greedy answer sharpens towards repeats).
    """
    width = reference.shape[1]
    answer = labels[:, 1:width] != -100  # logits at t predict the token t + 1
    clean, clean_reference = logits[:, :width - 1][answer], reference[:, :-1][answer]
    loss = consistency_loss(clean, clean_reference,
                            torch.ones(len(clean), dtype=torch.bool, device=clean.device))
    with torch.no_grad():
        agreement = float((clean.argmax(-1) == clean_reference.argmax(-1)).float().mean())
    return AnchoredAnswer(answer, clean, clean_reference, loss, agreement)


def position_weights(mask: torch.Tensor, decay: float) -> torch.Tensor:
    """Weights ``decay ** j`` for the j-th loss position behind a state's first wrong token.

    The Jacobi draft after a rejection is the model's prediction behind one wrong token, then
    behind two, ...; a step accepts the j-th of them only if all before it were right, so the
    first positions decide the speed (measured on the demo: the first tail token is right 29 %
    of the time, later ones 68–96 % once the first is). ``decay`` 1 weighs all alike.
    """
    weights = mask.float()
    if decay != 1.0:
        rank = torch.cumsum(mask.long(), dim=-1) - 1
        weights = weights * decay ** rank.clamp_min(0).float()
    return weights


def block_mask(states: torch.Tensor, fixed: torch.Tensor, window: int = 0) -> torch.Tensor:
    """Positions after the first token where a state differs from the fixed point.

    Before and at that token the student's prefix equals the teacher's, so the two
    distributions are identical (CLLM's rule: no loss on identical logits). ``window`` > 0
    keeps only the first ``window`` positions after it: a Jacobi step accepts a token only if
    every earlier one was accepted, so the positions right behind the first wrong token are
    the ones that buy speed, and far ones (nearly unpredictable) would dominate the mean.
    """
    differs = states != fixed
    first = torch.where(differs.any(-1), differs.float().argmax(-1),
                        torch.full_like(differs[:, 0], states.shape[-1], dtype=torch.long))
    positions = torch.arange(states.shape[-1], device=states.device).unsqueeze(0)
    after = positions > first.unsqueeze(-1)
    if window > 0:
        after &= positions <= first.unsqueeze(-1) + window
    return after


def repeat_mask(labels: torch.Tensor, n: int) -> torch.Tensor:
    """[B, L] bool: the labelled (answer) tokens of each row that complete an n-gram already
    in that row's answer (:func:`repeated_ngram_ends` on its labels other than -100)."""
    mask = torch.zeros(labels.shape, dtype=torch.bool)
    for row, row_labels in zip(mask, labels.cpu(), strict=True):
        answer = row_labels != -100
        row[answer] = torch.tensor(repeated_ngram_ends(row_labels[answer].tolist(), n),
                                   dtype=torch.bool)
    return mask.to(labels.device)


def repeat_excess(student_logits: torch.Tensor, reference_logits: torch.Tensor,
                  targets: torch.Tensor, repeats: torch.Tensor) -> torch.Tensor:
    """Sum of relu(log p_student - log p_reference) of the repeating targets, per position.

    Shapes: logits [N, V], targets and repeats [N]; the sum over the ``repeats`` positions
    is divided by N (all answer positions), so the term grows with how much of the answer
    repeats. One-sided: it pulls down only a repetition the student is surer of than the
    reference, so it holds the reference's own rate of repeats rather than removing them.
    """
    student = F.log_softmax(student_logits.float(), dim=-1)
    reference = F.log_softmax(reference_logits.detach().float(), dim=-1)
    gold = targets.unsqueeze(-1)
    excess = (student.gather(-1, gold) - reference.gather(-1, gold)).squeeze(-1)
    return (torch.relu(excess) * repeats.to(excess.dtype)).sum() / max(len(targets), 1)
