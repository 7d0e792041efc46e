// Bearer tokens: who may call which job. Knows nothing of gRPC beyond the
// text of the `authorization` header.
//
// The tokens file (--tokens_file) has one token per line:
//
//   # comment lines and blank lines are ignored
//   <token> <scope>[,<scope>...]
//
// where a scope is `admin` (every job and the server-wide calls, ListJobs),
// `job:<job_id>` (that job's calls: CreateJob, GetJob, DeleteJob, rounds,
// running statistics, checkpoints) or `relay` (a relay's: it may send
// relay blocks, Contribution.relay, for the jobs its other scopes grant;
// docs/relay.md). A token is 16 to 4096 printable ASCII
// characters without spaces or commas (e.g. `openssl rand -hex 32`); each
// token appears once. Callers send `authorization: Bearer <token>`.
//
// Token values are secrets: no message of this file (errors, logs) ever
// contains one; errors name the line instead.
#ifndef SYNCNORM_SERVER_RPC_AUTH_H_
#define SYNCNORM_SERVER_RPC_AUTH_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/domain/periodic_thread.h"

namespace syncnorm {

// One line of the tokens file.
struct TokenGrant {
  std::string token;
  bool admin = false;
  bool relay = false;
  std::vector<std::string> jobs;  // job ids, sorted
};

// The parsed tokens file. INVALID_ARGUMENT naming the (1-based) line and
// what is wrong with it, never the token.
absl::StatusOr<std::vector<TokenGrant>> ParseTokens(absl::string_view text);

// Compares two strings in time that depends only on their lengths.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// Decides every call against the current tokens. Thread-safe.
class Authenticator {
 public:
  // The default of Open's poll_period, written here only: ServerOptions
  // names it.
  static constexpr absl::Duration kDefaultPollPeriod = absl::Seconds(1);

  // Reads and parses `path`; its error (naming the file) when it cannot be
  // read or parsed. With a positive `poll_period`, a thread re-reads the
  // file that often and swaps in the new tokens when its content changed;
  // a file that became unreadable or unparsable keeps the previous tokens
  // and logs why (on stderr, without token values).
  static absl::StatusOr<std::unique_ptr<Authenticator>> Open(
      std::string path, absl::Duration poll_period = kDefaultPollPeriod);
  // Tokens from memory, no file and no reloads (for tests).
  explicit Authenticator(std::vector<TokenGrant> grants);
  // Stops the reload thread.
  ~Authenticator();

  Authenticator(const Authenticator&) = delete;
  Authenticator& operator=(const Authenticator&) = delete;

  // Does `header` hold a token in force, whatever its scopes? OK, or
  // UNAUTHENTICATED as AuthorizeJob says it.
  absl::Status Authenticate(absl::string_view header) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // May the caller whose `authorization` header is `header` use job
  // `job_id`? OK, UNAUTHENTICATED (no header, not "Bearer <token>", unknown
  // token) or PERMISSION_DENIED (the token's scopes do not include the job
  // or admin).
  absl::Status AuthorizeJob(absl::string_view header,
                            absl::string_view job_id) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // May it send a relay block for job `job_id`? As AuthorizeJob, and the
  // token needs the relay or admin scope too (PERMISSION_DENIED).
  absl::Status AuthorizeRelay(absl::string_view header,
                              absl::string_view job_id) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // The same for server-wide calls, which need the admin scope.
  absl::Status AuthorizeAdmin(absl::string_view header) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Re-reads the file now (what the reload thread does). The file's error
  // when it cannot be read or parsed; the previous tokens stay then.
  absl::Status Reload() ABSL_LOCKS_EXCLUDED(mu_);

  // The number of tokens in force.
  int size() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  using Grants = std::vector<TokenGrant>;

  Authenticator(std::string path, std::string content,
                std::shared_ptr<const Grants> grants);

  // The grant of the header's token; UNAUTHENTICATED if none.
  absl::StatusOr<const TokenGrant*> Find(absl::string_view header,
                                         const Grants& grants) const;
  std::shared_ptr<const Grants> Current() const ABSL_LOCKS_EXCLUDED(mu_);
  // Reload(), logging a failure unless it is `last_error` (the previous
  // poll's, which it then becomes): a problem is said once, not every
  // period. Only the poller calls it.
  void Poll(std::string& last_error) ABSL_LOCKS_EXCLUDED(mu_);

  const std::string path_;  // empty: tokens from memory

  mutable absl::Mutex mu_;
  std::shared_ptr<const Grants> grants_ ABSL_GUARDED_BY(mu_);
  std::string content_ ABSL_GUARDED_BY(mu_);  // of the file, as last loaded
  // Calls Poll(); null without a file or a poll period. Last: stopped
  // before anything it uses goes.
  std::unique_ptr<PeriodicThread> poller_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_RPC_AUTH_H_
