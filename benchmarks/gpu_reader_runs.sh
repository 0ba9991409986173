#!/usr/bin/env bash
# Reader training on a rented GPU machine (issue 12): the k=0 teacher, then distilled k>0 students.
#
# The GPU machine gets only the work tree plus a carried folder, has no network and no venv: its
# python3 has torch, transformers and setuptools, which is all `train qa` and `evaluate-rc` need; the
# script installs the checkout there without dependencies (`pip install --no-deps -e .`) so that the
# `dilstore` namespace resolves. Prepare the carried folder here (git-ignored):
#   .carry/base-minilm-fp16/           all-MiniLM-L6-v2 with fp16 weights (package:base-model; the
#                                      one benchmarks/train_rankers_gpu.py prepare writes)
#   .carry/reader/train-v1.1.json.gz   gzip -c ../shared/data/squad/train-v1.1.json
#   .carry/reader/dev-v1.1.json.gz     gzip -c ../shared/data/squad/dev-v1.1.json
#   .carry/reader/teacher-k0/          (students stage) the teacher that the teacher stage exported
# CARRY and BASE name other folders for those (a smoke test with tiny files, say).
#
#   benchmarks/gpu_reader_runs.sh teacher            k=0 from the base model
#   benchmarks/gpu_reader_runs.sh students K [K ...]   each K from the teacher, distilled, in parallel
#   EXPORT=NAME benchmarks/gpu_reader_runs.sh ...     also export run NAME (k0, k4, ...) as fp16 pieces
#   DEVICE=cpu EXTRA="--train-limit 40 --max-steps 2" ...   a smoke test of the script itself
#
# Every run uses one recipe: 2 epochs of SQuAD v1.1 train, batch 32, lr 1e-4 with 10% warm-up and
# linear decay, bf16 autocast, a checkpoint every 1000 steps. Each run writes its summary (RUN.json,
# full-dev EM/F1), its log (RUN.log) and its learning curve (RUN-curve.jsonl: dev[:1000] seeded EM/F1
# at every checkpoint and at the end); on exit, even a timed-out one, they go to $OUT in one
# results-STAGE.tgz (the machine returns at most 8 files). An export writes NAME.tar (config,
# tokenizer, metadata, sha256 of the weights) and the fp16 weights in pieces under 16 MiB
# (NAME.safetensors.part-*).
set -euo pipefail
shopt -s nullglob
stage=$1
shift
carry=${CARRY:-.carry/reader}
base=${BASE:-.carry/base-minilm-fp16}
runs=${RUNS:-/tmp/reader-runs}
out=${OUT:-/tmp/reader-out}
device=${DEVICE:-cuda}
EXTRA=${EXTRA:-}
results=$runs/results
mkdir -p "$runs" "$out" "$results"
trap 'tar czf "$out/results-$stage.tgz" -C "$results" .' EXIT
trap 'exit 143' TERM
export PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error HF_HUB_DISABLE_PROGRESS_BARS=1
python3 -c "import dilstore.runners.cli" 2>/dev/null \
  || python3 -m pip install --quiet --no-deps --no-build-isolation --no-index -e . > "$runs/install.log"
gunzip -c "$carry/train-v1.1.json.gz" > "$runs/train-v1.1.json"
gunzip -c "$carry/dev-v1.1.json.gz" > "$runs/dev-v1.1.json"

train() {  # NAME K MODEL [extra train options]
  local name=$1 k=$2 model=$3
  shift 3
  python3 -m dilstore train qa --layers "$k" --model "$model" --train "$runs/train-v1.1.json" \
    --dev "$runs/dev-v1.1.json" --output "$runs/$name" --epochs 2 --batch-size 32 --learning-rate 1e-4 \
    --save-every 1000 --keep-checkpoints 50 --log-every 100 --device "$device" --no-progress --json $EXTRA "$@" \
    > "$results/$name.json" 2> "$results/$name.log"
  for checkpoint in "$runs/$name"/checkpoints/step-* "$runs/$name"; do
    printf '{"checkpoint": "%s", "eval": %s}\n' "$(basename "$checkpoint")" "$(python3 -m dilstore evaluate-rc \
      --model "$checkpoint" --data "$runs/dev-v1.1.json" --limit 1000 --seed 0 --device "$device" --json)"
  done > "$results/$name-curve.jsonl"
}

export_pieces() {  # NAME: the run's final model as fp16 pieces plus a tar of its small files
  local name=$1
  python3 -c "import sys; from pathlib import Path; from dilstore.reader.training.release import package_checkpoint; \
package_checkpoint(Path(sys.argv[1]), Path(sys.argv[2]), '')" "$runs/$name" "$runs/$name-fp16"
  (cd "$runs/$name-fp16" && split -b 15M -d model.safetensors "$out/$name.safetensors.part-" \
    && sha256sum model.safetensors > weights.sha256 \
    && tar cf "$out/$name.tar" --exclude model.safetensors --exclude MODEL_CARD.md .)
}

case $stage in
  teacher)
    train k0 0 "$base"
    ;;
  students)
    for k in "$@"; do
      train "k$k" "$k" "$carry/teacher-k0" --teacher "$carry/teacher-k0" &
    done
    wait
    ;;
  *)
    echo "usage: $0 teacher | students K [K ...]" >&2
    exit 2
    ;;
esac
if [ -n "${EXPORT:-}" ]; then
  export_pieces "$EXPORT"
fi
