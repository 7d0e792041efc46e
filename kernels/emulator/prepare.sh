#!/usr/bin/env bash
# prepare.sh MUTANT NAME IN OUT: makes the CUDA source IN (named NAME) a
# host C++ file OUT for the emulator. Line for line, it
#  - puts a #line directive first, so that diagnostics and the emulator's
#    reports (__FILE__, __LINE__) point into NAME;
#  - turns each one-line `__shared__ T name[N];` into a reference to the
#    running block's storage of that variable,
#    `T (&name)[N] = ::syncnorm::emu::SharedVariable<T[N]>(__FILE__, __LINE__);`
#    (per block and poisoned, as shared memory is; a declaration it cannot
#    rewrite fails to compile);
#  - plants the bug MUTANT, unless it is "none". A bug must change the
#    source where it is meant to, so a change of the kernels that moves its
#    target fails the build instead of silently planting nothing.
# The bugs, each of which //kernels:cuda_emulated_test shows the emulator
# catching:
#   shuffle_mask     the warp merges' __shfl_down_sync leave lane 31 out of
#                    their mask (batch_norm_cuda_reduce.cu)
#   grid_stride      the elementwise grid-stride loop steps two strides,
#                    skipping every other one (batch_norm_cuda_elementwise.cu)
#   missing_barrier  the barrier before each level of a block's column
#                    merge, which reads the other row lanes' shared
#                    partials, is gone (batch_norm_cuda_reduce.cu)
set -euo pipefail
mutant="$1" name="$2" in="$3" out="$4"
tmp="$out.tmp"
case "$mutant" in
  none) cp "$in" "$tmp" ;;
  shuffle_mask)
    sed 's/__shfl_down_sync(0xffffffffu,/__shfl_down_sync(0x7fffffffu,/' "$in" > "$tmp" ;;
  grid_stride)
    sed 's/for (int64_t g = me; g < groups; g += stride)/for (int64_t g = me; g < groups; g += 2 * stride)/' "$in" > "$tmp" ;;
  missing_barrier)
    sed 's|__syncthreads();  // every partial of the previous level is written|// (barrier removed)|' "$in" > "$tmp" ;;
  *) echo "prepare.sh: unknown mutant '$mutant'" >&2; exit 1 ;;
esac
if [[ "$mutant" != none ]] && cmp -s "$in" "$tmp"; then
  echo "prepare.sh: mutant '$mutant' changed nothing in $name" >&2
  exit 1
fi
{
  echo "#line 1 \"$name\""
  sed -E 's/^([[:space:]]*)__shared__[[:space:]]+(.+[^[:space:]])[[:space:]]+([A-Za-z_][A-Za-z0-9_]*)((\[[^];]+\])*);/\1\2 (\&\3)\4 = ::syncnorm::emu::SharedVariable<\2\4>(__FILE__, __LINE__);/' "$tmp"
} > "$out"
rm -f "$tmp"
