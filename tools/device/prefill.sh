# Vanilla at batch 256 and 512 with decode and prefill profiles; the same on an earlier tree where .old/adaflash
# holds one (`git archive REV adaflash | tar -x -C .old`, drafters left out), in the same run; attention's tiles
# on prefill shapes; one `data regenerate` process at batch 256.
source tools/device/env.sh
smollm2
B="bench engine --target /tmp/s135 --prompts $PWD/$P/gsm1024.jsonl --max-new-tokens 128 --device cuda --json
  --methods vanilla --num-prompts 1024 --batch-sizes 256,512"
t timeout 150 $A $B --profile /tmp/prof --profile-steps 16 > "$OUT/vanilla-large.json"
for f in /tmp/prof/*.top.txt; do echo "=== $f"; head -45 "$f"; done > "$OUT/profiles.txt"
if [ -d .old/adaflash ]; then
  (cd .old && ADAFLASH_WORKSPACE=/tmp/ws-old PYTHONPATH=/tmp/site:$PWD t timeout 120 $A $B --label base) > "$OUT/vanilla-large-base.json"
fi
t timeout 60 python3 tools/device/attention_tiles.py > "$OUT/attention-tiles.txt" 2>&1
t timeout 100 $A data regenerate --target /tmp/s135 --dataset $P/gsm1024.jsonl --num-samples 512 --out /tmp/ans.jsonl \
  --batch-size 256 --max-new-tokens 256 --max-len 1280 --device cuda > "$OUT/regenerate.txt" 2>&1
cp /tmp/ws/runlog.sqlite "$OUT/"
