# Qwen3-8B's shapes, most wanted first: AdaFlash against DFlash at batch 32 and 64 with the cost rule's table of
# step times by width (scripted acceptance), Vanilla at batch 32 beside transformers' generate(), Vanilla at
# batch 1 (against the HBM roofline). The verify cost curve is `bench cost`'s (brief.sh).
source tools/device/env.sh
qwen3_8b
t timeout 300 $A bench engine --target /tmp/q36 --prompts $P/gsm256.jsonl --max-new-tokens 128 --device cuda --json \
  --methods vanilla,dflash,adaflash --draft dflash=/tmp/d8 --draft adaflash=/tmp/d8 --acceptance $ACC \
  --order interleaved --num-prompts 128 --batch-sizes 32,64 > "$OUT/q8-scripted.json" 2> "$OUT/q8-scripted.log"
t timeout 100 $A bench engine --target /tmp/q36 --methods vanilla --prompts $P/gsm256.jsonl --num-prompts 32 \
  --batch-sizes 32 --max-new-tokens 64 --device cuda --compare-hf --json > "$OUT/q8-b32-hf.json" 2> "$OUT/q8-b32-hf.log"
t timeout 40 $A bench engine --target /tmp/q36 --methods vanilla --prompts $P/gsm256.jsonl --num-prompts 4 \
  --batch-sizes 1 --max-new-tokens 128 --device cuda --warmup short --json > "$OUT/q8-b1.json"
cp /tmp/ws/runlog.sqlite "$OUT/"
