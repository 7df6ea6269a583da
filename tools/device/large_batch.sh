# Vanilla at large batches (decode and prefill profiles), DFlash against AdaFlash at batch 128, a prefill pass by
# shape, GEMM tiles on SmolLM2's shapes. Names under $OUT use dashes: a name with a comma does not come back.
source tools/device/env.sh
smollm2_drafter
t timeout 60 python3 tools/device/prefill_pass.py /tmp/s135 "$OUT/prefill-pass.txt" 8x256,64x256,256x256 | grep prefill
t timeout 60 python3 tools/device/mm_tiles.py smollm2 64,256,1024,4096,16384,65536 > "$OUT/mm-smollm2.txt" 2>&1
B="$A bench engine --target /tmp/s135 --prompts $P/gsm1024.jsonl --max-new-tokens 128 --device cuda --json"
t timeout 200 $B --methods vanilla --num-prompts 1024 --batch-sizes 64,256,512 --profile /tmp/prof \
  --profile-steps 16 > "$OUT/vanilla-large.json"
for f in /tmp/prof/*.top.txt; do echo "=== $f"; head -40 "$f"; done > "$OUT/profiles.txt"
t timeout 200 $B --methods vanilla,dflash,adaflash --draft dflash=/tmp/ds --draft adaflash=/tmp/ds --acceptance $ACC \
  --num-prompts 512 --batch-sizes 128 --order interleaved > "$OUT/scripted-b128.json"
cp /tmp/ws/runlog.sqlite "$OUT/"
