# Qwen3-8B's shapes: GEMM tiles by row count, Vanilla at batch 1 (against the HBM roofline), the verify cost
# curve, and AdaFlash against DFlash at batch 32 with the cost rule's table of step times by width.
source tools/device/env.sh
qwen3_8b
t timeout 100 python3 tools/device/mm_tiles.py qwen3-8b 1,8,32,64,128,512 > "$OUT/mm-qwen3-8b.txt" 2>&1
t timeout 70 $A bench engine --target /tmp/q36 --methods vanilla --prompts $P/gsm256.jsonl --num-prompts 8 \
  --batch-sizes 1 --max-new-tokens 128 --device cuda --warmup short --json > "$OUT/q8-b1.json"
t timeout 70 $A bench cost --target /tmp/q36 --batch-sizes 1,8,32,64 --widths 1,2,4,8 --context 512 --device cuda \
  --acceptance $ACC > "$OUT/q8-cost.txt" 2>&1
t timeout 220 $A bench engine --target /tmp/q36 --prompts $P/gsm256.jsonl --max-new-tokens 128 --device cuda --json \
  --methods vanilla,dflash,adaflash --draft dflash=/tmp/d8 --draft adaflash=/tmp/d8 --acceptance $ACC \
  --order interleaved --num-prompts 96 --batch-sizes 32 > "$OUT/q8-scripted-b32.json" 2> "$OUT/q8-scripted-b32.log"
cp /tmp/ws/runlog.sqlite "$OUT/"
