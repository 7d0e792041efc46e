// The batch-norm kernels on raw tensors. A tensor crosses as the tuple
// (data_ptr, shape, strides, dtype, device): dtype 0 float32, 1 float16,
// 2 bfloat16; device 0 CPU, 1 CUDA (the current CUDA device; `stream` is a
// cudaStream_t as an int, 0 the default stream). Per-channel arrays are
// NumPy arrays on the host.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/python/src/bindings.h"
#include "client/python/src/py_status.h"
#include "client/python/src/tensor_view.h"
#include "kernels/batch_norm.h"
#include "kernels/thread_pool.h"
#include "pybind11/numpy.h"
#include "pybind11/stl.h"

namespace py = pybind11;

namespace syncnorm::python {
namespace {

using DoubleArray =
    py::array_t<double, py::array::c_style | py::array::forcecast>;
using FloatArray =
    py::array_t<float, py::array::c_style | py::array::forcecast>;

DType ToDType(int code) {
  switch (code) {
    case 0:
      return DType::kFloat32;
    case 1:
      return DType::kFloat16;
    case 2:
      return DType::kBFloat16;
    default:
      throw py::type_error(absl::StrCat(
          "expected dtype code 0 (float32), 1 (float16) or 2 (bfloat16), "
          "got ",
          code));
  }
}

Device ToDevice(int code) {
  if (code == 0) return Device::kCpu;
  if (code == 1) return Device::kCuda;
  throw py::value_error(
      absl::StrCat("expected device code 0 (cpu) or 1 (cuda), got ", code));
}

// (data_ptr, shape, strides, dtype, device) -> the checked view.
TensorView View(const py::handle& h, bool channels_last, const char* what) {
  py::tuple t;
  try {
    t = h.cast<py::tuple>();
  } catch (const py::cast_error&) {
    throw py::type_error(absl::StrCat(
        what, ": expected a (data_ptr, shape, strides, dtype, device) tuple"));
  }
  if (t.size() != 5) {
    throw py::type_error(absl::StrCat(
        what,
        ": expected a (data_ptr, shape, strides, dtype, device) tuple, "
        "got ",
        t.size(), " items"));
  }
  TensorArg arg;
  arg.data = t[0].cast<uintptr_t>();
  arg.shape = t[1].cast<std::vector<int64_t>>();
  arg.strides = t[2].cast<std::vector<int64_t>>();
  arg.dtype = ToDType(t[3].cast<int>());
  arg.device = ToDevice(t[4].cast<int>());
  absl::StatusOr<TensorView> v = ViewOf(arg, channels_last, what);
  ThrowIfError(v.status());
  return *v;
}

// An optional tensor that must match x.
std::optional<TensorView> ViewLike(const py::object& h, const TensorView& x,
                                   bool channels_last, const char* what) {
  if (h.is_none()) return std::nullopt;
  TensorView v = View(h, channels_last, what);
  ThrowIfError(CheckLike(v, x, what));
  return v;
}

void* DataOf(const std::optional<TensorView>& v) {
  return v ? v->data : nullptr;
}

KernelContext Context(const TensorView& x, ThreadPool* pool, uintptr_t stream) {
  return KernelContext{x.device, pool, reinterpret_cast<void*>(stream)};
}

// A host per-channel array of `channels` values.
template <typename A>
const typename A::value_type* PerChannel(const A& a, const Geometry& g,
                                         const char* what) {
  if (a.ndim() != 1 || a.size() != g.channels) {
    throw py::value_error(absl::StrCat("expected ", what, " of ", g.channels,
                                       " values (one per channel), got ",
                                       a.size()));
  }
  return a.data();
}

template <typename A>
const typename A::value_type* OptionalPerChannel(const std::optional<A>& a,
                                                 const Geometry& g,
                                                 const char* what) {
  return a ? PerChannel(*a, g, what) : nullptr;
}

DoubleArray ToArray(const std::vector<double>& v) {
  DoubleArray a(static_cast<py::ssize_t>(v.size()));
  std::copy(v.begin(), v.end(), a.mutable_data());
  return a;
}

template <typename Fn>
void RunKernel(Fn fn) {
  absl::Status s;
  {
    py::gil_scoped_release release;
    s = fn();
  }
  ThrowIfError(s);
}

py::tuple LocalMomentsPy(const py::object& x_arg, bool channels_last,
                         ThreadPool* pool, uintptr_t stream) {
  const TensorView x = View(x_arg, channels_last, "x");
  Moments m;
  RunKernel([&] {
    return LocalMoments(Context(x, pool, stream), x.dtype, x.data, x.geometry,
                        &m);
  });
  return py::make_tuple(m.count, ToArray(m.mean), ToArray(m.m2));
}

void ForwardPy(const py::object& x_arg, const py::object& y_arg,
               const py::object& z_arg, const std::optional<FloatArray>& weight,
               const std::optional<FloatArray>& bias, const DoubleArray& mean,
               const DoubleArray& invstd, bool relu, bool channels_last,
               ThreadPool* pool, uintptr_t stream) {
  const TensorView x = View(x_arg, channels_last, "x");
  const auto y = ViewLike(y_arg, x, channels_last, "y");
  if (!y) throw py::value_error("y: expected an output tensor, got None");
  const auto z = ViewLike(z_arg, x, channels_last, "z");
  ForwardArgs args;
  args.x = x.data;
  args.y = y->data;
  args.z = DataOf(z);
  args.weight = OptionalPerChannel(weight, x.geometry, "weight");
  args.bias = OptionalPerChannel(bias, x.geometry, "bias");
  args.mean = PerChannel(mean, x.geometry, "mean");
  args.invstd = PerChannel(invstd, x.geometry, "invstd");
  args.relu = relu;
  RunKernel([&] {
    return Forward(Context(x, pool, stream), x.dtype, x.geometry, args);
  });
}

py::tuple BackwardReducePy(const py::object& dy_arg, const py::object& x_arg,
                           const py::object& y_arg, const DoubleArray& mean,
                           const DoubleArray& invstd, bool channels_last,
                           ThreadPool* pool, uintptr_t stream) {
  const TensorView x = View(x_arg, channels_last, "x");
  const auto dy = ViewLike(dy_arg, x, channels_last, "dy");
  if (!dy) throw py::value_error("dy: expected a tensor, got None");
  const auto y = ViewLike(y_arg, x, channels_last, "y");
  BackwardReduceArgs args;
  args.dy = dy->data;
  args.x = x.data;
  args.y = DataOf(y);
  args.mean = PerChannel(mean, x.geometry, "mean");
  args.invstd = PerChannel(invstd, x.geometry, "invstd");
  GradSums sums;
  std::vector<double> grad_weight(x.geometry.channels);
  std::vector<double> grad_bias(x.geometry.channels);
  RunKernel([&] {
    return BackwardReduce(Context(x, pool, stream), x.dtype, x.geometry, args,
                          &sums, grad_weight.data(), grad_bias.data());
  });
  return py::make_tuple(ToArray(sums.sum_dy), ToArray(sums.sum_dy_xmu),
                        ToArray(grad_weight), ToArray(grad_bias));
}

void BackwardElementwisePy(const py::object& dy_arg, const py::object& x_arg,
                           const py::object& y_arg, const DoubleArray& mean,
                           const DoubleArray& invstd,
                           const std::optional<FloatArray>& weight,
                           const DoubleArray& mean_dy,
                           const DoubleArray& mean_dy_xmu,
                           const py::object& grad_input_arg,
                           const py::object& grad_z_arg, bool channels_last,
                           ThreadPool* pool, uintptr_t stream) {
  const TensorView x = View(x_arg, channels_last, "x");
  const auto dy = ViewLike(dy_arg, x, channels_last, "dy");
  const auto y = ViewLike(y_arg, x, channels_last, "y");
  const auto grad_input =
      ViewLike(grad_input_arg, x, channels_last, "grad_input");
  if (!dy || !grad_input) {
    throw py::value_error("expected dy and grad_input tensors, got None");
  }
  const auto grad_z = ViewLike(grad_z_arg, x, channels_last, "grad_z");
  BackwardElementwiseArgs args;
  args.dy = dy->data;
  args.x = x.data;
  args.y = DataOf(y);
  args.mean = PerChannel(mean, x.geometry, "mean");
  args.invstd = PerChannel(invstd, x.geometry, "invstd");
  args.weight = OptionalPerChannel(weight, x.geometry, "weight");
  args.mean_dy = PerChannel(mean_dy, x.geometry, "mean_dy");
  args.mean_dy_xmu = PerChannel(mean_dy_xmu, x.geometry, "mean_dy_xmu");
  args.grad_input = grad_input->data;
  args.grad_z = DataOf(grad_z);
  RunKernel([&] {
    return BackwardElementwise(Context(x, pool, stream), x.dtype, x.geometry,
                               args);
  });
}

// Whether the kernels of this build take `dtype` on `device`. Creates no
// CUDA context (it is asked before the tensor's device is made current).
bool Supports(int dtype_code, int device_code) {
  return KernelsAvailable(ToDevice(device_code), ToDType(dtype_code));
}

}  // namespace

void BindKernels(py::module_& m) {
  py::class_<ThreadPool>(m, "ThreadPool",
                         "CPU threads for the kernels (threads counts the "
                         "caller).")
      .def(py::init<int>(), py::arg("threads"))
      .def_property_readonly("size", &ThreadPool::size);

  m.def("local_moments", &LocalMomentsPy, py::arg("x"),
        py::arg("channels_last") = false, py::arg("pool") = nullptr,
        py::arg("stream") = 0,
        "Local per-channel moments of x: (count, mean, m2), float64.");
  m.def("forward", &ForwardPy, py::arg("x"), py::arg("y"), py::arg("z"),
        py::arg("weight"), py::arg("bias"), py::arg("mean"), py::arg("invstd"),
        py::arg("relu") = false, py::arg("channels_last") = false,
        py::arg("pool") = nullptr, py::arg("stream") = 0,
        "y = relu?((x - mean) * invstd * weight + bias (+ z)).");
  m.def("backward_reduce", &BackwardReducePy, py::arg("dy"), py::arg("x"),
        py::arg("y"), py::arg("mean"), py::arg("invstd"),
        py::arg("channels_last") = false, py::arg("pool") = nullptr,
        py::arg("stream") = 0,
        "Local (sum_dy, sum_dy_xmu, grad_weight, grad_bias), float64; y (the "
        "fused-ReLU output) masks dy.");
  m.def("backward_elementwise", &BackwardElementwisePy, py::arg("dy"),
        py::arg("x"), py::arg("y"), py::arg("mean"), py::arg("invstd"),
        py::arg("weight"), py::arg("mean_dy"), py::arg("mean_dy_xmu"),
        py::arg("grad_input"), py::arg("grad_z"),
        py::arg("channels_last") = false, py::arg("pool") = nullptr,
        py::arg("stream") = 0,
        "grad_input (and grad_z) from dy and the global mean sums.");
  m.def("supports", &Supports, py::arg("dtype"), py::arg("device"),
        "Whether this build's kernels take the dtype code on the device "
        "code.");
}

}  // namespace syncnorm::python
