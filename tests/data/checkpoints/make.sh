#!/usr/bin/env bash
# Remake the checkpoint of one old format: make.sh VERSION REVISION [PYTHON]
#   VERSION   1, 2 or 3 (the checkpoint format that REVISION writes)
#   REVISION  the last commit that wrote it (README.md: 215cd62, 5624c50, a05b047)
# That revision's own code (git archive) preprocesses a digit copy corpus, trains a tiny transformer and
# translates test.src; vVERSION.pt (checkpoint_last.pt, with its training state) and vVERSION.hyp (the
# hypotheses, one a line) are written next to this script. Run from anywhere inside the repository.
set -euo pipefail
version=$1 rev=$2 python=${3:-python}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git -C "$here/../../.." archive "$rev" | tar -x -C "$work" --one-top-level=code
export PYTHONPATH=$work/code
cd "$work"  # python -m puts the working directory first on sys.path: it must not hold another nmt_cli
nmt() { "$python" -m nmt_cli "$@"; }

# The copy corpus of tests/conftest.py's write_copy_corpus (2000 train, 50 valid lines; seeds 1 and 2), and a
# sentencepiece model of it without a normalization rule: the default (nmt_nfkc) carries a character map of
# some 240 KB that every checkpoint embeds, and digits need none. Its input is named relative to $work, so the
# model's bytes (which record it) are the same in every run: the three fixtures share one vocabulary.
"$python" - <<'PY'
import random
from pathlib import Path

import sentencepiece as spm

from nmt_cli.data.vocab import BOS, EOS, PAD, UNK

root = Path("corpus")
root.mkdir()
for split, n, seed in (("train", 2000, 1), ("valid", 50, 2)):
    rng = random.Random(seed)
    lines = [" ".join(str(rng.randrange(10)) for _ in range(rng.randint(2, 9))) for _ in range(n)]
    for lang in ("src", "tgt"):
        (root / f"{split}.{lang}").write_text("\n".join(lines) + "\n")
spm.SentencePieceTrainer.train(
    input=str(root / "train.src"), model_prefix=str(root / "spm"), vocab_size=24, model_type="bpe",
    character_coverage=1.0, normalization_rule_name="identity", pad_id=PAD, unk_id=UNK, bos_id=BOS, eos_id=EOS,
    minloglevel=2,
)
PY

nmt preprocess -s src -t tgt --trainpref "$work/corpus/train" --validpref "$work/corpus/valid" \
    --destdir "$work/data-bin" --spm-model "$work/corpus/spm.model"
# v1 trains with --bf16: its train config's bf16 flag is what upgrade_v1_to_v2 turns into precision "bf16"
precision=()
if [ "$version" = 1 ]; then precision=(--bf16); fi
nmt train "$work/data-bin" --save-dir "$work/ckpt" --arch transformer_tiny --d-model 16 --d-ff 32 --heads 2 \
    --dropout 0 --max-positions 64 --max-tokens 1024 --warmup-updates 100 --label-smoothing 0 \
    --max-update 300 --seed "$version" --log-interval 100 --device cpu --threads 1 "${precision[@]}"
cp "$work/ckpt/checkpoint_last.pt" "$here/v$version.pt"
nmt generate --path "$here/v$version.pt" --input "$here/test.src" --beam 4 --device cpu --threads 1 \
    > "$here/v$version.hyp"
