#!/usr/bin/env bash
# The device check: proves the CUDA kernels and the NCCL node group on a
# machine with a GPU, nvcc, NCCL and PyTorch (no Bazel, no gRPC, no Abseil,
# no network), in one session of at most DEVICE_CHECK_BUDGET seconds
# (default 570). From the repository root:
#
#   bash tests/gpu/device_check.sh 2>&1 | tee device_check.log
#
# Steps, each under its own timeout (and the budget); a summary table is
# printed last:
#   tools        nvcc, NCCL (toolkit, /usr or PyTorch's nvidia-nccl wheel),
#                Python with torch
#   build        nvcc: the kernels' .cu sources, the checks, the NCCL
#                transport and round protocol, the benchmark's C ABI
#   machinery    this script's own step runner: a step past its timeout
#                shows TIMEOUT, exit 2 SKIP, a failure FAIL
#   self-test    CPU only: the float64 checker passes right kernel results
#                and reports each kind of wrong one; bench.py's sizing,
#                float64 checks and table
#   kernels      every kernel, dtype, layout, option and odd shape against
#                float64 (also unaligned), a batch item of 2^31 + 16
#                elements, determinism, Forward not waiting for its stream,
#                and that counting devices (the Python probe) makes no
#                CUDA context
#   nccl         ranks as threads, one per GPU: every collective's content
#                element by element; a missing rank is a timeout, two ranks
#                on one GPU in one process are invalid; with 2+ GPUs, the
#                caller's device is restored
#   nccl-2proc   two processes on GPU 0 (NCCL_HOSTID apart, sockets over
#                loopback): content element by element, the node round's
#                gather, outcome and verdicts (mismatch, a peer's error,
#                the leader's upstream budget), identical merges; then rank
#                1 dies: rank 0's next call fails in time (a timeout or
#                NCCL's remote error), later calls are aborted, teardown
#                returns
#   benchmark    tests/gpu/bench.py: CUDA-event timings on tensors >= 4x L2
#                against torch's batch_norm and a device-to-device copy
# Without a GPU (this is how CI's machine is) the GPU steps stop at once
# with "no CUDA device" and the exit status is 2.
#
# Environment: NVCC (default nvcc on PATH, else /usr/local/cuda/bin/nvcc),
# PYTHON (default: the first of python3, /usr/bin/python3 that has torch),
# BUILD_DIR (default a fresh temporary folder), DEVICE_CHECK_BUDGET, SEED.
# Exit status: 0 every step passed; 2 no GPU (and everything else passed);
# 1 otherwise.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
BUDGET="${DEVICE_CHECK_BUDGET:-570}"
START=$SECONDS
NAMES=() STATUS=() TIMES=() NOTES=()

log() { echo "[device_check $((SECONDS - START))s] $*"; }

# step NAME TIMEOUT COMMAND...: runs COMMAND under min(TIMEOUT, budget
# left) seconds and records PASS (0), SKIP (2: no GPU; 3: no NCCL),
# TIMEOUT or FAIL with the last line it printed.
step() {
  local name="$1" limit="$2"
  shift 2
  local left=$((BUDGET - (SECONDS - START)))
  ((left < limit)) && limit=$left
  local t0=$SECONDS rc out
  if ((left < 5)); then
    NAMES+=("$name") STATUS+=(SKIP) TIMES+=(0) NOTES+=("the budget of ${BUDGET} s is spent")
    return 0
  fi
  log "step $name (timeout ${limit} s)"
  out="$(mktemp)"
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  local note
  note="$(grep -v '^\s*$' "$out" | tail -1 | cut -c1-90)"
  rm -f "$out"
  local status=FAIL
  case $rc in
    0) status=PASS ;;
    2 | 3) status=SKIP ;;
    124 | 137) status=TIMEOUT note="no result within ${limit} s" ;;
  esac
  NAMES+=("$name") STATUS+=("$status") TIMES+=($((SECONDS - t0))) NOTES+=("$note")
  return 0
}

summary() {
  echo
  echo "device check summary ($((SECONDS - START)) s of a ${BUDGET} s budget)"
  printf '%-12s %-8s %6s  %s\n' step status time note
  printf '%-12s %-8s %6s  %s\n' ------------ -------- ------ ----
  local i
  for i in "${!NAMES[@]}"; do
    printf '%-12s %-8s %5ss  %s\n' "${NAMES[$i]}" "${STATUS[$i]}" \
      "${TIMES[$i]}" "${NOTES[$i]}"
  done
}

status_of() {
  local i
  for i in "${!NAMES[@]}"; do
    [[ "${NAMES[$i]}" == "$1" ]] && echo "${STATUS[$i]}" && return
  done
  echo MISSING
}

# The step runner on commands whose outcome is known (run as its own
# invocation, so that its table stays out of this one's).
if [[ "${1:-}" == --machinery ]]; then
  step pass 10 true
  step fail 10 false
  step skip 10 bash -c 'echo no CUDA device; exit 2'
  step slow 1 sleep 30
  summary
  got="$(status_of pass)/$(status_of fail)/$(status_of skip)/$(status_of slow)"
  if [[ "$got" == PASS/FAIL/SKIP/TIMEOUT ]]; then
    echo "PASS the step runner reports PASS, FAIL, SKIP and TIMEOUT"
    exit 0
  fi
  echo "FAIL the step runner reported $got for PASS/FAIL/SKIP/TIMEOUT"
  exit 1
fi

export NVCC="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
export CUDA_HOME="$(cd "$(dirname "$NVCC")/.." 2>/dev/null && pwd || echo /usr/local/cuda)"
export OUT="${OUT:-${BUILD_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/syncnorm_device_check.XXXXXX")}}"
mkdir -p "$OUT"
if [[ -z "${PYTHON:-}" ]]; then
  for p in python3 /usr/bin/python3; do
    if "$p" -c 'import torch' >/dev/null 2>&1; then PYTHON="$p" && break; fi
  done
fi
export PYTHON="${PYTHON:-}"
# NCCL: the toolkit, the system, or the nvidia-nccl wheel PyTorch uses.
if [[ -z "${NCCL_INC:-}" ]]; then
  NCCL_INC="" NCCL_LIB=""
  for inc in "$CUDA_HOME/include" /usr/include; do
    [[ -f "$inc/nccl.h" ]] && NCCL_INC="$inc" && break
  done
  for lib in "$CUDA_HOME/lib64" "$CUDA_HOME/lib" /usr/lib/x86_64-linux-gnu; do
    ls "$lib"/libnccl.so* >/dev/null 2>&1 && NCCL_LIB="$lib" && break
  done
  if [[ (-z "$NCCL_INC" || -z "$NCCL_LIB") && -n "$PYTHON" ]]; then
    wheel="$("$PYTHON" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)"
    if [[ -n "$wheel" && -f "$wheel/include/nccl.h" ]]; then
      NCCL_INC="$wheel/include" NCCL_LIB="$wheel/lib"
    fi
  fi
fi
export NCCL_INC NCCL_LIB

tools() {
  [[ -x "$NVCC" ]] || { echo "no nvcc at $NVCC"; return 1; }
  echo "nvcc: $NVCC ($("$NVCC" --version | tail -1))"
  echo "NCCL: ${NCCL_INC:-not found} ${NCCL_LIB:-}"
  [[ -n "$PYTHON" ]] || { echo "no Python with torch (set PYTHON)"; return 1; }
  "$PYTHON" -c 'import torch; print("Python with torch:", torch.__version__, "CUDA", torch.version.cuda)'
}

build() {
  # sm_90 SASS + compute_90 PTX (the Bazel build's targets), plus SASS for
  # the GPU here when it is another architecture.
  local arch=(--generate-code "arch=compute_90,code=[sm_90,compute_90]")
  local cap
  cap="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')"
  if [[ -n "$cap" && "$cap" != 90 ]]; then
    arch+=(--generate-code "arch=compute_${cap},code=sm_${cap}")
  fi
  local flags=(-O3 -std=c++17 -Xcompiler -fPIC "${arch[@]}" -I"$ROOT")
  local nccl_flags=() nccl_link=() nccl_objs=()
  if [[ -n "$NCCL_INC" && -n "$NCCL_LIB" ]]; then
    local so
    so="$(cd "$NCCL_LIB" && ls libnccl.so* | head -1)"
    nccl_flags=(-DSYNCNORM_WITH_NCCL -I"$NCCL_INC")
    nccl_link=(-L"$NCCL_LIB" -l:"$so" -Xlinker -rpath -Xlinker "$NCCL_LIB")
    nccl_objs=("$OUT/nccl_comm.o" "$OUT/nccl_round.o" "$OUT/nccl_checks.o")
  fi
  echo "building into $OUT"
  local pids=() src obj
  for src in kernels/batch_norm_cuda_reduce.cu kernels/batch_norm_cuda_elementwise.cu \
             kernels/kernel_check.cc tests/gpu/self_test.cc tests/gpu/kernel_checks.cc \
             tests/gpu/huge_item.cu tests/gpu/bench_capi.cc; do
    obj="$OUT/$(basename "${src%.*}").o"
    "$NVCC" "${flags[@]}" -c "$src" -o "$obj" & pids+=($!)
  done
  "$NVCC" "${flags[@]}" "${nccl_flags[@]}" -c tests/gpu/device_check_main.cc \
    -o "$OUT/device_check_main.o" & pids+=($!)
  if [[ ${#nccl_flags[@]} -gt 0 ]]; then
    for src in client/nccl_comm.cc client/nccl_round.cc tests/gpu/nccl_checks.cc; do
      "$NVCC" "${flags[@]}" "${nccl_flags[@]}" -c "$src" \
        -o "$OUT/$(basename "${src%.*}").o" & pids+=($!)
    done
  fi
  local p failed=0
  for p in "${pids[@]}"; do wait "$p" || failed=1; done
  ((failed == 0)) || { echo "a compile failed"; return 1; }
  "$NVCC" "${arch[@]}" -o "$OUT/device_check" "$OUT/device_check_main.o" \
    "$OUT/self_test.o" "$OUT/kernel_checks.o" "$OUT/huge_item.o" \
    "$OUT/kernel_check.o" "$OUT/batch_norm_cuda_reduce.o" \
    "$OUT/batch_norm_cuda_elementwise.o" "${nccl_objs[@]}" "${nccl_link[@]}" \
    -ldl -lpthread || return 1
  "$NVCC" "${arch[@]}" -shared -o "$OUT/libsyncnorm_bench.so" \
    "$OUT/bench_capi.o" "$OUT/batch_norm_cuda_reduce.o" \
    "$OUT/batch_norm_cuda_elementwise.o" || return 1
  echo "built $OUT/device_check and $OUT/libsyncnorm_bench.so"
}

self_test() {
  "$OUT/device_check" self-test || return 1
  "$PYTHON" tests/gpu/bench.py --self-test
}

# Two ranks, one process each, both on GPU 0; rank 1 dies after its live
# checks. Both must pass and merge to the same bits.
nccl_2proc() {
  local dir
  dir="$(mktemp -d "${TMPDIR:-/tmp}/syncnorm_nccl.XXXXXX")"
  local env=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1
             NCCL_NET=Socket NCCL_SOCKET_IFNAME=lo CUDA_VISIBLE_DEVICES=0)
  env "${env[@]}" NCCL_HOSTID="syncnorm-check-0" \
    "$OUT/device_check" nccl-rank --rank=0 --id-file="$dir/id" > "$dir/rank0.log" 2>&1 &
  local p0=$!
  env "${env[@]}" NCCL_HOSTID="syncnorm-check-1" \
    "$OUT/device_check" nccl-rank --rank=1 --id-file="$dir/id" --die > "$dir/rank1.log" 2>&1 &
  local p1=$!
  local rc0=0 rc1=0
  wait "$p1" || rc1=$?
  wait "$p0" || rc0=$?
  sed 's/^/rank 0: /' "$dir/rank0.log"
  sed 's/^/rank 1: /' "$dir/rank1.log"
  ((rc0 == 2 || rc0 == 3)) && return "$rc0"
  local m0 m1
  m0="$(grep '^MERGED' "$dir/rank0.log")" m1="$(grep '^MERGED' "$dir/rank1.log")"
  if [[ -z "$m0" || "$m0" != "$m1" ]]; then
    echo "FAIL the two ranks merged different bits"
    return 1
  fi
  echo "PASS the two ranks merged the same bits; rank 0 exit $rc0, rank 1 exit $rc1"
  ((rc0 == 0 && rc1 == 0))
}

benchmark() {
  "$PYTHON" tests/gpu/bench.py --lib "$OUT/libsyncnorm_bench.so"
}

# A step that is a function of this script runs as `bash $0 --run NAME`,
# so that `timeout` can stop it.
if [[ "${1:-}" == --run ]]; then
  "$2"
  exit $?
fi

trap summary EXIT
step tools 60 bash "$0" --run tools
step build 420 bash "$0" --run build
step machinery 60 bash "$0" --machinery
step self-test 120 bash "$0" --run self_test
if [[ "$(status_of build)" != PASS ]]; then
  exit 1
fi
step kernels 240 "$OUT/device_check" kernels ${SEED:+--seed=$SEED}
if [[ "$(status_of kernels)" == SKIP ]]; then
  log "no usable GPU here: the GPU steps are skipped"
  for s in tools machinery self-test; do
    [[ "$(status_of $s)" == PASS ]] || exit 1
  done
  exit 2
fi
step nccl 120 "$OUT/device_check" nccl
step nccl-2proc 150 bash "$0" --run nccl_2proc
step benchmark 240 bash "$0" --run benchmark
for i in "${!STATUS[@]}"; do
  case "${STATUS[$i]}" in PASS | SKIP) ;; *) exit 1 ;; esac
done
exit 0
