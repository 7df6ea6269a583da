# The seed's benchmark on the real SmolLM2 and drafter (unpacked by real.sh on this machine, or joined here from
# .xb/ and the first part an earlier call stored): 1,024 GSM8K test questions, 256 new tokens, Vanilla, DFlash and
# AdaFlash through `adaflash serve` at concurrency 64 and 256, beside `bench engine` at batch 64 and 256. Each
# server record keeps the engine's passes by kind.
source tools/device/env.sh
real_smollm2 || exit 3
D="--draft dflash=/tmp/real/drafter --draft adaflash=/tmp/real/drafter"
Q="--max-new-tokens 256 --num-prompts 1024"
t timeout 200 $A bench engine --target smollm2-135m --methods vanilla,dflash,adaflash $D --prompts $P/gsm1024.jsonl \
  $Q --device cuda --order interleaved --batch-sizes 64,256 --json > "$OUT/engine.json" 2> "$OUT/engine.log"
t timeout 330 $A bench matrix --target smollm2-135m --methods vanilla,dflash,adaflash $D --gpus 0 \
  --datasets $P/gsm1024.jsonl $Q --concurrency 64,256 --warmup 64 --context-length 1280 --json \
  > "$OUT/server.json" 2> "$OUT/server.log"
cp /tmp/ws/runlog.sqlite "$OUT/"; for f in $(find /tmp/ws -name "*.log"); do echo "== $f"; tail -40 "$f"; done > "$OUT/serve-logs.txt"  # 8 files come back at most
