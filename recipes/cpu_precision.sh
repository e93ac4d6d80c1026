# Sourced by the CPU recipes (multi30k_en_de, table3, ptb_parsing): when PRECISION is unset, --bf16 where
# the CPU has bfloat16 instructions (AVX512-BF16 or AMX; 1.6x float32's training speed measured on an AMD
# EPYC with AVX512-BF16), else nothing, i.e. nmt's own default (float32 on CPU, where bf16 is emulated: about
# 30x slower than float32 on an AMD Zen 3; bf16 on a CUDA device that supports it). PRECISION set, even
# empty, is kept.
# CPUINFO names the file that lists the CPU's flags (Linux's /proc/cpuinfo; absent elsewhere: float32); an
# ONEDNN_MAX_CPU_ISA below AVX512_CORE_BF16 emulates a CPU without them (`make test-cpus`, nmt_cli/runtime.py).
if [ -z "${PRECISION+set}" ]; then
    isa=${ONEDNN_MAX_CPU_ISA:-}
    case "${isa^^}" in SSE41 | AVX | AVX2* | AVX512_CORE | AVX512_CORE_VNNI) CPUINFO=/dev/null ;; esac
    if grep -qwE 'avx512_bf16|amx_bf16' "${CPUINFO:-/proc/cpuinfo}" 2>/dev/null; then
        PRECISION=--bf16
    else
        PRECISION=
    fi
fi
