#!/usr/bin/env bash
# The real SmolLM2 (the package's GGUF, 98 MB) and a drafter folder, xz-compressed and cut in two, into .xa/ and
# .xb/: each fits one device call beside the checkout once adaflash/drafters is moved out of the tree for the
# two calls. The first call stores its part in /tmp (`store_part`), the second joins them (`real.sh`); the
# machine must still be warm between them (it goes back 30 s after a call). Usage: pack_real.sh [DRAFTER_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
drafter="${1:-adaflash/drafters/smollm2-135m-general}"
gguf=$(python3 -c "from adaflash.models.registry import BUILTINS, package_gguf; print(package_gguf(BUILTINS['smollm2-135m']))")
stage=$(mktemp -d); mkdir "$stage/drafter"
cp "$gguf" "$stage/"; cp "$drafter"/config.json "$drafter"/model.safetensors "$stage/drafter/"
rm -rf .xa .xb; mkdir .xa .xb
tar -C "$stage" -cf - . | xz -6 -T2 | split -b 54500000 - .xa/real.tar.xz.
mv .xa/real.tar.xz.ab .xb/; rm -rf "$stage"
grep -qx '/.xa/' .git/info/exclude || printf '/.xa/\n/.xb/\n' >> .git/info/exclude
du -sh .xa .xb
