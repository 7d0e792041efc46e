// syncnormctl's backup commands: backup, backups, restore-backup.
#ifndef SYNCNORM_CLIENT_CTL_BACKUP_COMMANDS_H_
#define SYNCNORM_CLIENT_CTL_BACKUP_COMMANDS_H_

#include <ostream>

#include "absl/status/status.h"
#include "client/client.h"
#include "client/ctl/args.h"

namespace syncnorm::ctl {

// backup [NAME] [--job JOB]: writes the backup on every shard.
absl::Status BackupCommand(Client& client, const Args& args, std::ostream& out);

// backups: the backups, merged over the shards.
absl::Status ListBackupsCommand(Client& client, const Args& args,
                                std::ostream& out);

// restore-backup NAME [JOB] [--replace]: loads the backup's jobs into every
// shard, then reports each job as GetJob sees it.
absl::Status RestoreBackupCommand(Client& client, const Args& args,
                                  std::ostream& out);

}  // namespace syncnorm::ctl

#endif  // SYNCNORM_CLIENT_CTL_BACKUP_COMMANDS_H_
