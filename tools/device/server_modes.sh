# The server at concurrency 64 beside `bench engine` at batch 64 on the same 512 questions, in one call (about
# 5 min): Vanilla and DFlash (a fresh drafter: τ near 1, so its steps are the dearest a token) through
# `adaflash serve` with its engine in a process of its own (the default), then Vanilla with the engine on a
# thread of the server's process (ADAFLASH_ENGINE_THREAD=1). Each server record keeps the engine's passes by
# kind (`passes`), to set beside the engine's.
source tools/device/env.sh
smollm2_drafter
Q="--max-new-tokens 128 --num-prompts 512"
M="--target /tmp/s135 --gpus 0 --datasets $P/gsm1024.jsonl $Q --concurrency 64 --warmup 64 --context-length 1280 --json"
t timeout 150 $A bench engine --target /tmp/s135 --prompts $P/gsm1024.jsonl $Q --device cuda --json \
  --methods vanilla,dflash --draft dflash=/tmp/ds --batch-sizes 64 > "$OUT/engine-b64.json" 2> "$OUT/engine.log"
t timeout 180 $A bench matrix $M --methods vanilla,dflash --draft dflash=/tmp/ds > "$OUT/server-process.json" \
  2> "$OUT/server-process.log"
ADAFLASH_ENGINE_THREAD=1 timeout 100 $A bench matrix $M --methods vanilla > "$OUT/server-thread.json" \
  2> "$OUT/server-thread.log"
cp /tmp/ws/runlog.sqlite "$OUT/"
