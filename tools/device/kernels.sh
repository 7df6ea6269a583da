# Attention's tile rows and grid order on prefill shapes; batch 256 end to end with row-count GEMM tiles and
# with the base tile.
source tools/device/env.sh
smollm2
t timeout 60 python3 tools/device/attention_tiles.py > "$OUT/attention-tiles.txt" 2>&1
B="$A bench engine --target /tmp/s135 --prompts $P/gsm1024.jsonl --max-new-tokens 128 --device cuda --json \
  --methods vanilla --num-prompts 1024 --batch-sizes 256"
t timeout 90 $B > "$OUT/b256-tiles.json"
ADAFLASH_MM_TILES=base t timeout 90 $B > "$OUT/b256-base.json"
