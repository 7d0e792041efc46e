// Client, NodeGroup and ThreadNode for Python. Requests and replies cross as
// JSON text of the syncnorm.v1 messages; the syncnorm package turns them
// into dicts.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/node_group.h"
#include "client/precise_bn.h"
#include "client/python/src/bindings.h"
#include "client/python/src/json_proto.h"
#include "client/python/src/py_round_update.h"
#include "client/python/src/py_status.h"
#include "client/thread_node.h"
#include "kernels/moments.h"
#include "pybind11/numpy.h"
#include "pybind11/stl.h"

namespace py = pybind11;

namespace syncnorm::python {
namespace {

using DoubleArray =
    py::array_t<double, py::array::c_style | py::array::forcecast>;

// The binding's handle of a Client (which is neither copyable nor movable).
struct PyClient {
  explicit PyClient(const ClientOptions& options) : client(options) {}
  Client client;
};

ClientOptions MakeOptions(const std::string& address, double rpc_timeout_s,
                          double round_timeout_s, double connect_timeout_s) {
  if (rpc_timeout_s <= 0 || round_timeout_s <= 0) {
    throw py::value_error(absl::StrCat(
        "expected positive timeouts, got rpc_timeout=", rpc_timeout_s,
        " s and round_timeout=", round_timeout_s, " s"));
  }
  if (!(connect_timeout_s > 0)) {
    throw py::value_error(absl::StrCat(
        "expected a positive connect_timeout, got ", connect_timeout_s, " s"));
  }
  ClientOptions options;
  options.address = address;
  options.rpc_timeout = absl::Seconds(rpc_timeout_s);
  options.round_timeout = absl::Seconds(round_timeout_s);
  options.connect_timeout = absl::Seconds(connect_timeout_s);
  return options;
}

// Runs call() without the GIL, then returns its value as JSON or raises
// ServiceError.
template <typename Call>
std::string JsonCall(Call call) {
  decltype(call()) result = absl::UnknownError("not run");
  {
    py::gil_scoped_release release;
    result = call();
  }
  ThrowIfServiceError(result.status());
  return ToJson(*result);
}

template <typename M>
M Parse(const std::string& json, const char* what) {
  absl::StatusOr<M> m = FromJson<M>(json, what);
  ThrowIfError(m.status());
  return *std::move(m);
}

std::vector<double> ToVector(const DoubleArray& a, size_t channels,
                             const char* what) {
  if (a.ndim() != 1 || static_cast<size_t>(a.size()) != channels) {
    throw py::value_error(absl::StrCat("expected ", what, " of ", channels,
                                       " values (one per channel), got ",
                                       a.size()));
  }
  return std::vector<double>(a.data(), a.data() + a.size());
}

DoubleArray ToArray(const std::vector<double>& v) {
  DoubleArray a(static_cast<py::ssize_t>(v.size()));
  std::copy(v.begin(), v.end(), a.mutable_data());
  return a;
}

py::tuple SyncForward(NodeGroup& group, int layer, int64_t step, int64_t count,
                      const DoubleArray& mean, const DoubleArray& m2,
                      const py::object& momentum, const py::object& imported) {
  Moments local;
  local.count = count;
  local.mean = ToVector(mean, mean.size(), "mean");
  local.m2 = ToVector(m2, local.mean.size(), "m2");
  const RoundUpdate update =
      RoundUpdateFrom(momentum, imported, local.mean.size());
  absl::StatusOr<ForwardReply> reply = absl::UnknownError("not run");
  {
    py::gil_scoped_release release;
    reply = group.SyncForwardWithUpdate(layer, step, local, update);
  }
  ThrowIfServiceError(reply.status());
  py::tuple view(reply->view.size());
  for (size_t i = 0; i < reply->view.size(); ++i) {
    view[i] = py::make_tuple(reply->view[i].rank, reply->view[i].step);
  }
  return py::make_tuple(reply->global.count, ToArray(reply->global.mean),
                        ToArray(reply->global.var), reply->version,
                        py::tuple(py::cast(reply->missing_ranks)), view);
}

py::tuple SyncBackward(NodeGroup& group, int layer, int64_t step,
                       const DoubleArray& sum_dy, const DoubleArray& sum_dy_xmu,
                       int backward) {
  GradSums local;
  local.sum_dy = ToVector(sum_dy, sum_dy.size(), "sum_dy");
  local.sum_dy_xmu = ToVector(sum_dy_xmu, local.sum_dy.size(), "sum_dy_xmu");
  absl::StatusOr<GradSums> global = absl::UnknownError("not run");
  {
    py::gil_scoped_release release;
    global = group.SyncBackward(layer, step, backward, local);
  }
  ThrowIfServiceError(global.status());
  return py::make_tuple(ToArray(global->sum_dy), ToArray(global->sum_dy_xmu));
}

void BindNodeGroups(py::module_& m) {
  py::class_<NodeGroup>(m, "NodeGroup",
                        "One worker's way to the group's global statistics.")
      .def("sync_forward", &SyncForward, py::arg("layer"), py::arg("step"),
           py::arg("count"), py::arg("mean"), py::arg("m2"),
           py::arg("momentum") = py::none(), py::arg("imported") = py::none(),
           "Sends local moments, with the round's momentum (mode, value) "
           "and imported statistics (num_batches_tracked, running_mean, "
           "running_var) unless None; returns (count, mean, var, version, "
           "missing_ranks, view) of the group (var biased; missing_ranks: "
           "the ranks a quorum round did not count, a tuple, empty when "
           "every rank was counted; view: in a stale-synchronous job the "
           "(rank, step) pairs the answer merged, in rank order, else "
           "empty). Raises ServiceError.")
      .def("sync_backward", &SyncBackward, py::arg("layer"), py::arg("step"),
           py::arg("sum_dy"), py::arg("sum_dy_xmu"), py::arg("backward") = 0,
           "Sends local gradient sums of backward `backward` through the "
           "step's forward (from 0: each backward through one forward, "
           "as with retain_graph=True, is its own round); returns the "
           "group's (sum_dy, sum_dy_xmu). Raises ServiceError.");

  py::class_<ThreadNode>(m, "ThreadNode",
                         "local_size workers (threads) of one process that "
                         "merge first and send one contribution as `rank`.")
      .def(py::init([](PyClient& client, const std::string& job_id, int rank,
                       int local_size, double timeout_s) {
             if (local_size < 1) {
               throw py::value_error(
                   absl::StrCat("expected local_size >= 1, got ", local_size));
             }
             return std::make_unique<ThreadNode>(
                 local_size, client.client.NewNodeGroup(job_id, rank),
                 absl::Seconds(timeout_s));
           }),
           py::arg("client"), py::arg("job_id"), py::arg("rank"),
           py::arg("local_size"), py::arg("timeout_s") = 60.0)
      .def_property_readonly("local_size", &ThreadNode::local_size)
      .def(
          "member",
          [](ThreadNode& node, int local_rank) {
            if (local_rank < 0 || local_rank >= node.local_size()) {
              throw py::value_error(
                  absl::StrCat("expected a local rank in [0, ",
                               node.local_size(), "), got ", local_rank));
            }
            return node.Member(local_rank);
          },
          py::arg("local_rank"), py::keep_alive<0, 1>());
}

void BindClientClass(py::module_& m) {
  py::class_<PyClient>(m, "Client",
                       "A connection to one aggregator; thread-safe.")
      .def(py::init([](const std::string& address, double rpc_timeout_s,
                       double round_timeout_s, const std::string& token,
                       bool tls, const std::string& root_ca,
                       const std::string& client_cert,
                       const std::string& client_key, double connect_timeout_s,
                       const std::string& relay, bool relay_fallback) {
             ClientOptions options = MakeOptions(
                 address, rpc_timeout_s, round_timeout_s, connect_timeout_s);
             options.token = token;
             options.tls = tls;
             options.tls_root_ca = root_ca;
             options.tls_client_cert = client_cert;
             options.tls_client_key = client_key;
             options.relay = relay;
             options.relay_fallback = relay_fallback;
             return std::make_unique<PyClient>(options);
           }),
           py::arg("address"), py::arg("rpc_timeout_s") = 30.0,
           py::arg("round_timeout_s") = 60.0, py::arg("token") = "",
           py::arg("tls") = false, py::arg("root_ca") = "",
           py::arg("client_cert") = "", py::arg("client_key") = "",
           py::arg("connect_timeout_s") = 5.0, py::arg("relay") = "",
           py::arg("relay_fallback") = true,
           "token: bearer token sent on every call; tls: TLS (also implied "
           "by any PEM); root_ca, client_cert, client_key: PEM text; "
           "connect_timeout_s: how long one connection attempt may take; "
           "relay: host:port of this rank's relay, which takes its rounds "
           "(empty: none); relay_fallback: send the rounds to the shards "
           "while the relay is unreachable.")
      .def_property_readonly(
          "relay", [](PyClient& c) { return c.client.options().relay; })
      .def_property_readonly(
          "relay_fallback",
          [](PyClient& c) { return c.client.options().relay_fallback; })
      .def_property_readonly(
          "address", [](PyClient& c) { return c.client.options().address; })
      .def_property_readonly(
          "connect_timeout_s",
          [](PyClient& c) {
            return absl::ToDoubleSeconds(c.client.options().connect_timeout);
          })
      .def("create_job_json",
           [](PyClient& c, const std::string& json) {
             auto request = Parse<v1::CreateJobRequest>(json, "CreateJob");
             return JsonCall([&] { return c.client.CreateJob(request); });
           })
      .def("get_job_json",
           [](PyClient& c, const std::string& job_id) {
             return JsonCall([&] { return c.client.GetJob(job_id); });
           })
      .def("get_stats_health_json",
           [](PyClient& c, const std::string& job_id) {
             return JsonCall([&] { return c.client.GetStatsHealth(job_id); });
           })
      .def("delete_job",
           [](PyClient& c, const std::string& job_id) {
             absl::Status s;
             {
               py::gil_scoped_release release;
               s = c.client.DeleteJob(job_id);
             }
             ThrowIfServiceError(s);
           })
      .def("get_running_stats_json",
           [](PyClient& c, const std::string& json) {
             auto request =
                 Parse<v1::GetRunningStatsRequest>(json, "GetRunningStats");
             return JsonCall([&] { return c.client.GetRunningStats(request); });
           })
      .def(
          "checkpoint_json",
          [](PyClient& c, const std::string& json,
             std::optional<double> timeout_s) {
            auto request = Parse<v1::CheckpointRequest>(json, "Checkpoint");
            std::optional<absl::Duration> timeout;
            if (timeout_s) timeout = absl::Seconds(*timeout_s);
            return JsonCall([&] {
              return c.client.Checkpoint(request.job_id(), request.step(),
                                         request.tag(), timeout);
            });
          },
          py::arg("request"), py::arg("timeout_s") = py::none())
      .def("list_checkpoints_json",
           [](PyClient& c, const std::string& job_id) {
             return JsonCall(
                 [&]() -> absl::StatusOr<v1::ListCheckpointsResponse> {
                   auto list = c.client.ListCheckpoints(job_id);
                   if (!list.ok()) return list.status();
                   v1::ListCheckpointsResponse response;
                   for (auto& info : *list) {
                     *response.add_checkpoints() = std::move(info);
                   }
                   return response;
                 });
           })
      .def("restore_checkpoint_json",
           [](PyClient& c, const std::string& json) {
             auto request =
                 Parse<v1::RestoreCheckpointRequest>(json, "RestoreCheckpoint");
             return JsonCall([&] {
               return c.client.RestoreCheckpoint(request.job_id(),
                                                 request.step());
             });
           })
      .def(
          "update_membership_json",
          [](PyClient& c, const std::string& json) {
            auto request =
                Parse<v1::UpdateMembershipRequest>(json, "UpdateMembership");
            return JsonCall([&] { return c.client.UpdateMembership(request); });
          })
      .def("list_jobs_json",
           [](PyClient& c) {
             return JsonCall([&]() -> absl::StatusOr<v1::ListJobsResponse> {
               auto jobs = c.client.ListJobs();
               if (!jobs.ok()) return jobs.status();
               v1::ListJobsResponse response;
               for (auto& job : *jobs) *response.add_jobs() = std::move(job);
               return response;
             });
           })
      .def("set_running_stats_json",
           [](PyClient& c, const std::string& json) {
             auto request =
                 Parse<v1::SetRunningStatsRequest>(json, "SetRunningStats");
             return JsonCall([&] { return c.client.SetRunningStats(request); });
           })
      .def(
          "solo_group",
          [](PyClient& c, const std::string& job_id,
             int rank) -> std::unique_ptr<NodeGroup> {
            return c.client.NewNodeGroup(job_id, rank);
          },
          py::arg("job_id"), py::arg("rank"),
          "The NodeGroup of a worker that is its node's only member.");
}

// A precise BN of a job and this rank's moments of each layer's input, pooled
// over its batches by the kernels' Chan merge (MergeMoments, float64).
struct PyPreciseBn {
  std::unique_ptr<PreciseBn> bn;
  std::vector<Moments> pooled;
};

Moments MomentsFrom(int64_t count, const DoubleArray& mean,
                    const DoubleArray& m2) {
  Moments m;
  m.count = count;
  m.mean = ToVector(mean, mean.size(), "mean");
  m.m2 = ToVector(m2, m.mean.size(), "m2");
  return m;
}

void CheckLayer(const PyPreciseBn& p, int layer) {
  if (layer < 0 || layer >= p.bn->num_layers()) {
    throw py::value_error(absl::StrCat("expected a layer in [0, ",
                                       p.bn->num_layers(), "), got ", layer));
  }
}

void AddBatch(PyPreciseBn& p, int layer, int64_t count, const DoubleArray& mean,
              const DoubleArray& m2) {
  CheckLayer(p, layer);
  const Moments batch = MomentsFrom(count, mean, m2);
  ThrowIfError(ValidateMoments(batch, p.bn->channels(layer)));
  ThrowIfError(CheckMergeable(p.pooled[layer], batch));
  MergeMoments(p.pooled[layer], batch);
}

py::tuple MergeLayer(PyPreciseBn& p, int layer) {
  CheckLayer(p, layer);
  absl::StatusOr<RunningStats> stats = absl::UnknownError("not run");
  {
    py::gil_scoped_release release;
    stats = p.bn->Merge(layer, p.pooled[layer]);
  }
  ThrowIfServiceError(stats.status());
  return py::make_tuple(p.bn->population_count(layer),
                        stats->num_batches_tracked, ToArray(stats->mean),
                        ToArray(stats->var));
}

void Released(const std::function<absl::Status()>& call) {
  absl::Status s;
  {
    py::gil_scoped_release release;
    s = call();
  }
  ThrowIfServiceError(s);
}

void BindPreciseBn(py::module_& m) {
  py::class_<PyPreciseBn>(m, "PreciseBn",
                          "One precise BN of a job as one rank "
                          "(client/precise_bn.h).")
      .def(py::init([](PyClient& client, const std::string& job_id, int rank,
                       int64_t serial) {
             absl::StatusOr<std::unique_ptr<PreciseBn>> started =
                 absl::UnknownError("not run");
             {
               py::gil_scoped_release release;
               started = PreciseBn::Start(client.client, job_id, rank, serial);
             }
             ThrowIfServiceError(started.status());
             auto p = std::make_unique<PyPreciseBn>();
             p->bn = *std::move(started);
             for (int l = 0; l < p->bn->num_layers(); ++l) {
               p->pooled.push_back(Moments::Zero(p->bn->channels(l)));
             }
             return p;
           }),
           py::arg("client"), py::arg("job_id"), py::arg("rank"),
           py::arg("serial"), py::keep_alive<1, 2>(),
           "Starts precise BN `serial` of the job as `rank`: creates the "
           "scratch job "
           "of the rank's group. Raises ServiceError.")
      .def("add", &AddBatch, py::arg("layer"), py::arg("count"),
           py::arg("mean"), py::arg("m2"),
           "Folds one batch's moments of the layer's input (count, mean, "
           "m2, as local_moments gives them) into this rank's.")
      .def("merge", &MergeLayer, py::arg("layer"),
           "Merges this rank's moments of the layer with every member of "
           "its group; returns (count, num_batches_tracked, mean, var): the "
           "population count N, mean and unbiased var M2/(N-1) and the "
           "job's num_batches_tracked + 1; N = 0: no member saw the layer, "
           "and its statistics are the job's, unchanged. Raises "
           "ServiceError.")
      .def(
          "commit",
          [](PyPreciseBn& p) { Released([&] { return p.bn->Commit(); }); },
          "Writes the merged statistics to the job (the group's committer), "
          "waits for every member at the barrier and ends the precise BN. "
          "Raises "
          "ServiceError.")
      .def(
          "abort",
          [](PyPreciseBn& p) { Released([&] { return p.bn->Abort(); }); },
          "Ends a failed precise BN: deletes the scratch job.")
      .def_property_readonly(
          "scratch_job_id",
          [](const PyPreciseBn& p) { return p.bn->scratch_job_id(); })
      .def_property_readonly("group",
                             [](const PyPreciseBn& p) { return p.bn->group(); })
      .def_property_readonly(
          "committer", [](const PyPreciseBn& p) { return p.bn->committer(); })
      .def_property_readonly("num_layers", [](const PyPreciseBn& p) {
        return p.bn->num_layers();
      });
}

}  // namespace

void BindClient(py::module_& m) {
  BindNodeGroups(m);
  BindClientClass(m);
  BindPreciseBn(m);
}

}  // namespace syncnorm::python
