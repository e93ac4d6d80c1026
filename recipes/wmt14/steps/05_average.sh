#!/usr/bin/env bash
# 5. Average the last 5 (base) or 20 (big) checkpoints.
here=$(cd "$(dirname "$0")" && pwd); source "$here/env.sh"; source "$here/../wmt14/common.sh"
avg=$WORK_DIR/average-$ARCH.pt
[ -f "$avg" ] && [ "$avg" -nt "$WORK_DIR/checkpoints-$ARCH/checkpoint_last.pt" ] && { echo "05_average: $avg is up to date; skipping" >&2; exit 0; }
average_last "$WORK_DIR/checkpoints-$ARCH" "$N_AVERAGE" "$avg"
