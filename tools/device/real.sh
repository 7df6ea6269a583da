# The real SmolLM2 and a drafter, joined from the parts pack_real.sh made (the first stored in /tmp by an
# earlier call on this machine): one `data regenerate` process at batch 256 on GSM8K training questions, then
# Vanilla, DFlash and AdaFlash over the suite's held-out prompts at batch 64 and 256, and at batch 1.
# Without the first part it runs server.sh instead.
source tools/device/env.sh
real_smollm2 || exec bash tools/device/server.sh
cp $P/suite_test.jsonl /tmp/ws/data/
t timeout 150 $A data regenerate --target smollm2-135m --dataset $P/gsm_train4096.jsonl --out /tmp/ans.jsonl.gz \
  --batch-size 256 --max-new-tokens 256 --max-len 1280 --compact --device cuda > "$OUT/regenerate-real.txt" 2>&1
D="--draft dflash=/tmp/real/drafter --draft adaflash=/tmp/real/drafter"
B="$A bench engine --target smollm2-135m --methods vanilla,dflash,adaflash $D --prompts suite --max-new-tokens 256
  --device cuda --order interleaved --json"
t timeout 230 $B --num-prompts 52 --batch-sizes 64,256 > "$OUT/suite-large.json" 2> "$OUT/suite-large.log"
t timeout 120 $B --num-prompts 4 --batch-sizes 1 --warmup short > "$OUT/suite-b1.json" 2> "$OUT/suite-b1.log"
cp /tmp/ws/runlog.sqlite "$OUT/"
