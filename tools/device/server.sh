# The server at concurrency 64 beside the engine at batch 64 (Vanilla and DFlash, the drafter's own acceptance,
# the same 512 questions), then DFlash against AdaFlash at batch 64 and 256 with scripted acceptance.
source tools/device/env.sh
smollm2_drafter
Q="--max-new-tokens 128 --num-prompts 512"
t timeout 160 $A bench engine --target /tmp/s135 --prompts $P/gsm1024.jsonl $Q --device cuda --json \
  --methods vanilla,dflash --draft dflash=/tmp/ds --batch-sizes 64 > "$OUT/engine-b64.json"
t timeout 170 $A bench matrix --target /tmp/s135 --methods vanilla,dflash --draft dflash=/tmp/ds --gpus 0 \
  --datasets $P/gsm1024.jsonl $Q --concurrency 64 --warmup 64 --context-length 1280 --json > "$OUT/server-c64.json" \
  2> "$OUT/server-c64.log"
t timeout 220 $A bench engine --target /tmp/s135 --prompts $P/gsm1024.jsonl $Q --device cuda --json \
  --methods vanilla,dflash,adaflash --draft dflash=/tmp/ds --draft adaflash=/tmp/ds --acceptance $ACC \
  --order interleaved --batch-sizes 64,256 > "$OUT/scripted.json" 2> "$OUT/scripted.log"
cp /tmp/ws/runlog.sqlite "$OUT/"; for f in $(find /tmp/ws -name "*.log"); do echo "== $f"; tail -40 "$f"; done > "$OUT/serve-logs.txt"  # 8 files come back at most
