# Sourced by the recipes. check_settings FILE "K=V ...": the first run records the settings that its outputs
# (data, rows) are made with; a later run asking for other ones stops with an error instead of letting steps
# that skip existing outputs go on with the old ones (a data-bin of another VOCAB, SMOKE data for a full run).
check_settings() {
    local file=$1 want=$2 have
    if [ -f "$file" ]; then
        have=$(cat "$file")
        if [ "$have" != "$want" ]; then
            echo "error: $(dirname "$file") was made with $have; this run asks for $want: give another WORK_DIR, or remove the old one" >&2
            exit 1
        fi
    elif [ "${DRY_RUN:-0}" != 1 ]; then
        mkdir -p "$(dirname "$file")"
        echo "$want" > "$file"
    fi
}

# average_last DIR N OUTPUT [OPTION ...]: `nmt average-checkpoints` of DIR's newest N numbered checkpoints into
# OUTPUT. Where training saved fewer in its minutes (a slow or busy machine), of those it saved, or of its
# checkpoint_last.pt where it saved none, saying so (a dry run before training has no DIR: N as asked).
average_last() {
    local dir=$1 n=$2 out=$3 have
    shift 3
    have=$(ls "$dir" 2>/dev/null | grep -cE '^checkpoint_[0-9]+\.pt$') || true
    if [ -d "$dir" ] && [ "$have" = 0 ]; then
        echo "note: $dir has no numbered checkpoint, fewer than the $n to average: taking checkpoint_last.pt" >&2
        run nmt average-checkpoints --inputs "$dir/checkpoint_last.pt" --output "$out" "$@"
        return
    fi
    if [ -d "$dir" ] && [ "$have" -lt "$n" ]; then
        echo "note: $dir has $have numbered checkpoints, fewer than the $n to average: averaging those $have" >&2
        n=$have
    fi
    run nmt average-checkpoints --inputs "$dir" --num-update-checkpoints "$n" --output "$out" "$@"
}
