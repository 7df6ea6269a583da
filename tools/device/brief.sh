# One call's worth when calls are scarce (about 10 min, so the last step may be cut; at most 8 files come back), most wanted first: SmolLM2's shapes through the server
# at concurrency 64 beside the engine at batch 64 (Vanilla); Qwen3-8B's verify cost curve (k up to 16); DFlash
# against AdaFlash at batch 256 (scripted acceptance); Vanilla at batch 32 on Qwen3-8B beside transformers' generate().
source tools/device/env.sh
smollm2_drafter
Q="--max-new-tokens 128 --num-prompts 512"
t timeout 60 $A bench engine --target /tmp/s135 --prompts $P/gsm1024.jsonl $Q --device cuda --json --methods vanilla \
  --batch-sizes 64 > "$OUT/engine-b64.json" 2>> "$OUT/brief.log"
t timeout 90 $A bench matrix --target /tmp/s135 --methods vanilla --gpus 0 --datasets $P/gsm1024.jsonl $Q \
  --concurrency 64 --warmup 64 --context-length 1280 --json > "$OUT/server-c64.json" 2>> "$OUT/brief.log"
qwen3_8b
t timeout 100 $A bench cost --target /tmp/q36 --batch-sizes 1,8,32,64 --widths 1,2,4,8,16 --context 512 \
  --device cuda --acceptance $ACC > "$OUT/q8-cost.txt" 2>> "$OUT/brief.log"
t timeout 240 $A bench engine --target /tmp/s135 --prompts $P/gsm1024.jsonl $Q --device cuda --json \
  --methods vanilla,dflash,adaflash --draft dflash=/tmp/ds --draft adaflash=/tmp/ds --acceptance $ACC \
  --order interleaved --batch-sizes 256 > "$OUT/scripted-b256.json" 2>> "$OUT/brief.log"
t timeout 90 $A bench engine --target /tmp/q36 --methods vanilla --prompts $P/gsm256.jsonl --num-prompts 32 \
  --batch-sizes 32 --max-new-tokens 64 --device cuda --compare-hf --json > "$OUT/q8-b32-hf.json" 2>> "$OUT/brief.log"
cp /tmp/ws/runlog.sqlite "$OUT/"
