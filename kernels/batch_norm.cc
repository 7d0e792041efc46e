// Validation and dispatch of the batch-norm kernels; the loops live in
// batch_norm_cpu_*.cc.
#include "kernels/batch_norm.h"

#include <cstdint>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "kernels/batch_norm_cpu.h"
#include "kernels/batch_norm_cuda.h"
#include "kernels/half.h"

namespace syncnorm {
namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// a * b, or an error when it overflows int64. REQUIRES: a, b >= 0.
absl::StatusOr<int64_t> CheckedProduct(int64_t a, int64_t b) {
  if (b != 0 && a > kInt64Max / b) {
    return absl::InvalidArgumentError(
        absl::StrCat("the tensor has more than ", kInt64Max, " elements (", a,
                     " * ", b, " overflows int64); check its shape"));
  }
  return a * b;
}

absl::Status ValidateGeometry(const Geometry& g, const char* fn) {
  if (g.outer < 0 || g.inner < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(fn, ": geometry {outer=", g.outer,
                     ", channels=", g.channels, ", inner=", g.inner,
                     "} has a negative size; build it with "
                     "MakeGeometry from the tensor's shape"));
  }
  if (g.channels < 1 || g.channels > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        fn, ": geometry has ", g.channels, " channels; it needs 1 to ",
        std::numeric_limits<int>::max(), " (num_features)"));
  }
  absl::StatusOr<int64_t> rows = CheckedProduct(g.outer, g.channels);
  if (rows.ok()) rows = CheckedProduct(*rows, g.inner);
  if (!rows.ok())
    return absl::InvalidArgumentError(
        absl::StrCat(fn, ": ", rows.status().message()));
  return absl::OkStatus();
}

// A required per-channel array or output.
absl::Status Require(const void* p, const char* fn, const char* name) {
  if (p != nullptr) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(fn, ": ", name, " is null; it is required"));
}

// A required tensor: it may be null only when it has no elements (an empty
// tensor has no storage).
absl::Status RequireTensor(const void* p, const Geometry& g, const char* fn,
                           const char* name) {
  if (p != nullptr || g.elements() == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(fn, ": ", name, " is null but the tensor has ", g.elements(),
                   " elements; pass its data"));
}

absl::Status FromCuda(const cuda::Result& r) {
  switch (r.code) {
    case cuda::Code::kOk:
      return absl::OkStatus();
    case cuda::Code::kInvalidArgument:
      return absl::InvalidArgumentError(r.message);
    case cuda::Code::kFailedPrecondition:
      return absl::FailedPreconditionError(r.message);
    case cuda::Code::kUnimplemented:
      return absl::UnimplementedError(r.message);
    case cuda::Code::kInternal:
    default:
      return absl::InternalError(r.message);
  }
}

// The single place that maps (device, dtype) to an implementation:
// run_cuda() for Device::kCuda (the launchers switch on dtype themselves),
// else run_cpu(T{}) with T the CPU element type of dtype.
template <typename CpuFn, typename CudaFn>
absl::Status Dispatch(const KernelContext& ctx, DType dtype, const char* fn,
                      CpuFn&& run_cpu, CudaFn&& run_cuda) {
  switch (ctx.device) {
    case Device::kCpu:
      break;
    case Device::kCuda:
      return run_cuda();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(fn, ": unknown device ", static_cast<int>(ctx.device),
                       "; use Device::kCpu or Device::kCuda"));
  }
  switch (dtype) {
    case DType::kFloat32:
      run_cpu(float{});
      return absl::OkStatus();
    case DType::kFloat16:
      run_cpu(Half{});
      return absl::OkStatus();
    case DType::kBFloat16:
      run_cpu(BFloat16{});
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(fn, ": unknown dtype ", static_cast<int>(dtype),
                       "; use kFloat32, kFloat16 or kBFloat16"));
  }
}

}  // namespace

absl::StatusOr<Geometry> MakeGeometry(absl::Span<const int64_t> shape,
                                      bool channels_last) {
  if (shape.size() < 2 || shape.size() > 5) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a batch-norm input has 2 to 5 dimensions (N, C, ...), got ",
        shape.size()));
  }
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("dimension ", i, " of the input shape is ", shape[i],
                       "; sizes must be >= 0"));
    }
  }
  const bool last = channels_last && shape.size() > 2;
  Geometry g;
  g.channels = last ? shape.back() : shape[1];
  if (g.channels == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the channel dimension (", last ? shape.size() - 1 : 1,
        ") of the input is 0; a batch-norm input needs at least 1 channel"));
  }
  // spatial: the dimensions between N and C (last) or after C (first).
  const size_t spatial_begin = last ? 1 : 2;
  const size_t spatial_end = last ? shape.size() - 1 : shape.size();
  int64_t spatial = 1;
  for (size_t i = spatial_begin; i < spatial_end; ++i) {
    absl::StatusOr<int64_t> p = CheckedProduct(spatial, shape[i]);
    if (!p.ok()) return p.status();
    spatial = *p;
  }
  absl::StatusOr<int64_t> outer =
      last ? CheckedProduct(shape[0], spatial) : shape[0];
  if (!outer.ok()) return outer.status();
  g.outer = *outer;
  g.inner = last ? 1 : spatial;
  absl::Status s = ValidateGeometry(g, "MakeGeometry");
  if (!s.ok()) return s;
  return g;
}

bool KernelsAvailable(Device device, DType dtype) {
  if (dtype != DType::kFloat32 && dtype != DType::kFloat16 &&
      dtype != DType::kBFloat16) {
    return false;
  }
  switch (device) {
    case Device::kCpu:
      return true;
    case Device::kCuda:
      return cuda::VisibleDevices(nullptr) > 0;  // counts; no context
    default:
      return false;
  }
}

absl::Status LocalMoments(const KernelContext& ctx, DType dtype, const void* x,
                          const Geometry& g, Moments* out) {
  constexpr char kFn[] = "LocalMoments";
  absl::Status s = ValidateGeometry(g, kFn);
  if (s.ok()) s = RequireTensor(x, g, kFn, "x");
  if (s.ok()) s = Require(out, kFn, "out");
  if (!s.ok()) return s;
  return Dispatch(
      ctx, dtype, kFn,
      [&](auto tag) {
        using T = decltype(tag);
        cpu::LocalMoments<T>(ctx.pool, static_cast<const T*>(x), g, out);
      },
      [&] {
        Moments m = Moments::Zero(static_cast<int>(g.channels));
        absl::Status st = FromCuda(cuda::LocalMoments(
            ctx.stream, dtype, x, g, m.mean.data(), m.m2.data()));
        if (!st.ok()) return st;
        m.count = g.per_channel();
        *out = std::move(m);
        return absl::OkStatus();
      });
}

absl::Status Forward(const KernelContext& ctx, DType dtype, const Geometry& g,
                     const ForwardArgs& args) {
  constexpr char kFn[] = "Forward";
  absl::Status s = ValidateGeometry(g, kFn);
  if (s.ok()) s = RequireTensor(args.x, g, kFn, "args.x");
  if (s.ok()) s = RequireTensor(args.y, g, kFn, "args.y");
  if (s.ok()) s = Require(args.mean, kFn, "args.mean");
  if (s.ok()) s = Require(args.invstd, kFn, "args.invstd");
  if (!s.ok()) return s;
  return Dispatch(
      ctx, dtype, kFn,
      [&](auto tag) { cpu::Forward<decltype(tag)>(ctx.pool, g, args); },
      [&] { return FromCuda(cuda::Forward(ctx.stream, dtype, g, args)); });
}

absl::Status BackwardReduce(const KernelContext& ctx, DType dtype,
                            const Geometry& g, const BackwardReduceArgs& args,
                            GradSums* sums, double* grad_weight,
                            double* grad_bias) {
  constexpr char kFn[] = "BackwardReduce";
  absl::Status s = ValidateGeometry(g, kFn);
  if (s.ok()) s = RequireTensor(args.dy, g, kFn, "args.dy");
  if (s.ok()) s = RequireTensor(args.x, g, kFn, "args.x");
  if (s.ok()) s = Require(args.mean, kFn, "args.mean");
  if (s.ok()) s = Require(args.invstd, kFn, "args.invstd");
  if (s.ok()) s = Require(sums, kFn, "sums");
  if (!s.ok()) return s;
  return Dispatch(
      ctx, dtype, kFn,
      [&](auto tag) {
        cpu::BackwardReduce<decltype(tag)>(ctx.pool, g, args, sums, grad_weight,
                                           grad_bias);
      },
      [&] {
        GradSums local;
        local.sum_dy.assign(g.channels, 0.0);
        local.sum_dy_xmu.assign(g.channels, 0.0);
        absl::Status st = FromCuda(
            cuda::BackwardReduce(ctx.stream, dtype, g, args,
                                 local.sum_dy.data(), local.sum_dy_xmu.data()));
        if (!st.ok()) return st;
        for (int64_t c = 0; c < g.channels; ++c) {
          if (grad_weight != nullptr) {
            grad_weight[c] = local.sum_dy_xmu[c] * args.invstd[c];
          }
          if (grad_bias != nullptr) grad_bias[c] = local.sum_dy[c];
        }
        *sums = std::move(local);
        return absl::OkStatus();
      });
}

absl::Status BackwardElementwise(const KernelContext& ctx, DType dtype,
                                 const Geometry& g,
                                 const BackwardElementwiseArgs& args) {
  constexpr char kFn[] = "BackwardElementwise";
  absl::Status s = ValidateGeometry(g, kFn);
  if (s.ok()) s = RequireTensor(args.dy, g, kFn, "args.dy");
  if (s.ok()) s = RequireTensor(args.x, g, kFn, "args.x");
  if (s.ok()) s = RequireTensor(args.grad_input, g, kFn, "args.grad_input");
  if (s.ok()) s = Require(args.mean, kFn, "args.mean");
  if (s.ok()) s = Require(args.invstd, kFn, "args.invstd");
  if (s.ok()) s = Require(args.mean_dy, kFn, "args.mean_dy");
  if (s.ok()) s = Require(args.mean_dy_xmu, kFn, "args.mean_dy_xmu");
  if (!s.ok()) return s;
  return Dispatch(
      ctx, dtype, kFn,
      [&](auto tag) {
        cpu::BackwardElementwise<decltype(tag)>(ctx.pool, g, args);
      },
      [&] {
        return FromCuda(cuda::BackwardElementwise(ctx.stream, dtype, g, args));
      });
}

}  // namespace syncnorm
