# Vanilla through the server at concurrency 64 with stream intervals 1 and 4, beside the engine at batch 64
# (512 GSM8K questions, 128 new tokens).
source tools/device/env.sh
smollm2
Q="--max-new-tokens 128 --num-prompts 512"
t timeout 60 $A bench engine --target /tmp/s135 --prompts $P/gsm1024.jsonl $Q --device cuda --json --methods vanilla \
  --batch-sizes 64 > "$OUT/engine-b64.json"
for i in 1 4; do
  t timeout 80 $A bench matrix --target /tmp/s135 --methods vanilla --gpus 0 --datasets $P/gsm1024.jsonl $Q \
    --concurrency 64 --warmup 64 --context-length 1280 --serve-arg=--stream-interval --serve-arg=$i --json \
    > "$OUT/server-c64-i$i.json" 2> /dev/null
  grep -m1 output_throughput "$OUT/server-c64-i$i.json"
done
