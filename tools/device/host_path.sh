# This tree against an earlier one in .old/adaflash (`git archive REV adaflash | tar -x -C .old`, drafters left
# out), taking turns to even out drift: Vanilla at batch 256 and 512 (1,024 questions, 128 new tokens), one
# `data regenerate` process at batch 256, DFlash at batch 256 (scripted acceptance) (about 8 min).
source tools/device/env.sh
smollm2_drafter
V="bench engine --target /tmp/s135 --prompts $PWD/$P/gsm1024.jsonl --max-new-tokens 128 --device cuda --json
  --methods vanilla --num-prompts 1024 --batch-sizes 256,512"
S="bench engine --target /tmp/s135 --prompts $PWD/$P/gsm1024.jsonl --max-new-tokens 128 --device cuda --json
  --methods dflash --draft dflash=/tmp/ds --acceptance $ACC --num-prompts 512 --batch-sizes 256"
R="data regenerate --target /tmp/s135 --dataset $PWD/$P/gsm1024.jsonl --num-samples 512 --batch-size 256
  --max-new-tokens 256 --max-len 1280 --device cuda"
old() { (cd .old && ADAFLASH_WORKSPACE=/tmp/ws-old PYTHONPATH=/tmp/site:$PWD "$@"); }
for turn in 1 2; do
  t timeout 60 $A $V --label "new-$turn" > "$OUT/vanilla-new-$turn.json" 2>> "$OUT/host-path.log"
  old t timeout 60 $A $V --label "old-$turn" > "$OUT/vanilla-old-$turn.json" 2>> "$OUT/host-path.log"
done
t timeout 100 $A $R --out /tmp/ans-new.jsonl >> "$OUT/host-path.log" 2>&1
old t timeout 100 $A $R --out /tmp/ans-old.jsonl >> "$OUT/host-path.log" 2>&1
t timeout 130 $A $S --label new > "$OUT/scripted-new.json" 2>> "$OUT/host-path.log"
old t timeout 130 $A $S --label old > "$OUT/scripted-old.json" 2>> "$OUT/host-path.log"
cp /tmp/ws/runlog.sqlite "$OUT/"
