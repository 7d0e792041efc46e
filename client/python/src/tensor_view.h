// How a tensor handed over from Python (data pointer, shape, strides, dtype,
// device) maps onto the kernels' [outer, channels, inner] view.
#ifndef SYNCNORM_CLIENT_PYTHON_SRC_TENSOR_VIEW_H_
#define SYNCNORM_CLIENT_PYTHON_SRC_TENSOR_VIEW_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/batch_norm.h"

namespace syncnorm::python {

// A tensor as the caller describes it; strides are in elements (torch's
// Tensor.stride()).
struct TensorArg {
  uintptr_t data = 0;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  DType dtype = DType::kFloat32;
  Device device = Device::kCpu;
};

// A tensor checked against one of the two layouts the kernels read.
struct TensorView {
  void* data = nullptr;
  std::vector<int64_t> shape;
  Geometry geometry;
  // The memory holds channels last: either logically (N, *, C) (apex
  // channel_last) or an (N, C, *) tensor in torch's channels_last memory
  // format.
  bool memory_channels_last = false;
  DType dtype = DType::kFloat32;
  Device device = Device::kCpu;
};

// The view of `t`. logical_channels_last: the shape is (N, *, C) and must be
// contiguous. Otherwise the shape is (N, C, *) and the memory must be either
// contiguous (channels first) or dense channels last (torch.channels_last /
// channels_last_3d, or the same permutation for 3-D). Strides of size-1
// dimensions are ignored, and an empty tensor has any strides.
// INVALID_ARGUMENT naming `what` and the expected layout otherwise.
absl::StatusOr<TensorView> ViewOf(const TensorArg& t,
                                  bool logical_channels_last, const char* what);

// OK when `t` has the shape, layout, dtype and device of `like`;
// INVALID_ARGUMENT naming `what` and what was expected otherwise.
absl::Status CheckLike(const TensorView& t, const TensorView& like,
                       const char* what);

}  // namespace syncnorm::python

#endif  // SYNCNORM_CLIENT_PYTHON_SRC_TENSOR_VIEW_H_
