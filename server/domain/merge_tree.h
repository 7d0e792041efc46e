// The fixed-order merge of one round's payloads, done as they arrive.
#ifndef SYNCNORM_SERVER_DOMAIN_MERGE_TREE_H_
#define SYNCNORM_SERVER_DOMAIN_MERGE_TREE_H_

#include <map>
#include <optional>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/moments.h"
#include "server/domain/contribution.h"

namespace syncnorm {

// Holds a round's payloads, one per position of its group, and merges them
// in one fixed order. Not thread-safe: its round's owner guards it.
//
// The order (docs/semantics.md, "Merge order"): a perfect binary tree over
// positions 0..P-1, P the least power of two >= the group's size. Each
// node is its left subtree's result with its right subtree's folded in
// (MergeMoments for FORWARD, AddGradSums for BACKWARD); a subtree with no
// payload is skipped, so a node with one such child is its other child.
// The result depends only on which positions sent what, never on the order
// they arrived in. An aligned block of 2^k positions is a subtree: merged
// apart (by a relay, say), it gives the same bits.
//
// Work: a subtree is merged as soon as nothing more can arrive in it, so
// the payload that completes a round merges the log2(P) nodes above it,
// O(C log W) at the last arrival; a round completed with positions missing
// (quorum) merges the nodes above those at its end.
//
// Memory: each payload as sent (a leaf or a relay's block) is kept until
// the round ends: statistics health scores each rank, and a membership
// change may take one out. A merged node lives only until its parent is merged;
// at most P/2 live at a time (each has a sibling still open). Besides the
// payloads, 2P nodes of bookkeeping (sizeof(Node), about 80 bytes).
class MergeTree {
 public:
  // A tree over the positions of `ranks` (the group's global ranks, by
  // position, used in messages), every one expected to send.
  // REQUIRES: `ranks` not empty, outliving the tree.
  explicit MergeTree(absl::Span<const int> ranks);

  MergeTree(const MergeTree&) = delete;
  MergeTree& operator=(const MergeTree&) = delete;

  // The payload position `i` sent; null if none.
  const Payload* Leaf(int i) const;

  // Keeps position `i`'s payload and merges every subtree it closes.
  // REQUIRES: i may send (see Reset) and has no payload yet; every payload
  // of the tree is of one kind and width.
  void Add(int i, Payload payload);

  // Takes a relay's merge of the aligned block [first, first + positions)
  // (RelayBlock) at the block's subtree node, as if its `merged` positions
  // had sent, `first_rank` the first of them (named by an overflow error):
  // the subtree closes, and whatever it held (leaves of ranks that also
  // sent directly, merged nodes) is dropped, for the block merged the same
  // payloads in the same order. Kept like a leaf until the round ends.
  // REQUIRES: positions a power of two, first a multiple of it, first <
  // the group's size; merged > 0; a payload of the tree's kind and width;
  // no block at or above the node, nor a closed ancestor.
  void AddBlock(int first, int positions, int merged, int first_rank,
                Payload payload);
  // Drops the block at [first, first + positions): its positions are
  // empty, and reopen (as may_send says) at the next Reset, which the
  // caller calls next. REQUIRES: a block is there.
  void RemoveBlock(int first, int positions);

  // After a membership change: a position that may no longer send
  // (`may_send(i)` false) loses its payload and closes, one that may again
  // opens; every merged node is merged again from the leaves and blocks
  // (O(W C), on a membership change only). A position under a block stays
  // closed: the caller removes a block whose members changed.
  void Reset(absl::FunctionRef<bool(int)> may_send);

  // The fold of every payload present (Moments::Zero when none);
  // INVALID_ARGUMENT naming a rank whose count sums past INT64_MAX with
  // those before it in the tree's order. Merges what is still open, so it
  // is called once, when the round ends. REQUIRES: FORWARD payloads of
  // `channels` channels.
  absl::StatusOr<Moments> MergedMoments(int channels);
  // The sum of every gradient-sum payload present, as MergedMoments.
  // REQUIRES: BACKWARD payloads of `channels` channels.
  GradSums SummedGradSums(int channels);

  // Moves out the payloads as sent, by position: FORWARD moments with
  // their ranks. REQUIRES: the round is finished; nothing reads a leaf
  // afterwards.
  void TakeMoments(std::vector<int>& ranks, std::vector<Moments>& moments);

 private:
  struct Node {
    // A leaf: its payload. Otherwise the merge of its subtree, while its
    // parent is not merged yet; empty when skipped (one child present)
    // or not merged yet.
    std::optional<Payload> value;
    int open = 0;        // positions below that may still send
    int present = 0;     // positions below with a payload
    bool block = false;  // holds a relay's block (AddBlock): kept as sent
  };

  bool IsLeaf(int node) const { return node >= leaves_; }
  // A node whose value is kept as sent until the round ends (copied up,
  // never moved): a leaf or a block.
  bool Kept(int node) const { return IsLeaf(node) || nodes_[node].block; }
  // The node of the aligned block [first, first + positions).
  int BlockNode(int first, int positions) const {
    return (leaves_ + first) / positions;
  }
  // Empties every node strictly below `node` (values, counts, overflows).
  void Clear(int node);
  // Recounts open and present from `node`'s parent up to the root.
  void RecountAbove(int node);
  // Both children of interior `node` have payloads below them: merging it
  // folds two results (otherwise it is its one child's, or nothing).
  bool BothPresent(int node) const {
    return nodes_[2 * node].present > 0 && nodes_[2 * node + 1].present > 0;
  }
  // The node that holds subtree `node`'s result: itself, or the one child
  // with payloads below, down to a merged node or a leaf.
  // REQUIRES: present > 0 below `node`, and its open subtrees merged.
  int Holder(int node) const;
  // Merges `node` from its children's holders. REQUIRES: both present.
  void Merge(int node);
  // Merges every node below `node` that is not yet, and it (the end of
  // a round with positions missing).
  void MergeOpen(int node);
  // What `holder` holds, moved out of the tree (a leaf's is copied).
  Payload TakeResult(int holder);
  // The global rank of the first position with a payload below `node`.
  int FirstRank(int node) const;

  const absl::Span<const int> ranks_;
  const int leaves_;         // P: node leaves_ + i is position i's leaf
  std::vector<Node> nodes_;  // 1-based heap order; nodes_[0] unused
  // Nodes whose merge overflowed a count, with why (an error names its
  // rank; the first error in the tree's order wins): empty in practice.
  std::map<int, absl::Status> overflow_;
  // The block nodes, with their first merged rank.
  std::map<int, int> blocks_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_DOMAIN_MERGE_TREE_H_
