#!/usr/bin/env bash
# 4. Train with the paper's settings (§5): Adam (0.9, 0.98, 1e-9), noam schedule with 4,000 warmup
#    updates, label smoothing 0.1, ~25k source + ~25k target tokens per update (see common.sh),
#    100k updates (base) or 300k (big), a checkpoint every 10 minutes. Reruns resume.
here=$(cd "$(dirname "$0")" && pwd); source "$here/env.sh"; source "$here/../wmt14/common.sh"
launcher=(nmt)
[ "$GPUS" -gt 1 ] && launcher=(torchrun --standalone --nproc_per_node "$GPUS" "$(command -v nmt || echo nmt)")
run "${launcher[@]}" train "$WORK_DIR/data-bin" --save-dir "$WORK_DIR/checkpoints-$ARCH" "${ARCH_FLAGS[@]}" \
    --max-tokens "$MAX_TOKENS" --update-freq "$UPDATE_FREQ" --max-update "$MAX_UPDATE" \
    --lr-scheduler noam --warmup-updates "$WARMUP" --adam-betas 0.9,0.98 --adam-eps 1e-9 --label-smoothing 0.1 \
    "${SAVE_FLAGS[@]}" --log-interval 100 --log-file "$WORK_DIR/train-$ARCH.jsonl" "${DEVICE_FLAGS[@]}"
