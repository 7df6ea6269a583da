#!/usr/bin/env bash
# Wheels the GPU image lacks (it has torch, transformers, accelerate, aiohttp, uvloop, prometheus-client, click) and
# prompt files from the GSM8K test split, into git-ignored folders that a device call carries.
set -euo pipefail
cd "$(dirname "$0")/../.."
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
           --platform manylinux1_x86_64 --platform any)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
  -d .whl gguf "sqlite-utils>=4,<5" sqlite-fts4 click-default-group tomli-w
mkdir -p .dev/prompts
GSM8K="${ADAFLASH_GSM8K_DIR:-../shared/data/gsm8k}/test.jsonl" python3 - <<'PY'
import json, os
rows = [json.loads(line) for line in open(os.environ["GSM8K"])]
for name, part in (("gsm1024", rows[:1024]), ("gsm256", rows[1024:1280])):
    with open(f".dev/prompts/{name}.jsonl", "w") as out:
        out.writelines(json.dumps({"prompt": row["question"]}) + "\n" for row in part)
train = [json.loads(line) for line in open(os.environ["GSM8K"].replace("test.jsonl", "train.jsonl"))][:4096]
with open(".dev/prompts/gsm_train4096.jsonl", "w") as out:
    out.writelines(json.dumps({"prompt": row["question"]}) + "\n" for row in train)
PY
suite="${ADAFLASH_WORKSPACE:-adaflash-workspace}/data/suite_test.jsonl"
[ -f "$suite" ] && cp "$suite" .dev/prompts/ || echo "no $suite: run 'adaflash data prepare suite' for real.sh"
du -sh .whl .dev/prompts
