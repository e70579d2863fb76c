#!/usr/bin/env bash
# Section 6.3 of the paper, WSJ only: English constituency parsing as translation.
#
#   examples/parsing_wsj/run.sh [options] TREEBANK [WORK_DIR]
#   examples/parsing_wsj/run.sh --sample PTB_SAMPLE_DIR [WORK_DIR]
#
# TREEBANK is your licensed copy of the Penn Treebank WSJ .mrg files (e.g. LDC99T42
# treebank_3/parsed/mrg/wsj, searched recursively): it is never downloaded. Sections 02-21
# train, 22 dev, 23 test; a 16k source vocabulary; transformer_parse (4 layers, d_model 1024);
# beam 21, alpha 0.3, max length input + 300; EVALB (COLLINS.prm) F1, target 91.3.
#
# Options:
#   --gpus N        GPUs on this machine (N > 1 launches torchrun)          [1]
#   --max-update N  training updates (not given in the paper; see README)
#                   [$MAX_UPDATE, else 30000; --sample: 6250; --tiny: 6]
#   --dry-run       print the commands instead of running them
#   --sample        PTB_SAMPLE_DIR is the free NLTK sample (wsj_0001.mrg .. wsj_0179.mrg): train
#                   0001-0159, valid 0160-0169, test 0170-0179; the words seen twice or more
#                   as vocabulary, signatures for the others; 2 rounds of new trees made by
#                   substructure substitution beside the treebank's (--substitute 2; give
#                   --substitute 0 for the treebank's alone); transformer_small, dropout 0.3,
#                   cosine learning-rate cycles of 750 updates after the warm-up,
#                   checkpoints chosen by validation bracket F1 (beam 4), the 5 best decoding
#                   the test as an ensemble (alpha 1.0); 6,250 updates (about 2 h on 2 CPU
#                   threads at 0.79-0.93 updates/s, validations included). Test decoded
#                   with and without tree constraints (README: "The treebank sample on a
#                   CPU"). WORK_DIR default ./parsing_wsj_sample
#   --tiny          the whole chain for real on tests/fixtures/parsing/mini, transformer_tiny,
#                   a few updates (seconds on a CPU); TREEBANK may be left out
#   --train-sentences N  train on the first N training sentences only (a learning curve:
#                   one WORK_DIR per N; examples/parsing_wsj/learning_curve.py draws it)
#   --substitute K  add K rounds of new training trees made by substructure substitution (a
#                   phrase replaced by one of the same label from another training tree; Shi
#                   et al. 2021): K=1 about doubles the train split (README: "More trees
#                   from the same treebank")                 [--sample: 2; otherwise 0: off]
#   --rdrop-alpha A R-Drop (nmt-train --rdrop-alpha): each batch passed twice with different
#                   dropout masks, A times the symmetric KL divergence of the two added to the
#                   loss; the batch is the same, so an update does twice the model's work
#                   (README: "R-Drop and seed ensembles")                   [0: off]
#   --seeds N       after the single model's test, train N-1 more runs with seeds 2..N
#                   (WORK/checkpoints-seedK) and decode the valid and test splits with the
#                   ensemble of all N runs (each run's 5 best checkpoints with --sample, its
#                   last otherwise), scored beside the single model, never instead    [1]
#   --extra-test NAME=FIRST-LAST  also parse treebank files FIRST-LAST (by the number in
#                   their name) as the test split is parsed, and score them: the single
#                   model, and the seeds' ensemble with --seeds; prepared in WORK/text-NAME
#                   beside the (original) train split, so with the same signatures
#                   (repeatable; adding one to a finished WORK_DIR parses only those files)
#
# Each step leaves WORK_DIR/.done/STEP, recording its command, when it finished: the next run
# skips it if the command is the same (an interrupted run resumes where it stopped; training
# from checkpoint_last.pt), and otherwise runs it and every later step again. A run that does
# any step forgets the finished steps of options it was not given (--seeds, --extra-test):
# give a work folder its options again each time, or their decoding runs again next time (a
# finished training is not redone: nmt-train finds it complete).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
gpus=1
lenpen=0.3
prep_opts=()
src=words
max_update="${MAX_UPDATE:-}"
train_sentences=""
substitute=""
rdrop_alpha=0
seeds=1
extra_tests=()
dry_run=0
tiny=0
sample=0
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --gpus) gpus="${2:?--gpus needs a number}"; shift 2 ;;
    --max-update) max_update="${2:?--max-update needs a number}"; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    --tiny) tiny=1; shift ;;
    --sample) sample=1; shift ;;
    --train-sentences) train_sentences="${2:?--train-sentences needs a number}"; shift 2 ;;
    --substitute) substitute="${2:?--substitute needs a number}"; shift 2 ;;
    --rdrop-alpha) rdrop_alpha="${2:?--rdrop-alpha needs a number}"; shift 2 ;;
    --seeds) seeds="${2:?--seeds needs a number}"; shift 2 ;;
    --extra-test) extra_tests+=("${2:?--extra-test needs NAME=FIRST-LAST}"); shift 2 ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit 0 ;;
    -*) echo "run.sh: error: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) args+=("$1"); shift ;;
  esac
done

for v in "$gpus" "${max_update:-1}" "${train_sentences:-1}" "$seeds"; do
  case "$v" in
    ''|*[!0-9]*|0*) echo "run.sh: error: --gpus, --max-update, --train-sentences and --seeds take positive numbers" >&2; exit 2 ;;
  esac
done
if [ -z "$substitute" ]; then
  substitute=0; [ "$sample" = 1 ] && substitute=2
fi
case "$substitute" in
  ''|*[!0-9]*|0?*) echo "run.sh: error: --substitute takes a number >= 0, got '$substitute'" >&2; exit 2 ;;
esac
case "$rdrop_alpha" in
  ''|.|*[!0-9.]*|*.*.*) echo "run.sh: error: --rdrop-alpha takes a number >= 0, got '$rdrop_alpha'" >&2; exit 2 ;;
esac
for spec in ${extra_tests[@]+"${extra_tests[@]}"}; do
  case "$spec" in
    train=*|valid=*|test=*|free=*) echo "run.sh: error: --extra-test $spec: train, valid, test and free are names this script uses; give another NAME" >&2; exit 2 ;;
    [A-Za-z]*=*-*) ;;
    *) echo "run.sh: error: --extra-test takes NAME=FIRST-LAST (e.g. extra=0180-0199), got '$spec'" >&2; exit 2 ;;
  esac
  name="${spec%%=*}"; range="${spec#*=}"
  case "$name" in *[!A-Za-z0-9_]*) echo "run.sh: error: --extra-test: NAME may hold letters, digits and _ only, got '$name'" >&2; exit 2 ;; esac
  case "${range%-*}/${range#*-}" in *[!0-9/]*|/*|*/) echo "run.sh: error: --extra-test $spec: FIRST-LAST are file numbers, e.g. 0180-0199" >&2; exit 2 ;; esac
  if [ $((10#${range%-*})) -gt $((10#${range#*-})) ]; then
    echo "run.sh: error: --extra-test $spec: FIRST is after LAST" >&2; exit 2
  fi
  case " ${extra_names-} " in *" $name "*) echo "run.sh: error: --extra-test $name is given twice" >&2; exit 2 ;; esac
  extra_names="${extra_names-} $name"
done
if [ "$tiny" = 1 ] && [ "$sample" = 1 ]; then
  echo "run.sh: error: --tiny and --sample exclude each other" >&2; exit 2
fi
if [ "$sample" = 1 ] && [ "$gpus" -gt 1 ]; then
  echo "run.sh: error: --sample trains on 2 CPU threads; --gpus is for the full treebank" >&2; exit 2
fi

if [ "$tiny" = 1 ]; then
  treebank="${args[0]:-$repo/tests/fixtures/parsing/mini}"
  work="${args[1]:-parsing_wsj_tiny}"
  splits=(--split train=0001-0003 --split valid=0001-0003 --split test=0001-0003)
  arch=transformer_tiny; max_update="${max_update:-6}"; warmup=4
  vocab_opts=(--vocab-size 16000)
  model_opts=(--override dropout=0.2 --override attention_dropout=0.2)
  train_opts=(--max-tokens 512 --save-interval-updates 2 --keep-last 1 --device cpu --threads 1)
  gen_opts=(--device cpu --threads 1)
elif [ "$sample" = 1 ]; then
  if [ "${#args[@]}" -lt 1 ]; then
    echo "run.sh: error: give the folder of the Penn Treebank sample (wsj_0001.mrg .. wsj_0179.mrg; see --help)" >&2
    exit 2
  fi
  # The free Penn Treebank sample (NLTK's; 3,669 sentences in 0001-0179) on 2 CPU threads in 2 h;
  # every choice is explained in README.md, "The treebank sample on a CPU".
  treebank="${args[0]}"
  work="${args[1]:-parsing_wsj_sample}"
  splits=(--split train=0001-0159 --split valid=0160-0169 --split test=0170-0179)
  arch=transformer_small; warmup=1000; max_update="${max_update:-6250}"
  # Lexicalized targets: the tree carries the words themselves, (NP the board )NP, not XX, so
  # the decoder sees where it is in the sentence (copying the next word) instead of counting
  # XX; on 3,400 sentences that is what the model cannot learn otherwise (README). One joined
  # dictionary, shared embeddings: a word is the same vector on both sides. Threshold 4 on
  # the joined counts (each occurrence counts on both sides) = words seen twice. Words seen
  # once in training become signatures of their shape (UNK-Cap, UNK-NUM, UNK-low-ing), so that
  # the model learns what to do with the test's unknown words (11-13% of the valid and test
  # words are not seen twice in training); the model reads WORK/text/*.sig, the trees are
  # built over the words themselves (*.words).
  # Two rounds of substituted trees (--substitute, set above) triple the train split: on
  # validation F1 above one round and above the treebank's trees alone (README: "More trees
  # from the same treebank").
  prep_opts=(--leaves words --signatures 2)
  src=sig
  vocab_opts=(--joined-dictionary --threshold 4)
  model_opts=(--override dropout=0.3 --override attention_dropout=0.2)
  # Validation decodes the valid split as step 4 decodes the test (beam 4 instead of 21 for
  # speed) and scores EVALB F1 against WORK/text/valid.gold: that picks the checkpoints.
  # A fixed 6,250 updates (the end of the 7th cosine cycle below), not a time cap: the same
  # model on every machine, fast or slow; about 2 h at 0.79-0.93 updates/s with the
  # validations, longer on slower machines.
  # No validation before update 1000: an untrained model decodes every sentence to the length
  # limit (2-3 minutes per validation, for F1 near 0).
  # --lr-period 750: after the warm-up the learning rate runs in cosine cycles of 750 updates
  # (warm restarts), so the checkpoints at updates 1750, 2500, ..., 5500, 6250 are annealed
  # snapshots that the ensemble below is made of (README: "Then cosine cycles of 750
  # updates"); the run ends at the end of a cycle, on an annealed snapshot.
  # Length penalty 1.0, in validation and test: chosen on validation F1 (README).
  lenpen=1.0
  train_opts=(--max-tokens 4096 --lr-scale 1.5 --lr-period 750 --save-interval-updates 250
              --keep-last 1
              --best-checkpoint-metric bracket-f1 --valid-beam 4 --valid-lenpen "$lenpen"
              --valid-max-len-a 1 --valid-max-len-b 300 --validate-after-updates 1000
              --patience 10 --ensemble-best 5 --device cpu --threads 2)
  gen_opts=(--device cpu --threads 2)
else
  if [ "${#args[@]}" -lt 1 ]; then
    echo "run.sh: error: give the folder of your Penn Treebank WSJ .mrg files (see --help)" >&2
    exit 2
  fi
  treebank="${args[0]}"
  work="${args[1]:-parsing_wsj}"
  splits=(--split train=0200-2199 --split valid=2200-2299 --split test=2300-2399)
  arch=transformer_parse; warmup=16000; max_update="${max_update:-30000}"
  vocab_opts=(--vocab-size 16000)
  model_opts=(--override dropout=0.2 --override attention_dropout=0.2)
  # ~25000 tokens per update as the base translation model: 3125 per GPU x update-freq.
  update_freq=$(( (8 + gpus - 1) / gpus ))
  train_opts=(--max-tokens 3125 --update-freq "$update_freq" --save-interval-updates 1000
              --keep-last 5)
  gen_opts=()
fi
# R-Drop: alpha 0 (the default) leaves the training command as it was (a finished WORK_DIR
# stays finished); another alpha is another model, in another WORK_DIR (checked below).
if awk -v a="$rdrop_alpha" 'BEGIN { exit !(a + 0 > 0) }'; then
  train_opts+=(--rdrop-alpha "$rdrop_alpha")
fi
if [ "$dry_run" = 0 ] && [ ! -e "$treebank" ]; then
  echo "run.sh: error: $treebank: no such file or folder" >&2; exit 1
fi
# --extra-test files are prepared after training: a range with no file fails now, not then.
[ "$dry_run" = 1 ] || for spec in ${extra_tests[@]+"${extra_tests[@]}"}; do
  range="${spec#*=}"
  if ! find "$treebank" -name '*.mrg' | awk -v a=$((10#${range%-*})) -v b=$((10#${range#*-})) '
      { if (match($0, /[0-9]+[^0-9\/]*$/)) { n = substr($0, RSTART); gsub(/[^0-9]/, "", n)
          if (n + 0 >= a && n + 0 <= b) found = 1 } }
      END { exit !found }'; then
    echo "run.sh: error: --extra-test $spec: no .mrg file numbered $range in $treebank" >&2; exit 2
  fi
done

data="$work/text"; bin="$work/data-bin"; ckpt="$work/checkpoints"; out="$work/results"

# step NAME [--stdout FILE] [--stderr FILE] CMD...: run CMD (print it in a dry run) unless
# WORK/.done/NAME exists, then write that marker. --stdout FILE is written through FILE.tmp and
# renamed, so a half-written FILE never exists; --stderr FILE keeps a copy of CMD's stderr.
step() {
  local name="$1" dest="" errlog=""; shift
  if [ "$1" = --stdout ]; then dest="$2"; shift 2; fi
  if [ "$1" = --stderr ]; then errlog="$2"; shift 2; fi
  if [ "$dry_run" = 1 ]; then
    echo "# [$name]"
    # $(cat FILE) (the ensemble's checkpoints) stays as it is, for a shell to expand
    local arg words=()
    for arg in "$@"; do
      case "$arg" in '$(cat '*')') words+=("$arg") ;; *) words+=("$(printf '%q' "$arg")") ;; esac
    done
    echo -n "${words[*]}"
    if [ -n "$dest" ]; then printf ' > %q' "$dest"; fi
    if [ -n "$errlog" ]; then printf ' 2> %q' "$errlog"; fi
    echo
    return
  fi
  # A step is done when its marker records this very command (paths of this checkout and the
  # way nmt is invoked left out); a step run again makes every later step run again. A
  # marker written before commands were recorded (one line) counts as this command.
  local sig
  sig="$(printf '%q ' "$@" | sed -e "s|python3 $(printf '%q' "$repo")/bin/nmt-|nmt-|g" \
         -e "s|$(printf '%q' "$repo")|REPO|g")"
  if [ "$redo_rest" = 0 ] && [ -e "$work/.done/$name" ]; then
    local recorded
    recorded="$(sed -n 2p "$work/.done/$name")"
    if [ -z "$recorded" ] || [ "$recorded" = "$sig" ]; then
      echo "$name: already complete, skipping" >&2; confirmed+=("$name"); return
    fi
    echo "$name: its settings changed since it ran: running it and every later step again" >&2
  fi
  if [ "$redo_rest" = 0 ] && [ -d "$work/.done" ]; then
    # From here on every step runs again: the markers of this step and of the later ones no
    # longer describe the files, so they go now (a rerun stopped midway leaves results that
    # no marker vouches for, and learning_curve.py refuses them).
    local marker
    for marker in "$work/.done"/*; do
      case " ${confirmed[*]-} " in *" ${marker##*/} "*) ;; *) rm -f "$marker" ;; esac
    done
  fi
  redo_rest=1
  echo "\$ $*${dest:+ > $dest}" >&2
  if [ -n "$errlog" ]; then
    "$@" > "$dest.tmp" 2> "$errlog.tmp" || { cat "$errlog.tmp" >&2; return 1; }
    cat "$errlog.tmp" >&2; mv "$errlog.tmp" "$errlog"; mv "$dest.tmp" "$dest"
  elif [ -n "$dest" ]; then "$@" > "$dest.tmp"; mv "$dest.tmp" "$dest"; else "$@"; fi
  mkdir -p "$work/.done"
  { date -u +%FT%TZ; echo "$sig"; } > "$work/.done/.$name.tmp" &&
    mv "$work/.done/.$name.tmp" "$work/.done/$name"
}
redo_rest=0
confirmed=()     # the steps found complete in this run, in order
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
  train=(torchrun --standalone --nproc_per_node "$gpus" ${torchrun_opts[@]+"${torchrun_opts[@]}"} "${train[@]: -1}")
fi

[ "$dry_run" = 1 ] || mkdir -p "$work" "$out"

# A work dir holds one training-set size: another size would resume training from the other
# size's checkpoint_last.pt and list its checkpoints in the ensemble; refused (dry runs too).
if [ -n "$train_sentences" ]; then prep_opts+=(--train-sentences "$train_sentences"); fi
size="${train_sentences:-all}"
# made_with OPTION VALUE DEFAULT: the work dir's data was prepared with OPTION VALUE, or is
# refused. WORK/.OPTION is written once a prepare succeeded (record_made) and checked
# whenever it is there (a rerun that redoes prepare removes its marker first; stopped then,
# the file still holds); a folder prepared before OPTION existed has none: DEFAULT.
made_with() {
  local file="$work/.$1" made="$3"
  if [ -e "$work/.done/prepare" ] || [ -s "$file" ]; then
    [ -s "$file" ] && made="$(cat "$file")"
    if [ "$made" != "$2" ]; then
      local again="another WORK_DIR"
      [ "$1" = substitute ] && again="--substitute $made to go on with it, or another WORK_DIR"
      echo "run.sh: error: $work was made with --$1 $made, not $2; give $again" >&2
      exit 2
    fi
  fi
}
record_made() {
  local file="$work/.$1"
  if [ "$dry_run" != 1 ] && [ ! -s "$file" ]; then
    echo "$2" > "$file.tmp" && mv "$file.tmp" "$file"
  fi
}
made_with train-sentences "$size" all
# So is the number of substitution rounds, for the same reason. Only the train split of
# step 1 gets them: --extra-test's preparation needs the signatures alone, which count the
# original trees.
made_with substitute "$substitute" 0
sub_opts=()
if [ "$substitute" != 0 ]; then sub_opts=(--substitute "$substitute"); fi

# A work dir holds one R-Drop alpha as well: nmt-train resumes from checkpoint_last.pt, so
# another alpha would continue (or, finished, keep) the model trained with the first one;
# refused (dry runs too). The alpha file is written before training starts; a folder
# trained before this option existed has none: alpha 0.
if [ -e "$work/.done/train" ] || [ -e "$ckpt/checkpoint_last.pt" ] || [ -s "$work/.rdrop-alpha" ]; then
  made=0; [ -s "$work/.rdrop-alpha" ] && made="$(cat "$work/.rdrop-alpha")"
  if ! awk -v a="$made" -v b="$rdrop_alpha" 'BEGIN { exit !(a + 0 == b + 0) }'; then
    echo "run.sh: error: $work was trained with --rdrop-alpha $made, not $rdrop_alpha; give another WORK_DIR" >&2
    exit 2
  fi
fi

# 1. Trees -> words / linearized trees (examples/parsing_wsj/prepare.py, see README).
step prepare python3 "$here/prepare.py" "$treebank" "$data" "${splits[@]}" \
  ${prep_opts[@]+"${prep_opts[@]}"} ${sub_opts[@]+"${sub_opts[@]}"}
record_made train-sentences "$size"
record_made substitute "$substitute"

# 2. Source: words, no subwords (tree constraints count source tokens as words): a 16k
#    vocabulary, or for --sample the words seen at least twice. The target is the bracket
#    symbols and XX. No length filter: linearized trees are ~2.6x longer than their sentences.
step preprocess "${preprocess[@]}" -s "$src" -t lin --trainpref "$data/train" \
  --validpref "$data/valid" --testpref "$data/test" --destdir "$bin" --overwrite \
  --subword none "${vocab_opts[@]}" --max-len 0 --max-len-ratio 0

# 3. transformer_parse. Dropout 0.2 (residual and attention) and 16000 warm-up steps follow
#    tensor2tensor's transformer_parsing_base; the paper says only that they were tuned on 22.
#    --sample: transformer_small; the test is decoded by the ensemble of the 5 best checkpoints
#    by validation bracket F1, which nmt-train lists in WORK/checkpoints/ensemble_best5.txt
#    (README: on validation the ensemble scored above the best of its checkpoints).
# train_run K: train run K (seed K; run 1 is nmt-train's default seed 1, in WORK/checkpoints,
# as before --seeds existed; run K > 1 in WORK/checkpoints-seedK) and set run_models to the
# checkpoints that decode for it.
train_run() {
  local k="$1" dir="$ckpt" name=train suffix="" seed_opts=() stdout_opts=()
  if [ "$k" != 1 ]; then
    dir="$ckpt-seed$k"; name="train_seed$k"; suffix="-seed$k"; seed_opts=(--seed "$k")
  fi
  if [ "$sample" = 1 ]; then stdout_opts=(--stdout "$out/checkpoint$suffix.txt"); fi
  step "$name" ${stdout_opts[@]+"${stdout_opts[@]}"} "${train[@]}" "$bin" --arch "$arch" \
    "${model_opts[@]}" --warmup "$warmup" --max-update "$max_update" \
    --save-dir "$dir" "${train_opts[@]}" ${seed_opts[@]+"${seed_opts[@]}"}
  if [ "$sample" != 1 ]; then
    run_models=("$dir/checkpoint_last.pt")
    return
  fi
  local listing="$dir/ensemble_best5.txt"
  if [ "$dry_run" = 1 ]; then
    run_models=("\$(cat $(printf %q "$listing"))")     # printed as is
    echo "# the checkpoints are those nmt-train listed in $listing"
  else
    [ -s "$listing" ] || { echo "run.sh: error: nmt-train wrote no $listing" >&2; exit 1; }
    mapfile -t run_models < "$listing"
  fi
}
run_models=()
if [ "$dry_run" != 1 ] && [ ! -s "$work/.rdrop-alpha" ]; then
  echo "$rdrop_alpha" > "$work/.rdrop-alpha.tmp" && mv "$work/.rdrop-alpha.tmp" "$work/.rdrop-alpha"
fi
train_run 1
models=("${run_models[@]}")

# 4. Beam 21, alpha 0.3 (--sample: 1.0), max length input + 300 on the test split (section 23),
#    under tree constraints (nmt-generate's default for a parsing checkpoint).
step generate "${generate[@]}" "${models[@]}" --input "$data/test.$src" \
  --output "$out/test.lin" --beam 21 --lenpen "$lenpen" --max-len-a 1 --max-len-b 300 \
  ${gen_opts[@]+"${gen_opts[@]}"}

# 5. Back to trees over the input words (ill-formed output repaired, the repairs counted in
#    WORK/results/repairs.txt), then EVALB F1.
step delinearize --stdout "$out/test.trees" --stderr "$out/repairs.txt" python3 \
  "$here/delinearize.py" "$data/test.words" "$out/test.lin" --tags "$data/test.tags"
step score --stdout "$out/bracket_f1.txt" "${score[@]}" --ref "$data/test.gold" \
  --hyp "$out/test.trees" --metric bracket-f1

# 6. --sample: the same without tree constraints (the model's own output, repaired).
if [ "$sample" = 1 ]; then
  step generate_free "${generate[@]}" "${models[@]}" --input "$data/test.$src" \
    --output "$out/test.free.lin" --beam 21 --lenpen "$lenpen" --max-len-a 1 --max-len-b 300 \
    --no-tree-constraints ${gen_opts[@]+"${gen_opts[@]}"}
  step delinearize_free --stdout "$out/test.free.trees" --stderr "$out/repairs.free.txt" \
    python3 "$here/delinearize.py" "$data/test.words" "$out/test.free.lin" \
    --tags "$data/test.tags"
  step score_free --stdout "$out/bracket_f1.free.txt" "${score[@]}" --ref "$data/test.gold" \
    --hyp "$out/test.free.trees" --metric bracket-f1
fi

# parse_split STEP TEXT SPLIT TAG BEAM MODEL...: decode TEXT/SPLIT.$src with the models (beam
# BEAM, the validation's and step 4's length limits) into WORK/results/TAG.{lin,trees} (the
# repairs in repairs.TAG.txt), scored by EVALB into bracket_f1.TAG.txt; the steps are
# generate_STEP, delinearize_STEP and score_STEP.
parse_split() {
  local name="$1" text="$2" split="$3" tag="$4" beam="$5"; shift 5
  step "generate_$name" "${generate[@]}" "$@" --input "$text/$split.$src" \
    --output "$out/$tag.lin" --beam "$beam" --lenpen "$lenpen" --max-len-a 1 \
    --max-len-b 300 ${gen_opts[@]+"${gen_opts[@]}"}
  step "delinearize_$name" --stdout "$out/$tag.trees" --stderr "$out/repairs.$tag.txt" \
    python3 "$here/delinearize.py" "$text/$split.words" "$out/$tag.lin" --tags "$text/$split.tags"
  step "score_$name" --stdout "$out/bracket_f1.$tag.txt" "${score[@]}" \
    --ref "$text/$split.gold" --hyp "$out/$tag.trees" --metric bracket-f1
}

# 7. --seeds N: runs 2..N, then the ensemble of all N runs on the valid split (beam 4 and
#    the validation's length limits, as nmt-train validates) and on the test split (as step
#    4), each scored by EVALB: a second result beside the single model's.
if [ "$seeds" -gt 1 ]; then
  ensemble=("${models[@]}")
  for k in $(seq 2 "$seeds"); do
    train_run "$k"
    ensemble+=("${run_models[@]}")
  done
  for split in valid test; do
    if [ "$split" = valid ]; then beam=4; else beam=21; fi
    parse_split "seeds_$split" "$data" "$split" "$split.seeds$seeds" "$beam" "${ensemble[@]}"
  done
fi

# 8. --extra-test NAME=FIRST-LAST: those files prepared beside the same train split (so with
#    the same vocabulary and signatures; WORK/text-NAME), parsed as step 4 parses the test
#    split by the single model and, with --seeds, by the ensemble, each scored by EVALB.
for spec in ${extra_tests[@]+"${extra_tests[@]}"}; do
  name="${spec%%=*}"
  step "prepare_extra_$name" python3 "$here/prepare.py" "$treebank" "$work/text-$name" \
    "${splits[0]}" "${splits[1]}" --split "$spec" ${prep_opts[@]+"${prep_opts[@]}"}
  parse_split "extra_$name" "$work/text-$name" "$name" "$name" 21 "${models[@]}"
  if [ "$seeds" -gt 1 ]; then
    parse_split "extra_$name.seeds$seeds" "$work/text-$name" "$name" "$name.seeds$seeds" 21 \
      "${ensemble[@]}"
  fi
done

if [ "$dry_run" = 0 ]; then
  if [ "$sample" = 1 ]; then
    for run in "" .free; do
      if [ -z "$run" ]; then how="with tree constraints (default)"; else how="without tree constraints"; fi
      echo "$how, ${models[*]}:"
      cat "$out/bracket_f1$run.txt"
      grep -h '^repairs:' "$out/repairs$run.txt" 2>/dev/null || echo "repairs: none"
    done
  else
    cat "$out/bracket_f1.txt"
  fi
  if [ "$seeds" -gt 1 ]; then
    for split in valid test; do
      echo "the ensemble of $seeds runs (seeds 1-$seeds), $split split, with tree constraints, ${ensemble[*]}:"
      cat "$out/bracket_f1.$split.seeds$seeds.txt"
    done
  fi
  for spec in ${extra_tests[@]+"${extra_tests[@]}"}; do
    name="${spec%%=*}"
    echo "$name (files ${spec#*=}), with tree constraints, ${models[*]}:"
    cat "$out/bracket_f1.$name.txt"
    if [ "$seeds" -gt 1 ]; then
      echo "$name (files ${spec#*=}), the ensemble of $seeds runs, with tree constraints:"
      cat "$out/bracket_f1.$name.seeds$seeds.txt"
    fi
  done
fi
