#!/usr/bin/env bash
# The device check, for a machine with a GPU, nvcc and PyTorch with CUDA (no
# Bazel, no gRPC, no network needed). From the repository root:
#
#   bash tests/gpu/device_check.sh
#
# 1. builds the CUDA kernels and their checks with nvcc (no Abseil);
# 2. compares every kernel against a float64 CPU reference on fresh random
#    inputs for every dtype, layout and rank (outputs poisoned first), checks
#    the launchers' error paths and determinism;
# 3. exercises NCCL with the GPUs the machine has (rank-order merge identical
#    on every rank, all-reduce, broadcast, a missing rank times out, two
#    ranks on one GPU are refused);
# 4. times local moments, forward and backward against
#    torch.nn.functional.batch_norm on the same CUDA tensors and against a
#    device-to-device copy, and prints a table last.
# Environment: NVCC (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc),
# PYTHON (default python3), BENCH_SHAPE (default 32,256,56,56),
# BUILD_DIR (default a fresh temporary folder). Exit status: 0 all passed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
NVCC="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
PYTHON="${PYTHON:-python3}"
CUDA_HOME="$(cd "$(dirname "$NVCC")/.." && pwd)"
OUT="${BUILD_DIR:-$(mktemp -d /tmp/syncnorm_device_check.XXXXXX)}"
mkdir -p "$OUT"
START=$(date +%s)
log() { echo "[device_check $(( $(date +%s) - START ))s] $*"; }

# sm_90 SASS + compute_90 PTX (the Bazel build's targets), plus SASS for the
# GPU here when it is another architecture.
ARCH=(--generate-code "arch=compute_90,code=[sm_90,compute_90]")
CAP="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .' || true)"
if [[ -n "$CAP" && "$CAP" != "90" ]]; then
  ARCH+=(--generate-code "arch=compute_${CAP},code=sm_${CAP}")
fi
log "nvcc: $NVCC ($("$NVCC" --version | tail -1)); GPU compute capability: ${CAP:-unknown}"

# NCCL: the toolkit, the system, or the nvidia-nccl wheel that PyTorch uses.
NCCL_INC="" NCCL_LIB=""
for inc in "$CUDA_HOME/include" /usr/include; do
  [[ -f "$inc/nccl.h" ]] && NCCL_INC="$inc" && break
done
for lib in "$CUDA_HOME/lib64" "$CUDA_HOME/lib" /usr/lib/x86_64-linux-gnu; do
  ls "$lib"/libnccl.so* >/dev/null 2>&1 && NCCL_LIB="$lib" && break
done
if [[ -z "$NCCL_INC" || -z "$NCCL_LIB" ]]; then
  WHEEL="$("$PYTHON" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)"
  if [[ -n "$WHEEL" && -f "$WHEEL/include/nccl.h" ]]; then
    NCCL_INC="$WHEEL/include" NCCL_LIB="$WHEEL/lib"
  fi
fi
NVFLAGS=(-O3 -std=c++17 -Xcompiler -fPIC "${ARCH[@]}" -I"$ROOT")
CHECK_EXTRA=() CHECK_LINK=()
if [[ -n "$NCCL_INC" && -n "$NCCL_LIB" ]]; then
  NCCL_SO="$(cd "$NCCL_LIB" && ls libnccl.so* | head -1)"
  CHECK_EXTRA=(-DSYNCNORM_WITH_NCCL -I"$NCCL_INC")
  CHECK_LINK=(-L"$NCCL_LIB" -l:"$NCCL_SO" -Xlinker -rpath -Xlinker "$NCCL_LIB")
  log "NCCL: $NCCL_INC/nccl.h, $NCCL_LIB/$NCCL_SO"
else
  log "NCCL not found: the NCCL checks are skipped"
fi

log "building with nvcc into $OUT"
"$NVCC" "${NVFLAGS[@]}" -c kernels/batch_norm_cuda_reduce.cu -o "$OUT/reduce.o" &
P1=$!
"$NVCC" "${NVFLAGS[@]}" -c kernels/batch_norm_cuda_elementwise.cu -o "$OUT/elementwise.o" &
P2=$!
"$NVCC" "${NVFLAGS[@]}" -c kernels/kernel_check.cc -o "$OUT/kernel_check.o" &
P3=$!
"$NVCC" "${NVFLAGS[@]}" "${CHECK_EXTRA[@]}" -c tests/gpu/device_check_main.cc -o "$OUT/main.o" &
P4=$!
"$NVCC" "${NVFLAGS[@]}" -c tests/gpu/bench_capi.cc -o "$OUT/bench_capi.o" &
P5=$!
NCCL_OBJ=()
if [[ ${#CHECK_EXTRA[@]} -gt 0 ]]; then
  "$NVCC" "${NVFLAGS[@]}" "${CHECK_EXTRA[@]}" -c client/nccl_comm.cc -o "$OUT/nccl_comm.o"
  NCCL_OBJ=("$OUT/nccl_comm.o")
fi
for p in $P1 $P2 $P3 $P4 $P5; do wait "$p"; done
"$NVCC" "${ARCH[@]}" -o "$OUT/device_check" "$OUT/main.o" "$OUT/kernel_check.o" \
  "$OUT/reduce.o" "$OUT/elementwise.o" "${NCCL_OBJ[@]}" "${CHECK_LINK[@]}" -lpthread
"$NVCC" "${ARCH[@]}" -shared -o "$OUT/libsyncnorm_bench.so" "$OUT/bench_capi.o" \
  "$OUT/reduce.o" "$OUT/elementwise.o"
log "built"

STATUS=0
log "kernel and NCCL checks"
"$OUT/device_check" || STATUS=$?
if [[ $STATUS -eq 2 ]]; then
  log "no usable GPU here; nothing was checked"
  exit 2
fi

log "checks $([[ $STATUS -eq 0 ]] && echo passed || echo FAILED); benchmark against torch.nn.functional.batch_norm"
BENCH=0
"$PYTHON" tests/gpu/bench.py --lib "$OUT/libsyncnorm_bench.so" \
  --shape "${BENCH_SHAPE:-32,256,56,56}" || BENCH=$?
# The table is the last thing printed; the exit status tells the rest.
[[ $STATUS -eq 0 && $BENCH -eq 0 ]]
