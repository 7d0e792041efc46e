#include "server/domain/group_layout.h"

namespace syncnorm {

GroupLayout::GroupLayout(const JobSpec& spec) : spec_(spec) {
  if (spec.groups.empty()) return;
  group_of_.resize(spec.world_size);
  index_in_group_.resize(spec.world_size);
  for (size_t g = 0; g < spec.groups.size(); ++g) {
    for (size_t i = 0; i < spec.groups[g].size(); ++i) {
      group_of_[spec.groups[g][i]] = static_cast<int>(g);
      index_in_group_[spec.groups[g][i]] = static_cast<int>(i);
    }
  }
}

int GroupLayout::GroupOf(int rank) const {
  if (!group_of_.empty()) return group_of_[rank];
  return spec_.group_size > 0 ? rank / spec_.group_size : 0;
}

int GroupLayout::IndexInGroup(int rank) const {
  if (!index_in_group_.empty()) return index_in_group_[rank];
  return spec_.group_size > 0 ? rank % spec_.group_size : rank;
}

}  // namespace syncnorm
