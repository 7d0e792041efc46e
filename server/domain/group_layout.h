// Which group each rank of a job belongs to, and its place in it.
#ifndef SYNCNORM_SERVER_DOMAIN_GROUP_LAYOUT_H_
#define SYNCNORM_SERVER_DOMAIN_GROUP_LAYOUT_H_

#include <vector>

#include "server/domain/job_spec.h"

namespace syncnorm {

// The groups of a resolved JobSpec, for the lookups of every contribution:
// arithmetic for consecutive blocks (group_size), tables of world_size
// entries for explicit rank lists (groups). Immutable; thread-safe.
class GroupLayout {
 public:
  // REQUIRES: `spec` resolved; it must outlive the layout.
  explicit GroupLayout(const JobSpec& spec);

  int num_groups() const { return spec_.num_groups(); }
  // The group of `rank`. REQUIRES: 0 <= rank < world_size.
  int GroupOf(int rank) const;
  // The position of `rank` in its group's ascending rank list.
  // REQUIRES: 0 <= rank < world_size.
  int IndexInGroup(int rank) const;
  // The ranks of group `g`, ascending. REQUIRES: 0 <= g < num_groups().
  std::vector<int> Ranks(int g) const { return GroupRanks(spec_, g); }

 private:
  const JobSpec& spec_;
  // Explicit groups only (empty otherwise), indexed by rank.
  std::vector<int> group_of_;
  std::vector<int> index_in_group_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_DOMAIN_GROUP_LAYOUT_H_
