"""Training in the paper's regime (section 5).

    from nmt.training.loop import TrainConfig, train          # the whole run (nmt-train)
    from nmt.checkpoint import load_checkpoint, load_model_from_checkpoint
    from nmt.training.average import average_checkpoints

Modules: loss (label-smoothed cross entropy), optim (Adam + eq. 5), trainer (one update),
loop (epochs, validation, checkpoints, resume), checkpoint, average, distributed (torchrun),
validate (loss, greedy BLEU), curves (JSON-lines log, PNG), flops (analytic FLOP count).
"""
