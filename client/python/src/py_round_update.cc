#include "client/python/src/py_round_update.h"

#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pybind11/numpy.h"

namespace py = pybind11;

namespace syncnorm::python {
namespace {

using DoubleArray =
    py::array_t<double, py::array::c_style | py::array::forcecast>;

std::vector<double> Values(const py::handle& h, size_t channels,
                           const char* what) {
  const DoubleArray a = py::cast<DoubleArray>(h);
  if (a.ndim() != 1 || static_cast<size_t>(a.size()) != channels) {
    throw py::value_error(absl::StrCat("expected imported ", what, " of ",
                                       channels, " values, got ", a.size()));
  }
  return std::vector<double>(a.data(), a.data() + a.size());
}

}  // namespace

RoundUpdate RoundUpdateFrom(const py::object& momentum,
                            const py::object& imported, size_t channels) {
  RoundUpdate u;
  if (!momentum.is_none()) {
    const py::tuple t = py::cast<py::tuple>(momentum);
    const int mode = t.size() == 2 ? py::cast<int>(t[0]) : 0;
    if (mode < 1 || mode > 3) {
      throw py::value_error(
          "expected momentum (mode 1, 2 or 3, value) or None");
    }
    u.momentum =
        RoundMomentum{static_cast<MomentumMode>(mode), py::cast<double>(t[1])};
  }
  if (!imported.is_none()) {
    const py::tuple t = py::cast<py::tuple>(imported);
    if (t.size() != 3) {
      throw py::value_error(
          "expected imported (num_batches_tracked, running_mean, "
          "running_var) or None");
    }
    u.imported = RunningStats{py::cast<int64_t>(t[0]),
                              Values(t[1], channels, "running_mean"),
                              Values(t[2], channels, "running_var")};
  }
  return u;
}

}  // namespace syncnorm::python
