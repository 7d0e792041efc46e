// syncnormctl's membership commands (an elastic job): members, join, leave,
// remove.
#ifndef SYNCNORM_CLIENT_CTL_MEMBERSHIP_COMMANDS_H_
#define SYNCNORM_CLIENT_CTL_MEMBERSHIP_COMMANDS_H_

#include <ostream>

#include "absl/status/status.h"
#include "client/client.h"
#include "client/ctl/args.h"

namespace syncnorm::ctl {

// members JOB: the job's members, version and next step, and the changes
// it keeps, oldest first.
absl::Status MembersCommand(Client& client, const Args& args,
                            std::ostream& out);

// join|leave|remove JOB RANK... [--step N]: one membership change from
// step N (default: the job's next step); prints the new members.
absl::Status ChangeMembersCommand(Client& client, const Args& args,
                                  std::ostream& out);

}  // namespace syncnorm::ctl

#endif  // SYNCNORM_CLIENT_CTL_MEMBERSHIP_COMMANDS_H_
