// A KvEngine in front of another (RocksDB) that takes each write off the
// answer path: a write is durable once it is one record in a preallocated
// log file reused as a ring, and the engine behind gets the writes later,
// many at once, coalesced by key.
#ifndef SYNCNORM_SERVER_STORE_RING_LOG_ENGINE_H_
#define SYNCNORM_SERVER_STORE_RING_LOG_ENGINE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/store/kv_engine.h"

namespace syncnorm {

// The ring's file in a data_dir, beside RocksDB's.
inline constexpr char kRoundLogFile[] = "syncnorm-round-log";

// What Open does with a ring whose records past the position the engine
// behind holds are damaged (RocksDB's WALRecoveryMode, by another name).
enum class RingLogRecovery {
  // A torn last record (a kill or a machine crash in the middle of a write:
  // never acknowledged) is dropped; any other damage, a record that fails
  // with valid newer records after it, or a file shorter than it was made,
  // fails Open with DATA_LOSS and changes nothing. The default.
  kTolerateTornTail,
  // Replays up to the first record that fails and drops the rest, newer
  // valid records included (reported by RingLogEngine::damage()). The
  // operator's choice to accept a loss that kTolerateTornTail refused.
  kPointInTime,
};

// Where a ring was damaged, as Open found it.
struct RingLogDamage {
  // The file offset and sequence number of the first record the replay
  // could not read.
  int64_t offset = 0;
  uint64_t seq = 0;
  // Valid records after it, newer than it: acknowledged writes that a
  // replay stopping there drops.
  int64_t records_after = 0;
  // The file's size, and the size it was made (0: not recorded, or the
  // ring held nothing past the engine behind's position when it closed).
  // A file shorter than it was made lost records past its end, how many
  // cannot be told.
  int64_t file_bytes = 0;
  int64_t made_bytes = 0;

  bool truncated() const { return made_bytes > 0 && file_bytes < made_bytes; }
  // One sentence naming the damage and what it loses.
  std::string Describe(const std::string& path) const;
};

struct RingLogOptions {
  // The log file's size, allocated when it is created, and mapped into
  // memory whole. A write of more than a quarter of it goes straight to
  // the engine behind.
  int64_t ring_bytes = 32 << 20;
  // The engine behind gets what the log holds once this much (or half a
  // lap, if less) is waiting, or `flush_period` after the first write since
  // the last time. A flush is a RocksDB write of every key written since
  // the last (its WAL, its memtable, and in time its table files): done
  // rarely, it costs little per round and stalls few of them (a flush
  // every 2 MiB, 63 rounds of 64 KB, stalled more than 1% of the rounds:
  // it set the p99).
  int64_t flush_bytes = 16 << 20;
  absl::Duration flush_period = absl::Seconds(1);
  // The least of the ring a lap goes through before it wraps (see
  // RingLogEngine: a lap spans four times what the ring holds, rounded up
  // to a power of two, between this and ring_bytes).
  int64_t min_lap_bytes = 8 << 20;
  // msync each record before the write returns (a machine crash then
  // loses nothing written), as RocksDB's sync_writes.
  bool sync_writes = false;
  // What Open does with a damaged ring. Default kTolerateTornTail.
  RingLogRecovery recovery = RingLogRecovery::kTolerateTornTail;
};

// Write appends the batch as one record (sequence number, length, CRC32C)
// to the ring at `path`, which is allocated whole on disk and mapped whole
// into memory: the record is copied into pages that are already allocated
// and cached, with no system call, a few microseconds where a RocksDB write
// takes tens. The write is then as durable as a RocksDB write without sync:
// the record is in the kernel's page cache, which a killed process does not
// lose (with sync_writes, msynced to the device too). The batch also goes
// into an overlay (the latest value or deletion of each key written since
// the last flush, a view of the value's bytes in the ring), which Get reads
// first.
//
// A lap of the ring need not span all of it. Each time the writes wrap,
// the next lap's length is set to four times the bytes the overlay holds
// (what the ring must keep: carried records, and the latest value of each
// key), rounded up to a power of two, at least min_lap_bytes and at most
// ring_bytes; a lap that ends before the file does is padded to the file's
// end, as a record that does not fit is. A server whose rounds keep a few
// MiB then writes over the same few MiB of memory, which stays in the
// CPU's caches and TLB, instead of streaming through the whole file (on
// the 2-core VM, copying a 64 KB record into the ring took 6 us on average
// in 8 MiB, 16 us in 32 MiB and 44 us in 64 MiB: bench/RESULTS.md). When
// a lap would end but what the ring holds wants a longer one, the lap
// goes on instead. The flusher's byte trigger counts records, not the
// padding; a flush carries the transient puts that the writes will not
// reach for half a lap.
//
// A flusher thread writes the overlay to the engine behind as one batch,
// together with the log position it covers (the key kMetaKey), and then
// frees that part of the ring. A key written many times between flushes
// (a layer's state every round) costs the engine one write. A transient
// put (KvBatch::PutTransient: a round record, deleted a window later)
// whose record lies in the newest half of the ring is not flushed but
// carried over to the next flush, its record kept in the ring (the
// position recorded with the flush is then that of the oldest carried
// record, and a replay starts there): deleted before it grows old, it
// costs the engine nothing, not even the deletion (the key of a transient
// put is one the engine does not hold), unless a delete of the key was
// still on its way to the engine when the put came. When the ring is full, a
// write flushes first, itself; if the engine behind refuses (a full disk),
// that write fails with the engine's error and nothing of it is applied, so
// a full disk stops rounds once the ring is full, and loses nothing.
//
// Open replays the records past the position the engine behind last
// recorded, in order, stopping at the first that is not the next sequence
// number or whose checksum fails, and writes them to it before anything
// else happens. Where it stops, the rest of the file is searched for valid
// records newer than the last replayed: a record torn by a kill (never
// acknowledged) is the last one written, so there are none; if there are,
// or the file is shorter than it was made (the engine behind records the
// size with the position), the ring is damaged, and options.recovery says
// what Open does. Whatever it replays, the sequence numbers written next
// start past every valid record the file holds, so a record a replay once
// dropped can never chain onto later writes and come back.
//
// Batches with a DeleteRange, Scan and CopyTo flush first and go to the
// engine behind directly, in order with the logged writes. The destructor
// flushes, so a stopped server leaves nothing in the ring. Thread-safe.
class RingLogEngine final : public KvEngine {
 public:
  // The engine behind's key that holds the log position it has applied.
  static constexpr char kMetaKey[] = "m/ring-log";

  // Opens (creating or resizing it if needed) the ring at `path` and
  // recovers what it holds into `inner`. UNAVAILABLE naming `path` when it
  // cannot be created, read or written; the inner engine's error when the
  // recovered records cannot be written to it.
  static absl::StatusOr<std::unique_ptr<RingLogEngine>> Open(
      const std::string& path, std::unique_ptr<KvEngine> inner,
      RingLogOptions options = {});

  // Flushes what the ring holds, then closes.
  ~RingLogEngine() override;

  std::string Describe() const override;
  absl::Status Write(const KvBatch& batch) override;
  absl::StatusOr<std::optional<std::string>> Get(
      absl::string_view key) override;
  absl::Status Scan(
      absl::string_view prefix,
      const std::function<absl::Status(absl::string_view, absl::string_view)>&
          visit) override;
  absl::Status CopyTo(const std::string& dir) override;

  // Writes what the ring holds to the engine behind now, transient puts
  // included.
  absl::Status Flush() ABSL_LOCKS_EXCLUDED(flush_mu_, mu_);

  // The records Open replayed (tests, and the startup log line).
  int64_t recovered_records() const { return recovered_records_; }
  // With RingLogRecovery::kPointInTime, the damage Open accepted, if any.
  const std::optional<RingLogDamage>& damage() const { return damage_; }
  // Where Open found a torn last record (dropped), if it did.
  const std::optional<RingLogDamage>& torn_tail() const { return torn_tail_; }

  // Bytes of transient puts' values since Open: written to the log, and
  // of those, written on to the engine behind because the ring needed the
  // room before a later write deleted them (a flush by bytes, by time or
  // of a full ring, or a write through). A share of more than a few
  // percent says the ring is too small for what it is asked to keep. An
  // explicit Flush (Scan, CopyTo, closing) is not counted.
  struct TransientBytes {
    int64_t logged = 0;
    int64_t spilled = 0;
  };
  TransientBytes transient_bytes() const ABSL_LOCKS_EXCLUDED(mu_);

  // Tests: returns once no flush is due and none is running, so that the
  // flusher stays idle until the next write.
  void WaitForFlusherForTest() ABSL_LOCKS_EXCLUDED(flush_mu_, mu_);

  // Tests: stops the flusher and closes the file without flushing, as a
  // kill -9 would leave things. Nothing may be called afterwards but the
  // destructor, which then does nothing more.
  void AbandonForTest() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // The latest write of a key since the last flush.
  struct Entry {
    // A view of where the value lies in the ring; nullopt: deleted.
    std::optional<absl::string_view> value;
    // Position and sequence number of the record that wrote it.
    int64_t position = 0;
    uint64_t seq = 0;
    bool transient = false;  // a transient put
    // A transient put of a key the engine behind does not hold: its put
    // made the entry (no earlier write of the key was pending here), or
    // followed another such put. A delete then has nothing to delete there.
    bool forgettable = false;
  };
  using Overlay = absl::flat_hash_map<std::string, Entry>;

  RingLogEngine(std::string path, int fd, std::unique_ptr<KvEngine> inner,
                RingLogOptions options);

  // Replays the ring into the engine behind; sets the write position.
  // DATA_LOSS, changing nothing, for damage options_.recovery refuses.
  absl::Status Recover(int64_t file_bytes);
  // Records the engine behind holds the log up to: a replay starts at
  // `position`, after record `last_seq`, in a ring made `made_bytes` long
  // (0: nothing past `position` is needed, after a clean close).
  static std::string EncodeMeta(uint64_t last_seq, int64_t position,
                                int64_t made_bytes);
  // With `carry`, transient puts in the newest half of the ring stay in
  // the overlay (and their records in the ring) instead.
  // `for_room`: the flush makes room in the ring (its transient puts count
  // as spilled), rather than being asked for.
  absl::Status FlushLocked(bool carry, bool for_room)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(flush_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Flush(bool carry, bool for_room)
      ABSL_LOCKS_EXCLUDED(flush_mu_, mu_);
  // Flushes, then writes `batch` to the engine behind, holding every writer
  // off so that it lands in order.
  absl::Status WriteThrough(const KvBatch& batch)
      ABSL_LOCKS_EXCLUDED(flush_mu_, mu_);
  // The writes of `entries` and, with them, the log position the engine
  // behind then holds: a replay starts at `position`, after record
  // `last_seq`.
  KvBatch WithPosition(absl::Span<const Overlay::value_type* const> entries,
                       uint64_t last_seq, int64_t position) const;
  absl::Status PwriteAll(const char* data, size_t size, int64_t offset) const;
  // With sync_writes, msync the ring's bytes [offset, offset + size).
  absl::Status Sync(int64_t offset, int64_t size) const;
  absl::Status Error(absl::string_view what, int err) const;
  void FlusherLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // Whether the flusher should flush now, by bytes (its period aside).
  bool FlushDueLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The length of the lap that starts now, from what the overlay holds.
  int64_t NextLapLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records `value` (nullopt: deleted) as `e`'s, keeping overlay_bytes_.
  void SetValueLocked(Entry& e, std::optional<absl::string_view> value)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the flush under way (if any) holds `key`.
  bool FlushHoldsLocked(absl::string_view key) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const int fd_;
  const std::unique_ptr<KvEngine> inner_;
  const RingLogOptions options_;
  // The ring file, mapped shared (set by Open once recovered).
  char* map_ = nullptr;
  int64_t recovered_records_ = 0;           // set by Open only
  std::optional<RingLogDamage> damage_;     // set by Open only
  std::optional<RingLogDamage> torn_tail_;  // set by Open only

  // Held for a whole flush (and a write-through): one at a time, and in
  // the order of the log. Taken before mu_.
  absl::Mutex flush_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  absl::CondVar flush_wanted_;
  // Log positions are byte counts since the ring's creation (the file
  // offset is the position modulo ring_bytes). Records from tail_ to head_
  // may not all be in the engine behind yet; head_ - tail_ <= ring_bytes.
  // flushed_to_: head_ when the last flush began (the flusher's trigger
  // counts from there; carried records keep tail_ behind it).
  int64_t head_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t tail_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t flushed_to_ ABSL_GUARDED_BY(mu_) = 0;
  // The lap in use: its writes wrap at this offset (<= ring_bytes).
  int64_t lap_ ABSL_GUARDED_BY(mu_) = 0;
  // Bytes written as records (and as the padding at the file's end, but
  // not at a lap's end shorter than the file): what the flusher's byte
  // trigger counts. written_at_flush_: written_ when the last flush began.
  int64_t written_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t written_at_flush_ ABSL_GUARDED_BY(mu_) = 0;
  // The bytes of the values overlay_ holds.
  int64_t overlay_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  TransientBytes transient_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  // Every key written since the last flush; `flushing_` what the flush in
  // progress writes (read by Get too).
  Overlay overlay_ ABSL_GUARDED_BY(mu_);
  Overlay flushing_ ABSL_GUARDED_BY(mu_);
  absl::Time first_unflushed_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  // After a failed flush, the next try waits a period.
  absl::Time retry_after_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool abandoned_ ABSL_GUARDED_BY(mu_) = false;
  std::thread flusher_;
};

}  // namespace syncnorm

#endif  // SYNCNORM_SERVER_STORE_RING_LOG_ENGINE_H_
