#!/usr/bin/env bash
# GPU check of the scale-out paths, for a machine with NVIDIA GPUs, vllm and trl installed
# (pip install -e '.[vllm]'). Not part of the CPU test suite. No hub access is needed: it builds a
# Qwen2-architecture model of Qwen2.5-0.5B's shape with random weights (the tokenizer of the
# offline tiny model), then trains HotelEnv for a few steps:
#   1. --use-vllm --vllm-mode colocate (every visible GPU; episodes continue on the colocated engine)
#   2. --use-vllm --vllm-mode server: grpo-magic starts `trl vllm-serve` on the last GPU and trains on
#      the others (needs 2 GPUs or more; skipped with one)
#   3. the GPU path in one Python process (scripts/gpu_smoke_inprocess.py): the dtype choose_precision
#      picks for this GPU and the one the policy, GRPOConfig and the colocated vLLM engine use;
#      vllm_max_model_length (the longest prompt plus rl_max_new_tokens, not the model's 32K); then a second
#      run in the same process after the first: memory_allocated back, no process group, no RANK/WORLD_SIZE
# and prints what it saw: the launch plan, steps, groups, rewards, errors, and which engine the
# env's generation helper used, with its latency per episode. With 2 GPUs or more, run 1 trains with
# --rl-env-workers 2 and each episode records its thread's torch.cuda.current_device(), which must be
# its rank's (LOCAL_RANK).
#
#   scripts/gpu_smoke.sh                 # STEPS=3 WORK=/tmp/grpo-gpu-smoke.XXXX by default
#   STEPS=5 WORK=/scratch/smoke scripts/gpu_smoke.sh
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
STEPS=${STEPS:-3}
WORK=${WORK:-$(mktemp -d /tmp/grpo-gpu-smoke.XXXX)}
MODEL="$WORK/qwen2-0.5b-random"
mkdir -p "$WORK"
echo "== gpu_smoke: work folder $WORK, $STEPS steps per mode"
nvidia-smi -L || { echo "gpu_smoke: no NVIDIA GPU here (nvidia-smi failed)"; exit 2; }
python - <<'PY'
import importlib.util, torch, trl, transformers
print(f"torch {torch.__version__} (cuda {torch.version.cuda}, {torch.cuda.device_count()} GPUs), "
      f"transformers {transformers.__version__}, trl {trl.__version__}, "
      f"vllm {'installed' if importlib.util.find_spec('vllm') else 'MISSING'}")
PY

echo "== building $MODEL"
python - "$MODEL" <<'PY'
import shutil, sys, time
import torch
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM
from grpo_magic.models import tiny_model_path

dest = sys.argv[1]
tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path()))
# Qwen2.5-0.5B's shape (494M parameters with its 151936-token vocabulary, tied embeddings).
config = Qwen2Config(
    vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
    num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0,
    rms_norm_eps=1e-6, tie_word_embeddings=True, initializer_range=0.02,
    bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    pad_token_id=tokenizer.pad_token_id,
)
start = time.time()
torch.manual_seed(0)
model = Qwen2ForCausalLM(config).to(torch.bfloat16)
model.save_pretrained(dest, safe_serialization=True)
tokenizer.save_pretrained(dest)
params = sum(p.numel() for p in model.parameters())
print(f"built {params / 1e6:.0f}M parameters, tokenizer of {len(tokenizer)} tokens, in {time.time() - start:.0f} s")
PY
[ -f "$MODEL/config.json" ] || { echo "gpu_smoke: building the model failed"; exit 1; }

# HotelEnv, recording which engine its generation helper used and how long episodes took.
# (Its scores are not a learning signal: half the episodes are forced to continue, see below.)
cat > "$WORK/smoke_env.py" <<'PY'
import os
import time

import torch

from envs.hotel_env import HotelEnv


class SmokeHotelEnv(HotelEnv):
    def score_episode(self, model, tokenizer, completion, case_idx, generator=None):
        # A random model never calls a tool; half the episodes start from the right search call so
        # that they continue, on the generation helper, past the first turn.
        if int(case_idx) % 2 == 0:
            completion = self.solution_turns(case_idx)[0]
        start = time.perf_counter()
        result = self.run_episode(model, tokenizer, completion, case_idx, generator=generator)
        with open(os.environ["SMOKE_LOG"], "a") as f:
            backend = getattr(generator, "backend", "none")
            # The CUDA device of the thread that ran the episode, next to its rank's own (LOCAL_RANK).
            current = torch.cuda.current_device() if torch.cuda.is_available() else -1
            f.write(f"{os.environ.get('RANK', '0')} {backend} {result.turns} {time.perf_counter() - start:.3f} "
                    f"{current} {os.environ.get('LOCAL_RANK', '0')}\n")
        return result.score
PY

summary() {  # $1: output folder, $2: episode log
  python - "$1" "$2" <<'PY'
import collections, statistics, sys
from grpo_magic import read_run_log
from grpo_magic.events import EpisodeError, GroupScored, RunFinished, StepLogged

out, log = sys.argv[1], sys.argv[2]
try:
    events = list(read_run_log(out))
except FileNotFoundError:
    print(f"  no run log in {out}")
    sys.exit(0)
steps = [e for e in events if isinstance(e, StepLogged)]
groups = [e for e in events if isinstance(e, GroupScored)]
per_step = collections.Counter(g.step for g in groups)
finished = next((e for e in events if isinstance(e, RunFinished)), None)
print(f"  run: {finished.status if finished else 'no RunFinished'} {finished.reason[:300] if finished else ''}")
print(f"  steps logged: {[s.step for s in steps]}; groups per step: {dict(per_step)}; "
      f"episode errors: {sum(isinstance(e, EpisodeError) for e in events)}")
for s in steps:
    m = s.metrics
    print(f"  step {s.step}: reward {m.get('reward')}, kl {m.get('kl')}, episodes {s.episodes}, "
          f"completion length {m.get('completions/mean_length')}, {s.elapsed_s:.1f} s")
if groups:
    g = groups[-1]
    print(f"  last group: scores {g.scores}, advantages {[round(a, 3) for a in g.advantages]}")
    print(f"  a completion: {g.completions[0][:200]!r}")
try:
    rows = [line.split() for line in open(log)]
except FileNotFoundError:
    rows = []
by_backend = collections.defaultdict(list)
for rank, backend, turns, seconds, *_ in rows:
    by_backend[(rank, backend)].append((int(turns), float(seconds)))
devices = sorted({(row[0], row[4]) for row in rows if len(row) >= 6})
print(f"  episode threads' CUDA device per rank (rank, current_device): {devices}")
wrong_device = [row for row in rows if len(row) >= 6 and row[4] != row[5]]
if wrong_device:
    print(f"  PROBLEM: {len(wrong_device)} episodes ran on another GPU than their rank's, e.g. {wrong_device[0]}")
    open(log + ".wrong-device", "w").write(str(len(wrong_device)))
for (rank, backend), items in sorted(by_backend.items()):
    multi = [s for t, s in items if t > 1]
    print(f"  rank {rank}: {len(items)} episodes with generator {backend}; {len(multi)} continued past turn 1"
          + (f", median {statistics.median(multi):.3f} s each" if multi else ""))
PY
}

COMMON=(--model "$MODEL" --rl-env-module smoke_env --rl-env-class SmokeHotelEnv
        --rl-env-config '{"max_turns": 3, "n_cases": 32, "max_new_tokens": 48}'
        --rl-num-generations 4 --batch-size 4 --rl-max-new-tokens 64 --max-steps "$STEPS" --lr 1e-6
        --rl-max-error-rate 1 --save-steps 1000)
GPUS=$(python -c "import torch; print(torch.cuda.device_count())")
status=0
WORKERS=()
[ "$GPUS" -ge 2 ] && WORKERS=(--rl-env-workers 2)  # episodes in threads on every rank: their CUDA device is checked

echo "== 1. colocate on $GPUS GPU(s)"
(cd "$WORK" && grpo-magic train "${COMMON[@]}" --use-vllm --vllm-mode colocate --dry-run)
rm -f "$WORK/colocate.episodes" "$WORK/colocate.episodes.wrong-device"
start=$(date +%s)
(cd "$WORK" && SMOKE_LOG="$WORK/colocate.episodes" timeout 1200 grpo-magic train "${COMMON[@]}" --use-vllm \
  --vllm-mode colocate --vllm-gpu-memory-utilization 0.3 ${WORKERS[@]+"${WORKERS[@]}"} \
  --project-name "$WORK/colocate" --quiet)
rc=$?
echo "  exit status $rc after $(( $(date +%s) - start )) s"
[ $rc -eq 0 ] || status=1
summary "$WORK/colocate" "$WORK/colocate.episodes"
[ -f "$WORK/colocate.episodes.wrong-device" ] && status=1

if [ "$GPUS" -ge 2 ]; then
  echo "== 2. server mode: trl vllm-serve on the last GPU, training on the other $((GPUS - 1))"
  (cd "$WORK" && grpo-magic train "${COMMON[@]}" --use-vllm --vllm-mode server --vllm-server-gpus 1 \
    --vllm-server-port 8011 --dry-run)
  rm -f "$WORK/server.episodes" "$WORK/server.episodes.wrong-device"
  start=$(date +%s)
  (cd "$WORK" && SMOKE_LOG="$WORK/server.episodes" timeout 1800 grpo-magic train "${COMMON[@]}" --use-vllm \
    --vllm-mode server --vllm-server-gpus 1 --vllm-server-port 8011 --vllm-server-timeout 600 \
    ${WORKERS[@]+"${WORKERS[@]}"} --project-name "$WORK/server" --quiet)
  rc=$?
  echo "  exit status $rc after $(( $(date +%s) - start )) s"
  [ $rc -eq 0 ] || status=1
  summary "$WORK/server" "$WORK/server.episodes"
  [ -f "$WORK/server.episodes.wrong-device" ] && status=1
  echo "  vLLM server log (last lines of $WORK/server/vllm-server.log):"
  tail -n 8 "$WORK/server/vllm-server.log" 2>/dev/null | sed 's/^/    /'
  if curl -sf -m 2 http://127.0.0.1:8011/health >/dev/null 2>&1; then
    echo "  PROBLEM: the vLLM server still answers after training ended"; status=1
  else
    echo "  the vLLM server was stopped after training"
  fi
else
  echo "== 2. server mode skipped: it needs 2 GPUs (one for vLLM, one to train); the plan for 8:"
  (cd "$WORK" && GRPO_MAGIC_FAKE_GPUS=8 grpo-magic train "${COMMON[@]}" --use-vllm --vllm-mode server \
    --vllm-server-gpus 2 --vllm-tensor-parallel-size 2 --dry-run)
fi

echo "== 3. the GPU path in one process on GPU 0: dtype, vllm_max_model_length, then a second run after the first"
FIRST_GPU=${CUDA_VISIBLE_DEVICES:-0}
(cd "$WORK" && SMOKE_LOG="$WORK/inprocess.episodes" CUDA_VISIBLE_DEVICES="${FIRST_GPU%%,*}" \
  timeout 1500 python "$REPO/scripts/gpu_smoke_inprocess.py" "$MODEL" "$STEPS") || status=1

echo "== gpu_smoke: $([ $status -eq 0 ] && echo OK || echo FAILED) (outputs in $WORK)"
exit $status
