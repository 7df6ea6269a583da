# Training at Qwen3-8B's shapes: the target answers 256 GSM8K training questions, then `train draft` steps at
# two batch sizes (tokens a second and peak memory each), then the AdaFlash pipeline with inference and
# training on the one GPU for 2 minutes, publishing versions. TARGET=/path and DEVICE=cpu run it at toy
# size (`models synth qwen3-tiny`) to check the commands.
source tools/device/env.sh
DEVICE=${DEVICE:-cuda}
if [ -n "${TARGET:-}" ]; then T=$TARGET; D=/tmp/d8t; [ -d $D ] || t $A draft new --method dflash --target $T \
  --block-size 8 --layers 1 --length-head --out $D >/dev/null; else qwen3_8b; T=/tmp/q36; D=/tmp/d8; fi
t timeout 100 $A data regenerate --target $T --dataset $P/gsm_train4096.jsonl --num-samples ${N:-256} \
  --out /tmp/q8-answers.jsonl --batch-size 64 --max-new-tokens 128 --device $DEVICE > "$OUT/train8b-regenerate.txt" 2>&1
for tokens in ${BATCH_TOKENS:-4096 32768}; do
  t timeout 110 $A train draft --method dflash --target $T --init $D --data /tmp/q8-answers.jsonl --steps ${STEPS:-10} \
    --batch-tokens $tokens --eval-prompts 0 --out /tmp/t8-$tokens --device $DEVICE > "$OUT/train8b-$tokens.txt" 2>&1
  grep -h -i -E "tok|memory|step" "$OUT/train8b-$tokens.txt" | tail -3
done
t timeout 210 $A pipeline --preset adaflash --target $T --draft $D --data $P/gsm_train4096.jsonl --skip 256 \
  --max-minutes ${MINUTES:-2} --batch-size 32 --train-batch 8 --min-buffer 8 --max-new-tokens 128 \
  --infer-gpus ${GPUS:-0} --train-gpus ${GPUS:-0} --swap-dir /tmp/swap8 > "$OUT/train8b-pipeline.txt" 2>&1
t $A pipeline status --swap-dir /tmp/swap8 > "$OUT/train8b-pipeline-status.txt" 2>&1
cp /tmp/ws/runlog.sqlite "$OUT/" 2>/dev/null
