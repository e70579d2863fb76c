#!/usr/bin/env bash
# The README's first command: the whole job on the small English-German corpus bundled with nmt
# (3,000 Multi30k training pairs): learn a joined BPE, train transformer_tiny for 800 updates,
# translate the 300 test sentences with beam search, and score them with sacreBLEU.
# A few minutes on 2 CPU cores. Usage: examples/quickstart/run.sh [WORK_DIR] [UPDATES]
set -euo pipefail
work=${1:-quickstart-run}
updates=${2:-800}
corpus=$(python3 -c "from nmt.data.resources import quickstart_dir; print(quickstart_dir())")
mkdir -p "$work"

# Each command prints one line on stdout that the next one reads: data directory, checkpoint,
# translations. Logs and progress go to stderr.
nmt-preprocess -s en -t de \
    --trainpref "$corpus/train" --validpref "$corpus/valid" --testpref "$corpus/test" \
    --joined-dictionary --vocab-size 2000 --destdir "$work/data-bin" --overwrite --quiet \
  | nmt-train --arch transformer_tiny --max-tokens 4096 --max-update "$updates" \
      --warmup 150 --save-interval-updates 200 --save-dir "$work/checkpoints" --no-resume --keep-last 1 \
      --log-interval 100 \
  | nmt-generate --quiet \
  | tee "$work/test.hyp.de" \
  | nmt-score --ref "$corpus/test.de" --metric bleu,chrf

echo "translations: $work/test.hyp.de" >&2
