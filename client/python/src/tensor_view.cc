#include "client/python/src/tensor_view.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace syncnorm::python {
namespace {

std::string Dims(const std::vector<int64_t>& v) {
  return absl::StrCat("(", absl::StrJoin(v, ", "), ")");
}

// Whether dimensions `order` (outermost first) are laid out densely and
// row-major in that order. Size-1 dimensions may have any stride.
bool DenseInOrder(const std::vector<int64_t>& shape,
                  const std::vector<int64_t>& strides,
                  const std::vector<size_t>& order) {
  int64_t expected = 1;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const int64_t size = shape[*it];
    if (size != 1 && strides[*it] != expected) return false;
    expected *= size;
  }
  return true;
}

std::vector<size_t> Identity(size_t rank) {
  std::vector<size_t> order(rank);
  for (size_t i = 0; i < rank; ++i) order[i] = i;
  return order;
}

// (N, C, *spatial) read as (N, *spatial, C).
std::vector<size_t> ChannelsLastOrder(size_t rank) {
  std::vector<size_t> order = {0};
  for (size_t i = 2; i < rank; ++i) order.push_back(i);
  order.push_back(1);
  return order;
}

int64_t Elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

absl::StatusOr<TensorView> ViewOf(const TensorArg& t,
                                  bool logical_channels_last,
                                  const char* what) {
  const size_t rank = t.shape.size();
  if (rank < 2 || rank > 5) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": expected a 2-D to 5-D tensor (N, C, ...), got ",
                     rank, "-D of shape ", Dims(t.shape)));
  }
  if (t.strides.size() != rank) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", t.strides.size(), " strides for a ", rank,
                     "-D shape; pass one stride per dimension"));
  }
  for (int64_t d : t.shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": negative size in shape ", Dims(t.shape)));
    }
  }
  TensorView v;
  v.data = reinterpret_cast<void*>(t.data);
  v.shape = t.shape;
  v.dtype = t.dtype;
  v.device = t.device;
  const bool empty = Elements(t.shape) == 0;
  std::vector<int64_t> logical = t.shape;
  if (logical_channels_last || rank == 2) {
    if (!empty && !DenseInOrder(t.shape, t.strides, Identity(rank))) {
      return absl::InvalidArgumentError(absl::StrCat(
          what,
          ": expected a contiguous tensor (channel last, shape (N, ..., "
          "C)); got shape ",
          Dims(t.shape), " with strides ", Dims(t.strides),
          "; call .contiguous()"));
    }
    v.memory_channels_last = rank > 2;
  } else if (empty || DenseInOrder(t.shape, t.strides, Identity(rank))) {
    v.memory_channels_last = false;
  } else if (DenseInOrder(t.shape, t.strides, ChannelsLastOrder(rank))) {
    v.memory_channels_last = true;
    logical.clear();
    for (size_t i : ChannelsLastOrder(rank)) logical.push_back(t.shape[i]);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(what,
                     ": expected a contiguous (N, C, ...) tensor or one in "
                     "channels_last memory format; got shape ",
                     Dims(t.shape), " with strides ", Dims(t.strides),
                     "; call .contiguous()"));
  }
  absl::StatusOr<Geometry> g = MakeGeometry(logical, v.memory_channels_last);
  if (!g.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", g.status().message()));
  }
  v.geometry = *g;
  if (v.data == nullptr && !empty) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": null data pointer for a tensor of shape ", Dims(t.shape)));
  }
  return v;
}

absl::Status CheckLike(const TensorView& t, const TensorView& like,
                       const char* what) {
  if (t.shape != like.shape) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": expected the input's shape ", Dims(like.shape),
                     ", got ", Dims(t.shape)));
  }
  if (t.dtype != like.dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": expected the input's dtype (code ",
                     static_cast<int>(like.dtype), "), got code ",
                     static_cast<int>(t.dtype)));
  }
  if (t.device != like.device) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": expected the input's device (",
                     like.device == Device::kCpu ? "cpu" : "cuda", ")"));
  }
  const bool empty = like.geometry.elements() == 0;
  if (!empty && t.memory_channels_last != like.memory_channels_last) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": expected the input's memory layout (",
        like.memory_channels_last ? "channels last" : "contiguous",
        "); make it like the input, e.g. torch.empty_like(input).copy_(t)"));
  }
  return absl::OkStatus();
}

}  // namespace syncnorm::python
