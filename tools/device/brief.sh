# One call's worth when calls are scarce (about 8 min; at most 8 files come back), most wanted first: SmolLM2's
# shapes through the server at concurrency 64 beside the engine at batch 64 (Vanilla), then DFlash against
# AdaFlash at batch 256 (scripted acceptance). Qwen3-8B's runs are at_8b.sh's.
source tools/device/env.sh
smollm2_drafter
Q="--max-new-tokens 128 --num-prompts 512"
t timeout 60 $A bench engine --target /tmp/s135 --prompts $P/gsm1024.jsonl $Q --device cuda --json --methods vanilla \
  --batch-sizes 64 > "$OUT/engine-b64.json" 2>> "$OUT/brief.log"
t timeout 90 $A bench matrix --target /tmp/s135 --methods vanilla --gpus 0 --datasets $P/gsm1024.jsonl $Q \
  --concurrency 64 --warmup 64 --context-length 1280 --json > "$OUT/server-c64.json" 2>> "$OUT/brief.log"
t timeout 280 $A bench engine --target /tmp/s135 --prompts $P/gsm1024.jsonl $Q --device cuda --json \
  --methods vanilla,dflash,adaflash --draft dflash=/tmp/ds --draft adaflash=/tmp/ds --acceptance $ACC \
  --order interleaved --batch-sizes 256 > "$OUT/scripted-b256.json" 2>> "$OUT/brief.log"
cp /tmp/ws/runlog.sqlite "$OUT/"
