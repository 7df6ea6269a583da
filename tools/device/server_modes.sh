# Vanilla through `adaflash serve` at concurrency 64 with the engine in its own process (the default) and on a
# thread of the server's process (ADAFLASH_ENGINE_THREAD=1), beside `bench engine` at batch 64, on the same 512
# questions in one call (about 3 min).
source tools/device/env.sh
smollm2
Q="--max-new-tokens 128 --num-prompts 512"
M="--target /tmp/s135 --methods vanilla --gpus 0 --datasets $P/gsm1024.jsonl $Q --concurrency 64 --warmup 64 --context-length 1280 --json"
t timeout 60 $A bench engine --target /tmp/s135 --prompts $P/gsm1024.jsonl $Q --device cuda --json --methods vanilla \
  --batch-sizes 64 > "$OUT/engine-b64.json" 2> "$OUT/engine.log"
t timeout 100 $A bench matrix $M > "$OUT/server-process.json" 2> "$OUT/server-process.log"
ADAFLASH_ENGINE_THREAD=1 timeout 100 $A bench matrix $M > "$OUT/server-thread.json" 2> "$OUT/server-thread.log"
cp /tmp/ws/runlog.sqlite "$OUT/"
