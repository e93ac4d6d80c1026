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
