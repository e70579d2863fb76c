#!/usr/bin/env bash
# Section 6.3 of the paper, WSJ only: English constituency parsing as translation.
#
#   examples/parsing_wsj/run.sh [options] TREEBANK [WORK_DIR]
#
# TREEBANK is your licensed copy of the Penn Treebank WSJ .mrg files (e.g. LDC99T42
# treebank_3/parsed/mrg/wsj, searched recursively): it is never downloaded. Sections 02-21
# train, 22 dev, 23 test; a 16k source vocabulary; transformer_parse (4 layers, d_model 1024);
# beam 21, alpha 0.3, max length input + 300; EVALB (COLLINS.prm) F1, target 91.3.
#
# Options:
#   --gpus N        GPUs on this machine (N > 1 launches torchrun)          [1]
#   --max-update N  training updates (not given in the paper; see README)  [$MAX_UPDATE or 30000]
#   --dry-run       print the commands instead of running them
#   --tiny          the whole chain for real on tests/fixtures/parsing/mini, transformer_tiny,
#                   a few updates (seconds on a CPU); TREEBANK may be left out
#
# Each step leaves WORK_DIR/.done/STEP when it finished and is skipped on the next run, so an
# interrupted run resumes where it stopped (training resumes from checkpoint_last.pt).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
gpus=1
max_update="${MAX_UPDATE:-30000}"
dry_run=0
tiny=0
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --gpus) gpus="${2:?--gpus needs a number}"; shift 2 ;;
    --max-update) max_update="${2:?--max-update needs a number}"; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    --tiny) tiny=1; shift ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "run.sh: error: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) args+=("$1"); shift ;;
  esac
done

case "$gpus/$max_update" in
  *[!0-9/]*|/*|*/|0/*) echo "run.sh: error: --gpus and --max-update take positive numbers" >&2; exit 2 ;;
esac

if [ "$tiny" = 1 ]; then
  treebank="${args[0]:-$repo/tests/fixtures/parsing/mini}"
  work="${args[1]:-parsing_wsj_tiny}"
  splits=(--split train=0001-0003 --split valid=0001-0003 --split test=0001-0003)
  arch=transformer_tiny; max_update=6; warmup=4; vocab=16000
  train_opts=(--max-tokens 512 --save-interval-updates 2 --keep-last 1 --device cpu --threads 1)
  gen_opts=(--device cpu --threads 1)
else
  if [ "${#args[@]}" -lt 1 ]; then
    echo "run.sh: error: give the folder of your Penn Treebank WSJ .mrg files (see --help)" >&2
    exit 2
  fi
  treebank="${args[0]}"
  work="${args[1]:-parsing_wsj}"
  splits=(--split train=0200-2199 --split valid=2200-2299 --split test=2300-2399)
  arch=transformer_parse; warmup=16000; vocab=16000
  # ~25000 tokens per update as the base translation model: 3125 per GPU x update-freq.
  update_freq=$(( (8 + gpus - 1) / gpus ))
  train_opts=(--max-tokens 3125 --update-freq "$update_freq" --save-interval-updates 1000
              --keep-last 5)
  gen_opts=()
fi
if [ "$dry_run" = 0 ] && [ ! -e "$treebank" ]; then
  echo "run.sh: error: $treebank: no such file or folder" >&2; exit 1
fi

data="$work/text"; bin="$work/data-bin"; ckpt="$work/checkpoints"; out="$work/results"

# step NAME [--stdout FILE] CMD...: run CMD (print it in a dry run) unless WORK/.done/NAME
# exists, then write that marker. --stdout FILE is written through FILE.tmp and renamed, so a
# half-written FILE never exists.
step() {
  local name="$1" dest=""; shift
  if [ "$1" = --stdout ]; then dest="$2"; shift 2; fi
  if [ "$dry_run" = 1 ]; then
    echo "# [$name]"
    printf '%q ' "$@" | sed 's/ $//'
    if [ -n "$dest" ]; then printf ' > %q\n' "$dest"; else echo; fi
    return
  fi
  if [ -e "$work/.done/$name" ]; then echo "$name: already complete, skipping" >&2; return; fi
  echo "\$ $*${dest:+ > $dest}" >&2
  if [ -n "$dest" ]; then "$@" > "$dest.tmp"; mv "$dest.tmp" "$dest"; else "$@"; fi
  mkdir -p "$work/.done"
  date -u +%FT%TZ > "$work/.done/.$name.tmp" && mv "$work/.done/.$name.tmp" "$work/.done/$name"
}
# The nmt-* console scripts, or bin/ of this checkout when they are not installed.
if command -v nmt-train >/dev/null 2>&1; then
  preprocess=(nmt-preprocess); train=(nmt-train); generate=(nmt-generate); score=(nmt-score)
  torchrun_opts=(--no-python)
else
  preprocess=(python3 "$repo/bin/nmt-preprocess"); train=(python3 "$repo/bin/nmt-train")
  generate=(python3 "$repo/bin/nmt-generate"); score=(python3 "$repo/bin/nmt-score")
  torchrun_opts=()
fi
if [ "$gpus" -gt 1 ]; then
  train=(torchrun --standalone --nproc_per_node "$gpus" "${torchrun_opts[@]}" "${train[@]: -1}")
fi

[ "$dry_run" = 1 ] || mkdir -p "$work" "$out"

# 1. Trees -> words / linearized trees (examples/parsing_wsj/prepare.py, see README).
step prepare python3 "$here/prepare.py" "$treebank" "$data" "${splits[@]}"

# 2. A 16k source vocabulary (words, no subwords); the target is the bracket symbols and XX.
#    No length filter: linearized trees are ~4x longer than their sentences.
step preprocess "${preprocess[@]}" -s words -t lin --trainpref "$data/train" \
  --validpref "$data/valid" --testpref "$data/test" --destdir "$bin" --overwrite \
  --subword none --vocab-size "$vocab" --max-len 0 --max-len-ratio 0

# 3. transformer_parse. Dropout 0.2 (residual and attention) and 16000 warm-up steps follow
#    tensor2tensor's transformer_parsing_base; the paper says only that they were tuned on 22.
step train "${train[@]}" "$bin" --arch "$arch" \
  -o dropout=0.2 -o attention_dropout=0.2 --warmup "$warmup" --max-update "$max_update" \
  --save-dir "$ckpt" "${train_opts[@]}"

# 4. Beam 21, alpha 0.3, max length input + 300 on section 23.
step generate "${generate[@]}" "$ckpt/checkpoint_last.pt" --input "$data/test.words" \
  --output "$out/test.lin" --beam 21 --lenpen 0.3 --max-len-a 1 --max-len-b 300 "${gen_opts[@]}"

# 5. Back to trees over the input words (ill-formed output repaired), then EVALB F1.
step delinearize --stdout "$out/test.trees" python3 "$here/delinearize.py" \
  "$data/test.words" "$out/test.lin" --tags "$data/test.tags"
step score --stdout "$out/bracket_f1.txt" "${score[@]}" --ref "$data/test.gold" \
  --hyp "$out/test.trees" --metric bracket-f1

[ "$dry_run" = 1 ] || cat "$out/bracket_f1.txt"
