# DFlash against AdaFlash at batch 512 and 256 on SmolLM2's shapes, acceptance scripted at the general drafter's
# math shares (about 9 min; the largest batch first).
source tools/device/env.sh
smollm2_drafter
S="--target /tmp/s135 --prompts $P/gsm1024.jsonl --max-new-tokens 128 --device cuda --json --order interleaved
  --methods vanilla,dflash,adaflash --draft dflash=/tmp/ds --draft adaflash=/tmp/ds --acceptance $ACC"
t timeout 300 $A bench engine $S --num-prompts 1024 --batch-sizes 512 > "$OUT/scripted-b512.json" 2>> "$OUT/large.log"
t timeout 230 $A bench engine $S --num-prompts 512 --batch-sizes 256 > "$OUT/scripted-b256.json" 2>> "$OUT/large.log"
cp /tmp/ws/runlog.sqlite "$OUT/"
