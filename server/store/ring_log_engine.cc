#include "server/store/ring_log_engine.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/internal/endian.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/store/crc32c.h"

namespace syncnorm {
namespace {

// A record: a 24-byte header, then the payload, padded to 8 bytes.
//   u32 magic, u32 kind, u64 seq, u32 payload length,
//   u32 CRC32C of the payload followed by the header's first 20 bytes.
// A pad record (kind 2) fills the end of the ring when the next record does
// not fit there; it has no payload of its own and carries the sequence
// number of the record that follows it. Less than a header's room at the
// end is skipped without one. All little-endian.
constexpr uint32_t kMagic = 0x4c52534e;  // "NSRL"
constexpr uint32_t kBatch = 1;
constexpr uint32_t kPad = 2;
constexpr int64_t kHeader = 24;
constexpr int64_t kMinRing = 64 << 10;

int64_t Align8(int64_t n) { return (n + 7) & ~int64_t{7}; }

uint32_t Crc(const char* data, size_t n, uint32_t init = 0) {
  return Crc32c(init, data, n);
}

// A record's payload: u32 op count; per op u8 kind, u32 key length, key,
// u32 value length, value. The record is padded with zeros to a multiple
// of 8.
size_t PayloadSize(const KvBatch& batch) {
  size_t size = 4;
  for (const KvBatch::Op& op : batch.ops()) {
    size += 9 + op.key.size() + op.value.size();
  }
  return size;
}

// The CRC32C of the payload EncodePayload writes, computed from the batch
// itself (outside the lock that the copy into the ring takes).
uint32_t PayloadCrc(const KvBatch& batch) {
  char b[4];
  absl::little_endian::Store32(b, static_cast<uint32_t>(batch.ops().size()));
  uint32_t crc = Crc(b, 4);
  for (const KvBatch::Op& op : batch.ops()) {
    char h[5];
    h[0] = static_cast<char>(op.kind);
    absl::little_endian::Store32(h + 1, static_cast<uint32_t>(op.key.size()));
    crc = Crc(op.key.data(), op.key.size(), Crc(h, 5, crc));
    absl::little_endian::Store32(b, static_cast<uint32_t>(op.value.size()));
    crc = Crc(op.value.data(), op.value.size(), Crc(b, 4, crc));
  }
  return crc;
}

// Writes the payload at `out`; `values[i]` is set to where op i's value
// now lies.
void EncodePayload(const KvBatch& batch, char* out, absl::string_view* values) {
  absl::little_endian::Store32(out, static_cast<uint32_t>(batch.ops().size()));
  out += 4;
  for (const KvBatch::Op& op : batch.ops()) {
    *out++ = static_cast<char>(op.kind);
    absl::little_endian::Store32(out, static_cast<uint32_t>(op.key.size()));
    std::memcpy(out + 4, op.key.data(), op.key.size());
    out += 4 + op.key.size();
    absl::little_endian::Store32(out, static_cast<uint32_t>(op.value.size()));
    std::memcpy(out + 4, op.value.data(), op.value.size());
    *values++ = absl::string_view(out + 4, op.value.size());
    out += 4 + op.value.size();
  }
}

// The latest value (nullopt: deleted) of each key a run of records wrote.
using Writes = absl::flat_hash_map<std::string, std::optional<std::string>>;

// Applies the ops of a payload to `out`; false if it does not parse (then
// `out` is as it was).
bool DecodeBatch(absl::string_view in, Writes& out) {
  auto u32 = [&in](uint32_t& v) {
    if (in.size() < 4) return false;
    v = absl::little_endian::Load32(in.data());
    in.remove_prefix(4);
    return true;
  };
  auto bytes = [&in, &u32](absl::string_view& s) {
    uint32_t n;
    if (!u32(n) || in.size() < n) return false;
    s = in.substr(0, n);
    in.remove_prefix(n);
    return true;
  };
  uint32_t count;
  if (!u32(count)) return false;
  std::vector<std::pair<absl::string_view, std::optional<absl::string_view>>>
      ops;
  for (uint32_t i = 0; i < count; ++i) {
    if (in.empty()) return false;
    const auto kind = static_cast<unsigned char>(in[0]);
    in.remove_prefix(1);
    absl::string_view key, value;
    if (!bytes(key) || !bytes(value)) return false;
    if (kind == KvBatch::Op::kPut) {
      ops.emplace_back(key, value);
    } else if (kind == KvBatch::Op::kDelete) {
      ops.emplace_back(key, std::nullopt);
    } else {
      return false;  // ranges never go through the log
    }
  }
  if (!in.empty()) return false;
  for (const auto& [key, value] : ops) {
    std::optional<std::string>& v = out[key];
    if (value.has_value()) {
      v.emplace(*value);
    } else {
      v.reset();
    }
  }
  return true;
}

// The header of a record, with its checksum over `payload_crc` and itself.
void FillHeader(char* h, uint32_t kind, uint64_t seq, uint32_t length,
                uint32_t payload_crc) {
  absl::little_endian::Store32(h, kMagic);
  absl::little_endian::Store32(h + 4, kind);
  absl::little_endian::Store64(h + 8, seq);
  absl::little_endian::Store32(h + 16, length);
  absl::little_endian::Store32(h + 20, Crc(h, 20, payload_crc));
}

// A record header as Recover reads it.
struct Header {
  uint32_t kind = 0;
  uint64_t seq = 0;
  uint32_t length = 0;
};

// Whether a whole, valid record (a batch, or a pad) lies at `offset` of a
// ring `ring` bytes long whose first `avail` bytes are at `data`; if so,
// its header is in `h`.
bool ValidAt(const char* data, int64_t avail, int64_t ring, int64_t offset,
             Header& h) {
  if (offset + kHeader > std::min(avail, ring)) return false;
  const char* p = data + offset;
  if (absl::little_endian::Load32(p) != kMagic) return false;
  h.kind = absl::little_endian::Load32(p + 4);
  h.seq = absl::little_endian::Load64(p + 8);
  h.length = absl::little_endian::Load32(p + 16);
  const int64_t room = ring - offset;
  const uint32_t crc = absl::little_endian::Load32(p + 20);
  if (h.length > room - kHeader) return false;
  if (h.kind == kPad) {
    return h.length == room - kHeader && Crc(p, 20) == crc;
  }
  return h.kind == kBatch && offset + kHeader + h.length <= avail &&
         Crc(p, 20, Crc(p + kHeader, h.length)) == crc;
}

bool HasRange(const KvBatch& batch) {
  return std::any_of(batch.ops().begin(), batch.ops().end(),
                     [](const KvBatch::Op& op) {
                       return op.kind == KvBatch::Op::kDeleteRange;
                     });
}

}  // namespace

std::string RingLogDamage::Describe(const std::string& path) const {
  if (truncated()) {
    return absl::StrCat(
        "round log '", path, "' is ", file_bytes, " bytes but was made ",
        made_bytes, " bytes: its records past the end, from offset ", offset,
        " (sequence ", seq, ") on, are lost, how many cannot be told (",
        records_after, " valid newer records remain)");
  }
  return absl::StrCat("round log '", path, "' is damaged at offset ", offset,
                      ": the record there (sequence ", seq,
                      ") does not read back, and ", records_after,
                      " valid newer records follow it: acknowledged writes "
                      "that a replay stopping there loses");
}

std::string RingLogEngine::EncodeMeta(uint64_t last_seq, int64_t position,
                                      int64_t made_bytes) {
  char b[24];
  absl::little_endian::Store64(b, last_seq);
  absl::little_endian::Store64(b + 8, static_cast<uint64_t>(position));
  absl::little_endian::Store64(b + 16, static_cast<uint64_t>(made_bytes));
  return std::string(b, 24);
}

RingLogEngine::RingLogEngine(std::string path, int fd,
                             std::unique_ptr<KvEngine> inner,
                             RingLogOptions options)
    : path_(std::move(path)),
      fd_(fd),
      inner_(std::move(inner)),
      options_(options) {}

absl::StatusOr<std::unique_ptr<RingLogEngine>> RingLogEngine::Open(
    const std::string& path, std::unique_ptr<KvEngine> inner,
    RingLogOptions options) {
  options.ring_bytes = std::max(kMinRing, options.ring_bytes & ~int64_t{7});
  options.flush_bytes =
      std::clamp<int64_t>(options.flush_bytes, 1, options.ring_bytes / 2);
  options.min_lap_bytes = std::clamp<int64_t>(
      options.min_lap_bytes & ~int64_t{7}, kMinRing, options.ring_bytes);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("round log '", path, "': open: ", strerror(errno)));
  }
  std::unique_ptr<RingLogEngine> engine(
      new RingLogEngine(path, fd, std::move(inner), options));
  struct stat st;
  if (::fstat(fd, &st) != 0) return engine->Error("fstat", errno);
  if (absl::Status s = engine->Recover(st.st_size); !s.ok()) return s;
  // Mapped whole, its pages faulted in now: a record is then a copy into
  // memory, and the ring counts in the server's resident memory from the
  // start instead of growing into it.
  //
  // In huge (2 MiB) pages where the kernel and the file system give a
  // file's page cache folios that large (Linux 6.x on ext4 or XFS): with
  // 4 KiB pages, every page of a record whose translation had left the
  // TLB cost about 3 us on the VM of bench/RESULTS.md, 12 us of an 8 KB
  // record in the lock-step shape, where 32 jobs' state evicts the ring's
  // entries between its writes. A huge page is a folio of the page cache,
  // and the cache holds the folios the ring's last writer left (4 KiB ones
  // after the ring is written through above), so its pages are written
  // back and dropped first, and faulted in again only once the mapping
  // asks for huge pages. Where they are not given, the ring works as
  // before in 4 KiB pages.
  if (::fdatasync(fd) != 0) return engine->Error("fdatasync", errno);
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  void* map = ::mmap(nullptr, static_cast<size_t>(options.ring_bytes),
                     PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) return engine->Error("mmap", errno);
  engine->map_ = static_cast<char*>(map);
  (void)::madvise(map, static_cast<size_t>(options.ring_bytes), MADV_HUGEPAGE);
  // Faulting a shared file's page in for a read maps it read-only: the
  // first write to each would fault into the file system
  // (ext4_page_mkwrite, about 2 us a page, 30 us for a 64 KB record).
  // Written once now, they stay writable until the kernel next writes
  // them back.
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  for (int64_t at = 0; at < options.ring_bytes; at += page) {
    volatile char* byte = engine->map_ + at;
    *byte = *byte;
  }
  engine->flusher_ = std::thread([e = engine.get()] { e->FlusherLoop(); });
  return engine;
}

absl::Status RingLogEngine::Recover(int64_t file_bytes) {
  absl::MutexLock flush(&flush_mu_);
  absl::MutexLock lock(&mu_);
  uint64_t last_seq = 0;
  int64_t position = 0;
  int64_t made = 0;
  absl::StatusOr<std::optional<std::string>> meta = inner_->Get(kMetaKey);
  if (!meta.ok()) return meta.status();
  // 16 bytes before the size was recorded; 24 since.
  if (meta->has_value() && ((*meta)->size() == 16 || (*meta)->size() == 24)) {
    last_seq = absl::little_endian::Load64((*meta)->data());
    position =
        static_cast<int64_t>(absl::little_endian::Load64((*meta)->data() + 8));
    if ((*meta)->size() == 24) {
      made = static_cast<int64_t>(
          absl::little_endian::Load64((*meta)->data() + 16));
    }
  }
  // Records lie where the ring as it was made put them, whatever the
  // file's size is now.
  const int64_t ring = made > 0 ? made : file_bytes & ~int64_t{7};
  const int64_t avail = std::min(file_bytes, ring);
  const char* data = nullptr;
  if (ring >= kMinRing && avail > 0) {
    void* m = ::mmap(nullptr, static_cast<size_t>(avail), PROT_READ,
                     MAP_PRIVATE, fd_, 0);
    if (m == MAP_FAILED) return Error("mmap to read it", errno);
    data = static_cast<const char*>(m);
  }
  // What the ring holds past `position`, in order, coalesced by key as a
  // flush would: a full ring replays into a batch of its distinct keys.
  Writes replayed;
  uint64_t seq = last_seq + 1;
  bool torn = false;  // the replay stopped at a record of its sequence
  if (data != nullptr) {
    const int64_t start = position;
    while (position - start < ring) {
      const int64_t offset = position % ring;
      const int64_t room = ring - offset;
      if (room < kHeader) {
        position += room;
        continue;
      }
      Header h;
      if (!ValidAt(data, avail, ring, offset, h)) {
        // Where the replay ends cleanly lie zeros, an earlier lap's whole
        // record, or the middle of one: no magic, nor this sequence number.
        // Either one on a record that fails is a record cut short or
        // damaged, the newest one, whichever of its bytes went wrong.
        torn = offset + kHeader <= avail &&
               (absl::little_endian::Load32(data + offset) == kMagic ||
                absl::little_endian::Load64(data + offset + 8) == seq);
        break;
      }
      if (h.seq != seq) break;  // written in an earlier lap: the end
      if (h.kind == kPad) {
        position += room;
        continue;
      }
      if (!DecodeBatch(absl::string_view(data + offset + kHeader, h.length),
                       replayed)) {
        torn = true;
        break;
      }
      ++recovered_records_;
      ++seq;
      position += Align8(kHeader + h.length);
    }
  }
  // A kill leaves at most the record it interrupted torn, the newest one:
  // valid records newer than where the replay stopped say it stopped at
  // damage. And whatever is replayed, the records written next carry
  // sequence numbers past every valid record here, so none that this
  // replay dropped can ever chain on after them.
  RingLogDamage found;
  found.offset = ring > 0 ? position % ring : 0;
  found.seq = seq;
  found.file_bytes = file_bytes;
  found.made_bytes = made;
  uint64_t newest = 0;
  for (int64_t offset = 0; data != nullptr && offset + kHeader <= avail;) {
    Header h;
    if (!ValidAt(data, avail, ring, offset, h)) {
      offset += 8;
      continue;
    }
    newest = std::max(newest, h.seq);
    if (h.kind == kBatch && h.seq >= seq) ++found.records_after;
    offset += Align8(kHeader + h.length);
  }
  if (data != nullptr) ::munmap(const_cast<char*>(data), avail);
  if (found.records_after > 0 || found.truncated()) {
    if (options_.recovery != RingLogRecovery::kPointInTime) {
      return absl::DataLossError(found.Describe(path_));
    }
    damage_ = found;
  } else if (torn) {
    torn_tail_ = found;
  }
  seq = std::max(seq, newest + 1);
  // Made anew when the flag asks for another size, or the file is not the
  // size it was made (a loss accepted above).
  const bool resize = file_bytes != options_.ring_bytes ||
                      (made > 0 && made != options_.ring_bytes);
  if (resize) position = 0;
  next_seq_ = seq;
  head_ = tail_ = flushed_to_ = position;
  written_ = written_at_flush_ = position;
  lap_ = NextLapLocked();
  // The replayed writes and the position after them, at once: a crash from
  // here on replays nothing twice.
  KvBatch replay;
  replay.Reserve(replayed.size() + 1);
  for (auto& [key, value] : replayed) {
    if (value.has_value()) {
      replay.Put(key, *std::move(value));
    } else {
      replay.Delete(key);
    }
  }
  replayed.clear();
  // A ring about to be made anew holds nothing needed yet.
  replay.Put(kMetaKey,
             EncodeMeta(seq - 1, position, resize ? 0 : options_.ring_bytes));
  if (absl::Status s = inner_->Write(replay); !s.ok()) return s;
  if (!resize) return absl::OkStatus();
  // A new ring, or another size: written through once, so that its blocks
  // are allocated (a full disk cannot fail a record later).
  if (::ftruncate(fd_, 0) != 0) return Error("ftruncate", errno);
  const std::string zeros(1 << 20, '\0');
  for (int64_t at = 0; at < options_.ring_bytes; at += zeros.size()) {
    const size_t n = static_cast<size_t>(
        std::min<int64_t>(zeros.size(), options_.ring_bytes - at));
    if (absl::Status s = PwriteAll(zeros.data(), n, at); !s.ok()) return s;
  }
  if (::fdatasync(fd_) != 0) return Error("fdatasync", errno);
  // And its name, so that a machine crash cannot lose the file.
  const size_t slash = path_.rfind('/');
  const std::string dir =
      slash == std::string::npos ? "." : path_.substr(0, slash);
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return Error("open its folder", errno);
  const int synced = ::fsync(dir_fd);
  const int err = errno;
  ::close(dir_fd);
  if (synced != 0) return Error("fsync its folder", err);
  // Made: from now on, a file shorter than this has lost records.
  KvBatch made_now;
  made_now.Put(kMetaKey, EncodeMeta(seq - 1, position, options_.ring_bytes));
  return inner_->Write(made_now);
}

RingLogEngine::~RingLogEngine() {
  bool abandoned;
  {
    absl::MutexLock lock(&mu_);
    abandoned = abandoned_;
    stopping_ = true;
    flush_wanted_.Signal();
  }
  if (flusher_.joinable()) flusher_.join();
  // map_ is set once Open has recovered the ring: an Open that failed
  // leaves the engine behind as it found it.
  if (!abandoned && map_ != nullptr && Flush().ok()) {
    // Everything is in the engine behind: the ring holds nothing it needs,
    // and a file lost or cut short from now on loses nothing.
    KvBatch clean;
    {
      absl::MutexLock lock(&mu_);
      clean.Put(kMetaKey, EncodeMeta(next_seq_ - 1, head_, 0));
    }
    (void)inner_->Write(clean);
  }
  if (map_ != nullptr) {
    ::munmap(map_, static_cast<size_t>(options_.ring_bytes));
  }
  ::close(fd_);
}

void RingLogEngine::WaitForFlusherForTest() {
  {
    // A due flush stops being due when it begins (under flush_mu_)...
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](RingLogEngine* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(e->mu_) {
          return !e->FlushDueLocked();
        },
        this));
  }
  // ...and is done when flush_mu_ is free again.
  absl::MutexLock lock(&flush_mu_);
}

void RingLogEngine::AbandonForTest() {
  {
    absl::MutexLock lock(&mu_);
    abandoned_ = true;
    stopping_ = true;
    flush_wanted_.Signal();
  }
  if (flusher_.joinable()) flusher_.join();
}

std::string RingLogEngine::Describe() const { return inner_->Describe(); }

absl::Status RingLogEngine::Error(absl::string_view what, int err) const {
  if (err == ENOSPC) {
    return absl::ResourceExhaustedError(
        absl::StrCat("round log '", path_, "': ", what, ": ", strerror(err),
                     "; the disk is full: free space, then retry"));
  }
  return absl::UnavailableError(absl::StrCat("round log '", path_, "': ", what,
                                             ": ", strerror(err),
                                             "; check the data_dir's device"));
}

absl::Status RingLogEngine::PwriteAll(const char* data, size_t size,
                                      int64_t offset) const {
  while (size > 0) {
    const ssize_t n = ::pwrite(fd_, data, size, offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error("pwrite", errno);
    }
    data += n;
    size -= static_cast<size_t>(n);
    offset += n;
  }
  return absl::OkStatus();
}

absl::Status RingLogEngine::Sync(int64_t offset, int64_t size) const {
  if (!options_.sync_writes) return absl::OkStatus();
  static const int64_t page = ::sysconf(_SC_PAGESIZE);
  const int64_t start = offset / page * page;
  if (::msync(map_ + start, static_cast<size_t>(offset + size - start),
              MS_SYNC) != 0) {
    return Error("msync", errno);
  }
  return absl::OkStatus();
}

absl::Status RingLogEngine::Write(const KvBatch& batch) {
  if (batch.ops().empty()) return absl::OkStatus();
  if (HasRange(batch)) return WriteThrough(batch);
  const size_t payload_size = PayloadSize(batch);
  const int64_t size = Align8(kHeader + static_cast<int64_t>(payload_size));
  if (size > options_.ring_bytes / 4) return WriteThrough(batch);
  const uint32_t payload_crc = PayloadCrc(batch);
  absl::InlinedVector<absl::string_view, 4> values(batch.ops().size());
  const int64_t ring = options_.ring_bytes;
  bool full_before = false;
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      const int64_t offset = head_ % ring;
      const int64_t room = ring - offset;
      // The rest of the file is padded when the record does not fit in it,
      // or in the lap, unless what the ring holds now wants a longer lap:
      // this one goes on. A replay skips the padding either way.
      if (offset > 0 && offset + size > lap_) {
        lap_ = std::max(lap_, NextLapLocked());
      }
      const bool lap_ends = offset > 0 && offset + size > lap_;
      const int64_t pad = room < size || lap_ends ? room : 0;
      if (head_ + pad + size - tail_ <= ring) {
        if (pad >= kHeader) {
          FillHeader(map_ + offset, kPad, next_seq_,
                     static_cast<uint32_t>(pad - kHeader), 0);
          if (absl::Status s = Sync(offset, kHeader); !s.ok()) return s;
        }
        if (pad > 0) lap_ = NextLapLocked();
        if (room < size) written_ += pad;
        // Straight into the ring's pages: a killed process leaves them in
        // the page cache as a pwrite would, without a copy or a syscall.
        const int64_t at = (head_ + pad) % ring;
        char* record = map_ + at;
        EncodePayload(batch, record + kHeader, values.data());
        std::memset(record + kHeader + payload_size, 0,
                    static_cast<size_t>(size - kHeader) - payload_size);
        FillHeader(record, kBatch, next_seq_,
                   static_cast<uint32_t>(payload_size), payload_crc);
        if (absl::Status s = Sync(at, size); !s.ok()) return s;
        // The overlay reads the values where they lie in the ring, which
        // no write reuses before a flush has handed them on.
        written_ += size;
        for (size_t i = 0; i < values.size(); ++i) {
          const KvBatch::Op& op = batch.ops()[i];
          auto [it, made] = overlay_.try_emplace(op.key);
          Entry& e = it->second;
          if (op.kind == KvBatch::Op::kDelete && !made && e.forgettable &&
              !FlushHoldsLocked(op.key)) {
            // A forgettable put is of a key the engine behind does not hold
            // (KvBatch::Op::transient), and an entry in the overlay has not
            // been written there: the last flush carried it, or came before
            // it. So the delete has nothing to delete behind: the entry goes.
            // Kept as a deletion, the next flush would write it, a RocksDB
            // tombstone for every round of the retry window. While a flush
            // is under way, a key it holds stays (Get would read its value
            // there).
            SetValueLocked(e, std::nullopt);
            overlay_.erase(it);
            continue;
          }
          e.position = head_ + pad;
          e.seq = next_seq_;
          if (op.kind == KvBatch::Op::kPut) {
            SetValueLocked(e, values[i]);
            // A pending delete of the key, here or in the flush under way,
            // may still have to reach the engine behind.
            e.forgettable = op.transient &&
                            (made ? !FlushHoldsLocked(op.key) : e.forgettable);
            e.transient = op.transient;
            if (op.transient) {
              transient_.logged += static_cast<int64_t>(values[i].size());
            }
          } else {
            SetValueLocked(e, std::nullopt);
            e.transient = false;
            e.forgettable = false;
          }
        }
        head_ += pad + size;
        ++next_seq_;
        // The flusher waits for the first write since the last flush (it
        // then sets its deadline) or for FlushDueLocked.
        if (first_unflushed_ == absl::InfiniteFuture()) {
          first_unflushed_ = absl::Now();
          flush_wanted_.Signal();
        } else if (FlushDueLocked()) {
          flush_wanted_.Signal();
        }
        return absl::OkStatus();
      }
    }
    // The ring is full: the engine behind takes what it holds first.
    // Carrying frees all but half a lap ahead of the writes; a record
    // larger than that (laps shorter than the file) may need all of it.
    if (absl::Status s = Flush(/*carry=*/!full_before, /*for_room=*/true);
        !s.ok()) {
      return s;
    }
    full_before = true;
  }
}

KvBatch RingLogEngine::WithPosition(
    absl::Span<const Overlay::value_type* const> entries, uint64_t last_seq,
    int64_t position) const {
  KvBatch out;
  out.Reserve(entries.size() + 1);
  for (const Overlay::value_type* kv : entries) {
    if (kv->second.value.has_value()) {
      out.Put(kv->first, std::string(*kv->second.value));
    } else {
      out.Delete(kv->first);
    }
  }
  out.Put(kMetaKey, EncodeMeta(last_seq, position, options_.ring_bytes));
  return out;
}

absl::Status RingLogEngine::WriteThrough(const KvBatch& batch) {
  absl::MutexLock flush(&flush_mu_);
  absl::MutexLock lock(&mu_);
  // What the ring holds, then the batch: one write, in log order.
  std::vector<const Overlay::value_type*> held;
  held.reserve(overlay_.size());
  for (const Overlay::value_type& kv : overlay_) held.push_back(&kv);
  KvBatch out = WithPosition(held, next_seq_ - 1, head_);
  for (const KvBatch::Op& op : batch.ops()) {
    switch (op.kind) {
      case KvBatch::Op::kPut:
        out.Put(op.key, op.value);
        break;
      case KvBatch::Op::kDelete:
        out.Delete(op.key);
        break;
      case KvBatch::Op::kDeleteRange:
        out.DeleteRange(op.key, op.value);
        break;
    }
  }
  if (absl::Status s = inner_->Write(out); !s.ok()) return s;
  // The batch's own transient puts went past the ring (too large for it,
  // or beside a range).
  for (const KvBatch::Op& op : batch.ops()) {
    if (op.kind == KvBatch::Op::kPut && op.transient) {
      transient_.logged += static_cast<int64_t>(op.value.size());
      transient_.spilled += static_cast<int64_t>(op.value.size());
    }
  }
  overlay_.clear();
  overlay_bytes_ = 0;
  tail_ = flushed_to_ = head_;
  written_at_flush_ = written_;
  first_unflushed_ = absl::InfiniteFuture();
  return absl::OkStatus();
}

absl::Status RingLogEngine::Flush() {
  return Flush(/*carry=*/false, /*for_room=*/false);
}

absl::Status RingLogEngine::Flush(bool carry, bool for_room) {
  absl::MutexLock flush(&flush_mu_);
  return FlushLocked(carry, for_room);
}

RingLogEngine::TransientBytes RingLogEngine::transient_bytes() const {
  absl::MutexLock lock(&mu_);
  return transient_;
}

absl::Status RingLogEngine::FlushLocked(bool carry, bool for_room) {
  int64_t keep_from;
  uint64_t keep_seq;
  int64_t flushed_before;
  int64_t written_before;
  int64_t spilled = 0;  // transient bytes in `writes`
  // The entries the engine behind gets. Only a flush (one at a time, under
  // flush_mu_) changes flushing_, so they stay put while the batch is
  // copied from them outside mu_, which writers on the answer path take.
  std::vector<const Overlay::value_type*> writes;
  {
    absl::MutexLock lock(&mu_);
    if (head_ == tail_ || (carry && head_ == flushed_to_)) {
      return absl::OkStatus();
    }
    flushing_.swap(overlay_);
    first_unflushed_ = absl::InfiniteFuture();
    flushed_before = flushed_to_;
    flushed_to_ = head_;
    written_before = written_at_flush_;
    written_at_flush_ = written_;
    overlay_bytes_ = 0;
    // The engine behind gets everything but the carried puts, and the
    // position from which a replay must start: the oldest carried record,
    // or the head.
    keep_from = head_;
    keep_seq = next_seq_;
    // Carried: a transient put that the writes will not reach for half a
    // lap (the newest half of the ring when a lap is the whole file).
    const int64_t young = head_ - (options_.ring_bytes - lap_ / 2);
    writes.reserve(flushing_.size());
    for (const Overlay::value_type& kv : flushing_) {
      const Entry& e = kv.second;
      if (carry && e.transient && e.position >= young) {
        overlay_.emplace(kv);  // Get still sees it, and the next flush
        overlay_bytes_ += static_cast<int64_t>(e.value->size());
        if (e.position < keep_from) {
          keep_from = e.position;
          keep_seq = e.seq;
        }
      } else {
        writes.push_back(&kv);
        if (e.transient && e.value.has_value()) {
          spilled += static_cast<int64_t>(e.value->size());
        }
      }
    }
  }
  // Writers go on meanwhile, into the overlay; Get reads both.
  const KvBatch out = WithPosition(writes, keep_seq - 1, keep_from);
  const absl::Status s = inner_->Write(out);
  absl::MutexLock lock(&mu_);
  if (s.ok()) {
    tail_ = keep_from;
    if (for_room) transient_.spilled += spilled;
  } else {
    // Kept for the next try; what was written since (and the carried
    // puts, already there) is newer.
    for (auto& [key, e] : flushing_) {
      if (overlay_.try_emplace(key, e).second && e.value.has_value()) {
        overlay_bytes_ += static_cast<int64_t>(e.value->size());
      }
    }
    flushed_to_ = flushed_before;
    written_at_flush_ = written_before;
    first_unflushed_ = std::min(first_unflushed_, absl::Now());
  }
  flushing_.clear();
  return s;
}

absl::StatusOr<std::optional<std::string>> RingLogEngine::Get(
    absl::string_view key) {
  {
    absl::MutexLock lock(&mu_);
    for (const Overlay* o : {&overlay_, &flushing_}) {
      auto it = o->find(key);
      if (it == o->end()) continue;
      if (!it->second.value.has_value()) return std::nullopt;
      return std::string(*it->second.value);
    }
  }
  return inner_->Get(key);
}

absl::Status RingLogEngine::Scan(
    absl::string_view prefix,
    const std::function<absl::Status(absl::string_view, absl::string_view)>&
        visit) {
  if (absl::Status s = Flush(); !s.ok()) return s;
  return inner_->Scan(prefix, visit);
}

absl::Status RingLogEngine::CopyTo(const std::string& dir) {
  if (absl::Status s = Flush(); !s.ok()) return s;
  return inner_->CopyTo(dir);
}

bool RingLogEngine::FlushDueLocked() const {
  // flush_bytes written since the last flush (at most half a lap), or the
  // ring three quarters full (carried records keep up to half of it), so
  // that a write does not find it full and flush on the answer path.
  return head_ != flushed_to_ &&
         (written_ - written_at_flush_ >=
              std::min(options_.flush_bytes, lap_ / 2) ||
          head_ - tail_ >= options_.ring_bytes - options_.ring_bytes / 4);
}

bool RingLogEngine::FlushHoldsLocked(absl::string_view key) const {
  // Almost always empty: no hashing then.
  return !flushing_.empty() && flushing_.contains(key);
}

int64_t RingLogEngine::NextLapLocked() const {
  int64_t lap = options_.min_lap_bytes;
  while (lap < options_.ring_bytes && lap < 4 * overlay_bytes_) lap *= 2;
  return std::min(lap, options_.ring_bytes);
}

void RingLogEngine::SetValueLocked(Entry& e,
                                   std::optional<absl::string_view> value) {
  if (e.value.has_value()) {
    overlay_bytes_ -= static_cast<int64_t>(e.value->size());
  }
  if (value.has_value()) overlay_bytes_ += static_cast<int64_t>(value->size());
  e.value = value;
}

void RingLogEngine::FlusherLoop() {
  mu_.Lock();
  while (!stopping_) {
    const absl::Time now = absl::Now();
    const absl::Time period_due = first_unflushed_ + options_.flush_period;
    const bool full = FlushDueLocked();
    if (!(full && now >= retry_after_) && now < period_due) {
      flush_wanted_.WaitWithDeadline(
          &mu_, full ? std::min(retry_after_, period_due) : period_due);
      continue;
    }
    mu_.Unlock();
    const absl::Status s = Flush(/*carry=*/true, /*for_room=*/true);
    mu_.Lock();
    // A failure (a full disk) is tried again a period later; writes that
    // find the ring full get it meanwhile.
    retry_after_ =
        s.ok() ? absl::InfinitePast() : absl::Now() + options_.flush_period;
  }
  mu_.Unlock();
}

}  // namespace syncnorm
