// The statistics-health scores a relay sends with a block
// (RelayBlock.health, docs/relay.md "Statistics health"), checked as the
// hostile input they may be before StatsHealth tracks them.
#ifndef SYNCNORM_SERVER_DOMAIN_RELAYED_HEALTH_H_
#define SYNCNORM_SERVER_DOMAIN_RELAYED_HEALTH_H_

#include "absl/status/status.h"
#include "server/domain/contribution.h"

namespace syncnorm {

// Entries a block may carry per rank it merged: the scored rounds a relay
// keeps for a block while its rounds go through unmerged.
inline constexpr int kMaxRelayedHealthPerRank = 4;

// OK when every entry of `c.block->health` names one of the block's ranks,
// a step before c.step (a BACKWARD's own step too: its forward is scored),
// a count >= 1 and a stuck channel below `channels`; each (rank, step) once
// and at most kMaxRelayedHealthPerRank per rank of the block. Otherwise
// INVALID_ARGUMENT naming the entry and what is wrong. REQUIRES:
// c.block set, its ranks ascending.
absl::Status CheckRelayedHealth(const Contribution& c, int channels);

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_DOMAIN_RELAYED_HEALTH_H_
