// A set of ranks held as runs of consecutive ranks. A membership change of
// a job of 65,536 ranks ("every rank but 0 leaves") is one run, so what it
// costs to keep, copy, store and send is what the change names as runs,
// not the job's width. Immutable and shared: a copy costs a reference.
#ifndef SYNCNORM_WIRE_RANK_SET_H_
#define SYNCNORM_WIRE_RANK_SET_H_

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace syncnorm {

class RankSet {
 public:
  // Ranks first..last, both included.
  struct Run {
    int first = 0;
    int last = 0;
    friend bool operator==(const Run& a, const Run& b) {
      return a.first == b.first && a.last == b.last;
    }
  };

  // A container of ints to generic code (gMock's matchers among them).
  using value_type = int;
  using const_reference = int;
  using reference = int;
  using size_type = int64_t;

  RankSet() = default;
  // REQUIRES: `ranks` ascending and distinct: RankSet{0, 2, 3}.
  RankSet(std::initializer_list<int> ranks)  // NOLINT: a set's literal
      : RankSet(Of(ranks)) {}
  // REQUIRES: `ranks` ascending and distinct.
  static RankSet Of(absl::Span<const int> ranks);
  // Ranks first..last (empty when last < first).
  static RankSet Range(int first, int last);
  // REQUIRES: runs ascending and disjoint, first <= last in each; adjacent
  // runs are merged.
  static RankSet FromRuns(absl::Span<const Run> runs);
  // From runs flattened as (first, last) pairs, as the wire and the store
  // carry them (member_runs and the like), checked: INVALID_ARGUMENT
  // naming what is wrong unless the pairs are whole, ascending and
  // disjoint ranks of 0..world_size-1. Never expands them.
  static absl::StatusOr<RankSet> FromFlatRuns(absl::Span<const int32_t> flat,
                                              int world_size);

  // The runs, ascending, disjoint and never adjacent (each is maximal).
  absl::Span<const Run> runs() const {
    return runs_ ? absl::MakeConstSpan(*runs_) : absl::Span<const Run>();
  }
  // The number of ranks.
  int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // O(log runs).
  bool contains(int rank) const;
  // Every rank, ascending: O(size). For narrow sets and tests.
  std::vector<int> ranks() const;

  // O(runs of both).
  static RankSet Union(const RankSet& a, const RankSet& b);
  static RankSet Difference(const RankSet& a, const RankSet& b);

  friend bool operator==(const RankSet& a, const RankSet& b);
  friend bool operator!=(const RankSet& a, const RankSet& b) {
    return !(a == b);
  }

  // Iterates the ranks, ascending.
  class const_iterator {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = int;
    using difference_type = std::ptrdiff_t;
    using pointer = const int*;
    using reference = int;

    const_iterator() = default;
    int operator*() const { return rank_; }
    const_iterator& operator++() {
      if (rank_ < run_->last) {
        ++rank_;
      } else if (++run_ != end_) {
        rank_ = run_->first;
      }
      return *this;
    }
    const_iterator operator++(int) {
      const_iterator before = *this;
      ++*this;
      return before;
    }
    friend bool operator==(const const_iterator& a, const const_iterator& b) {
      return a.run_ == b.run_ && (a.run_ == a.end_ || a.rank_ == b.rank_);
    }
    friend bool operator!=(const const_iterator& a, const const_iterator& b) {
      return !(a == b);
    }

   private:
    friend class RankSet;
    const_iterator(const Run* run, const Run* end)
        : run_(run), end_(end), rank_(run != end ? run->first : 0) {}
    const Run* run_ = nullptr;
    const Run* end_ = nullptr;
    int rank_ = 0;
  };
  const_iterator begin() const {
    return const_iterator(runs().data(), runs().data() + runs().size());
  }
  const_iterator end() const {
    const Run* end = runs().data() + runs().size();
    return const_iterator(end, end);
  }

 private:
  explicit RankSet(std::vector<Run> runs);

  std::shared_ptr<const std::vector<Run>> runs_;  // null: empty
  int64_t size_ = 0;
};

// Appends `ranks` to a repeated int32 field (or vector) as flattened
// (first, last) pairs.
template <typename Repeated>
void AddFlatRuns(const RankSet& ranks, Repeated* out) {
  for (const RankSet::Run& run : ranks.runs()) {
    out->Add(run.first);
    out->Add(run.last);
  }
}

// `ranks` in RankList's bounded text form (rank_list.h), from its runs.
std::string RankList(const RankSet& ranks);

}  // namespace syncnorm

#endif  // SYNCNORM_WIRE_RANK_SET_H_
