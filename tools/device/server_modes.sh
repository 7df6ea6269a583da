# The server at concurrency 64 beside `bench engine` at batch 64 on the same 512 questions, in one call (about
# 6 min): Vanilla and DFlash (a fresh drafter: τ near 1, so its steps are the dearest a token) through
# `adaflash serve` with its engine in a process of its own, each answer's budget drawn from 64-128 tokens
# (--length-spread 0.5: the synthetic target's answers never stop on their own, and all of one length leave a
# batch in waves), then Vanilla with every answer 128 tokens, then Vanilla with the engine on a thread of the
# server's process (ADAFLASH_ENGINE_THREAD=1). Each server record keeps the engine's passes and loop.
source tools/device/env.sh
smollm2_drafter
Q="--max-new-tokens 128 --num-prompts 512"
E="bench engine --target /tmp/s135 --prompts $P/gsm1024.jsonl $Q --device cuda --json --batch-sizes 64"
M="--target /tmp/s135 --gpus 0 --datasets $P/gsm1024.jsonl $Q --concurrency 64 --warmup 64 --context-length 1280 --json"
t timeout 150 $A $E --methods vanilla,dflash --draft dflash=/tmp/ds --length-spread 0.5 > "$OUT/engine-spread.json" \
  2> "$OUT/engine.log"
t timeout 170 $A bench matrix $M --methods vanilla,dflash --draft dflash=/tmp/ds --length-spread 0.5 \
  > "$OUT/server-spread.json" 2> "$OUT/server-spread.log"
t timeout 40 $A $E --methods vanilla > "$OUT/engine-waves.json" 2>> "$OUT/engine.log"
t timeout 80 $A bench matrix $M --methods vanilla > "$OUT/server-waves.json" 2> "$OUT/server-waves.log"
ADAFLASH_ENGINE_THREAD=1 timeout 80 $A bench matrix $M --methods vanilla --length-spread 0.5 \
  > "$OUT/server-thread.json" 2> "$OUT/server-thread.log"
cp /tmp/ws/runlog.sqlite "$OUT/"
