"""Training in the paper's regime (section 5).

    from nmt.training.loop import TrainConfig, train          # the whole run (nmt-train)
    from nmt.checkpoint import load_checkpoint, load_model_from_checkpoint
    from nmt.training.average import average_checkpoints

Modules: loop (the run top to bottom: set-up, updates, validation, saving, resuming), setup
(the run's parts before its first update), trainer (one update), loss (label-smoothed cross
entropy), optim (Adam + eq. 5), policy (when to save/validate/stop), selection (the best
checkpoint), savedir (the save directory), resume (the training half of a checkpoint: what is
saved, checked and restored), end (averages and the ensemble at the end of a run), report (what
the run logs), validate (loss; BLEU/chrF/bracket F1 by beam search, as nmt-generate),
init_from, average, distributed (torchrun), signals, curves (JSON-lines log, PNG,
TensorBoard), flops (analytic FLOP count). The checkpoint format itself is nmt.checkpoint.
"""
