#include "server/domain/merge_tree.h"

#include <algorithm>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"

namespace syncnorm {

namespace {

int LeastPowerOfTwoAtLeast(size_t n) {
  int p = 1;
  while (static_cast<size_t>(p) < n) p *= 2;
  return p;
}

}  // namespace

// Invariant: a node whose subtree is closed (open == 0) with payloads on
// both sides is merged (holds its value) until its parent is; every other
// interior node holds none.

MergeTree::MergeTree(absl::Span<const int> ranks)
    : ranks_(ranks),
      leaves_(LeastPowerOfTwoAtLeast(ranks.size())),
      nodes_(2 * static_cast<size_t>(leaves_)) {
  for (size_t i = 0; i < ranks_.size(); ++i) nodes_[leaves_ + i].open = 1;
  for (int u = leaves_ - 1; u >= 1; --u) {
    nodes_[u].open = nodes_[2 * u].open + nodes_[2 * u + 1].open;
  }
}

const Payload* MergeTree::Leaf(int i) const {
  const std::optional<Payload>& v = nodes_[leaves_ + i].value;
  return v.has_value() ? &*v : nullptr;
}

void MergeTree::Add(int i, Payload payload) {
  const int leaf = leaves_ + i;
  nodes_[leaf].value = std::move(payload);
  for (int u = leaf; u >= 1; u /= 2) {
    --nodes_[u].open;
    ++nodes_[u].present;
  }
  // Up to the first subtree that still waits for someone.
  for (int u = leaf / 2; u >= 1 && nodes_[u].open == 0; u /= 2) {
    if (BothPresent(u)) Merge(u);
  }
}

void MergeTree::Clear(int node) {
  if (IsLeaf(node)) return;
  for (int child : {2 * node, 2 * node + 1}) {
    Clear(child);
    Node& n = nodes_[child];
    n.value.reset();
    n.open = 0;
    n.present = 0;
    if (n.block) blocks_.erase(child);
    n.block = false;
    overflow_.erase(child);
  }
}

void MergeTree::RecountAbove(int node) {
  for (int u = node / 2; u >= 1; u /= 2) {
    nodes_[u].open = nodes_[2 * u].open + nodes_[2 * u + 1].open;
    nodes_[u].present = nodes_[2 * u].present + nodes_[2 * u + 1].present;
  }
}

void MergeTree::AddBlock(int first, int positions, int merged, int first_rank,
                         Payload payload) {
  // A block wider than the tree is the whole tree (first is then 0).
  const int node = BlockNode(first, std::min(positions, leaves_));
  Clear(node);
  overflow_.erase(node);
  Node& n = nodes_[node];
  n.value = std::move(payload);
  n.open = 0;
  n.present = merged;
  n.block = true;
  blocks_[node] = first_rank;
  RecountAbove(node);
  for (int u = node / 2; u >= 1 && nodes_[u].open == 0; u /= 2) {
    if (BothPresent(u)) Merge(u);
  }
}

void MergeTree::RemoveBlock(int first, int positions) {
  const int node = BlockNode(first, std::min(positions, leaves_));
  Node& n = nodes_[node];
  n.value.reset();
  n.block = false;
  blocks_.erase(node);
}

void MergeTree::Reset(absl::FunctionRef<bool(int)> may_send) {
  // The positions under a block (above a leaf) stay closed and empty.
  std::vector<bool> covered;
  for (const auto& [node, rank] : blocks_) {
    if (IsLeaf(node)) continue;
    if (covered.empty()) covered.resize(leaves_);
    int lo = node;
    int hi = node;
    while (!IsLeaf(lo)) {
      lo = 2 * lo;
      hi = 2 * hi + 1;
    }
    for (int leaf = lo; leaf <= hi; ++leaf) covered[leaf - leaves_] = true;
  }
  for (size_t i = 0; i < ranks_.size(); ++i) {
    Node& leaf = nodes_[leaves_ + i];
    if (!covered.empty() && covered[i]) {
      leaf.value.reset();
      leaf.present = 0;
      leaf.open = 0;
      continue;
    }
    const bool may = may_send(static_cast<int>(i));
    if (!may) leaf.value.reset();
    leaf.present = leaf.value.has_value() ? 1 : 0;
    leaf.open = may && !leaf.value.has_value() ? 1 : 0;
  }
  overflow_.clear();
  // Children before parents, so that a merge finds its children's holders.
  for (int u = leaves_ - 1; u >= 1; --u) {
    Node& n = nodes_[u];
    if (n.block) continue;  // kept as sent, closed, its count as merged
    n.value.reset();
    n.open = nodes_[2 * u].open + nodes_[2 * u + 1].open;
    n.present = nodes_[2 * u].present + nodes_[2 * u + 1].present;
    if (n.open == 0 && BothPresent(u)) Merge(u);
  }
}

int MergeTree::Holder(int node) const {
  while (!IsLeaf(node) && !nodes_[node].value.has_value()) {
    node = nodes_[2 * node].present > 0 ? 2 * node : 2 * node + 1;
  }
  return node;
}

int MergeTree::FirstRank(int node) const {
  while (!IsLeaf(node)) {
    if (nodes_[node].block) return blocks_.at(node);
    node = nodes_[2 * node].present > 0 ? 2 * node : 2 * node + 1;
  }
  return ranks_[node - leaves_];
}

void MergeTree::Merge(int node) {
  const int a = Holder(2 * node);
  const int b = Holder(2 * node + 1);
  std::optional<Payload>& value = nodes_[node].value;
  // A leaf or block stays as sent; a merged child's value moves up.
  value = Kept(a) ? *nodes_[a].value : *std::move(nodes_[a].value);
  if (!Kept(a)) nodes_[a].value.reset();
  // A count overflow below wins over this node's own, the left one first.
  absl::Status error;
  for (int child : {a, b}) {
    auto it = overflow_.find(child);
    if (it == overflow_.end()) continue;
    if (error.ok()) error = std::move(it->second);
    overflow_.erase(it);
  }
  const Payload& right = *nodes_[b].value;
  if (!error.ok()) {
    // Nothing to fold: the result is refused anyway.
  } else if (Moments* m = std::get_if<Moments>(&*value)) {
    const Moments& mb = std::get<Moments>(right);
    if (absl::Status s = CheckMergeable(*m, mb); !s.ok()) {
      error = absl::InvalidArgumentError(
          absl::StrCat("rank ", FirstRank(2 * node + 1),
                       "'s count does not fit: ", s.message()));
    } else {
      MergeMoments(*m, mb);
    }
  } else {
    AddGradSums(std::get<GradSums>(*value), std::get<GradSums>(right));
  }
  if (!Kept(b)) nodes_[b].value.reset();
  if (!error.ok()) overflow_.emplace(node, std::move(error));
}

void MergeTree::MergeOpen(int node) {
  const Node& n = nodes_[node];
  // A closed subtree was merged when it closed.
  if (IsLeaf(node) || n.present == 0 || n.open == 0) return;
  MergeOpen(2 * node);
  MergeOpen(2 * node + 1);
  if (BothPresent(node)) Merge(node);
}

Payload MergeTree::TakeResult(int holder) {
  Payload result;
  if (Kept(holder)) {
    result = *nodes_[holder].value;
  } else {
    result.swap(*nodes_[holder].value);
    nodes_[holder].value.reset();
  }
  return result;
}

absl::StatusOr<Moments> MergeTree::MergedMoments(int channels) {
  if (nodes_[1].present == 0) return Moments::Zero(channels);
  MergeOpen(1);
  const int holder = Holder(1);
  if (auto it = overflow_.find(holder); it != overflow_.end()) {
    return it->second;
  }
  return std::get<Moments>(TakeResult(holder));
}

GradSums MergeTree::SummedGradSums(int channels) {
  if (nodes_[1].present == 0) {
    GradSums zero;
    zero.sum_dy.assign(channels, 0.0);
    zero.sum_dy_xmu.assign(channels, 0.0);
    return zero;
  }
  MergeOpen(1);
  return std::get<GradSums>(TakeResult(Holder(1)));
}

void MergeTree::TakeMoments(std::vector<int>& ranks,
                            std::vector<Moments>& moments) {
  ranks.reserve(nodes_[1].present);
  moments.reserve(nodes_[1].present);
  for (size_t i = 0; i < ranks_.size(); ++i) {
    std::optional<Payload>& leaf = nodes_[leaves_ + i].value;
    if (!leaf.has_value()) continue;
    ranks.push_back(ranks_[i]);
    moments.push_back(std::get<Moments>(std::move(*leaf)));
  }
}

}  // namespace syncnorm
