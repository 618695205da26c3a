// Snapshots in shared memory (see snapshot_arena.h).
#include "ob/runtime/snapshot_arena.h"

#include "ob/torch_compat.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace ob::runtime {

// A slot's header (named, not anonymous: SnapshotArena::Header holds
// them, and a type with external linkage may not hold an anonymous one).
namespace arena_layout {

enum SlotState : uint32_t { kEmpty = 0, kWriting = 1, kComplete = 2 };
constexpr int kMaxRanges = 8;  // chunks a stage (ob-plan: at most 8)

void PutRanges(const LayerRanges& r, int32_t* num, int32_t* pairs) {
  *num = static_cast<int32_t>(r.size());
  for (size_t k = 0; k < r.size(); ++k) pairs[2 * k] = r[k].first, pairs[2 * k + 1] = r[k].second;
}
LayerRanges GetRanges(int32_t num, const int32_t* pairs) {
  LayerRanges r;
  for (int k = 0; k < std::min<int32_t>(num, kMaxRanges); ++k) r.emplace_back(pairs[2 * k], pairs[2 * k + 1]);
  return r;
}

struct SlotHeader {
  uint32_t state;
  int32_t first_layer;
  int32_t last_layer;
  int32_t count;        // entries
  int64_t step;
  uint64_t offset;      // of the region, from the file start
  uint64_t capacity;    // bytes of the region
  uint64_t lineage;     // of the state captured (control.proto's WeightSource)
  int32_t tp;           // shard tp_rank of tp of the layers
  int32_t tp_rank;
  int32_t num_ranges;   // with chunks: its layer ranges, [first, last] pairs; 0: [first_layer, last_layer]
  int32_t ranges[2 * kMaxRanges];
};

}  // namespace arena_layout

namespace {

using namespace arena_layout;

constexpr uint64_t kMagic = 0x6f622d736e617031ull;  // "ob-snap1"
constexpr uint32_t kVersion = 3;  // 2: slots carry their lineage; 3: and their shard
constexpr uint64_t kHeaderBytes = 4096;
constexpr uint64_t kReserveBytes = uint64_t{1} << 38;  // virtual only: 256 GiB
constexpr int kMaxDims = 6;
constexpr size_t kKeyBytes = 96;

struct Entry {
  char key[kKeyBytes];
  int32_t dtype;        // c10::ScalarType
  int32_t ndim;
  int64_t shape[kMaxDims];
  int64_t adam_step;
  uint64_t offset;      // of the value, from the region start; moments follow
  uint64_t nbytes;      // of one of the three tensors
};

uint64_t Align(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

// The file's growth unit, so that pinned ranges never share a page.
uint64_t PageBytes() {
  static const uint64_t page = std::max<uint64_t>(4096, static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)));
  return page;
}

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

}  // namespace

struct SnapshotArena::Header {
  uint64_t magic;
  uint32_t version;
  uint32_t reserved;
  SlotHeader slots[kSlots];
};
SnapshotArena::Header* SnapshotArena::header() const {
  static_assert(sizeof(Header) <= kHeaderBytes, "header too large");
  return reinterpret_cast<Header*>(base_);
}

Result<std::unique_ptr<SnapshotArena>> SnapshotArena::Open(int fd, const std::string& name) {
  std::unique_ptr<SnapshotArena> a(new SnapshotArena());
  a->name_ = name;
  a->fd_ = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
  if (a->fd_ < 0) return Status::IoErr(Errno(name + ": cannot use the snapshot descriptor"));
  OB_RETURN_IF_ERROR(a->Map(a->fd_));
  return a;
}

Result<std::unique_ptr<SnapshotArena>> SnapshotArena::Anonymous() {
  int fd = ::memfd_create("ob-snapshot", MFD_CLOEXEC);
  if (fd < 0) return Status::IoErr(Errno("memfd_create"));
  std::unique_ptr<SnapshotArena> a(new SnapshotArena());
  a->name_ = "private snapshot arena";
  a->fd_ = fd;
  OB_RETURN_IF_ERROR(a->Map(fd));
  return a;
}

SnapshotArena::~SnapshotArena() {
  {
    std::lock_guard<std::mutex> lock(pin_mu_);
    pin_stop_ = true;
  }
  pin_cv_.notify_all();
  if (pinner_.joinable()) pinner_.join();
  for (const auto& range : pinned_) unpin_fn_(range.first);
  if (base_ != nullptr) ::munmap(base_, kReserveBytes);
  if (fd_ >= 0) ::close(fd_);
}

Status SnapshotArena::Map(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Status::IoErr(Errno(name_ + ": fstat"));
  void* p = ::mmap(nullptr, kReserveBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  if (p == MAP_FAILED) return Status::IoErr(Errno(name_ + ": cannot map"));
  base_ = static_cast<char*>(p);
  file_bytes_ = static_cast<uint64_t>(st.st_size);
  if (file_bytes_ == 0) {
    OB_RETURN_IF_ERROR(Grow(kHeaderBytes));
    Header* h = header();
    std::memset(h, 0, kHeaderBytes);
    h->magic = kMagic;
    h->version = kVersion;
    for (auto& s : h->slots) s.step = -2;
    return Status::Ok();
  }
  if (file_bytes_ < kHeaderBytes || header()->magic != kMagic) {
    return Status::DataErr(name_ + ": not a snapshot arena");
  }
  if (header()->version != kVersion) {
    return Status::DataErr(name_ + ": snapshot arena version " + std::to_string(header()->version) +
                           ", this build reads " + std::to_string(kVersion));
  }
  return Status::Ok();
}

Status SnapshotArena::Grow(uint64_t bytes) {
  bytes = Align(bytes, PageBytes());
  if (bytes <= file_bytes_) return Status::Ok();
  if (bytes > kReserveBytes) return Status::IoErr(name_ + ": snapshot larger than the reserved range");
  if (::ftruncate(fd_, static_cast<off_t>(bytes)) != 0) {
    return Status::IoErr(Errno(name_ + ": cannot grow to " + std::to_string(bytes) + " bytes"));
  }
  file_bytes_ = bytes;
  PinUpTo(file_bytes_);
  return Status::Ok();
}

void SnapshotArena::set_pin(bool pin, PinFn pin_fn, UnpinFn unpin_fn) {
  {
    std::lock_guard<std::mutex> lock(pin_mu_);
    if (pinner_.joinable()) return;  // once per arena
    pin_ = pin;
    if (!pin) return;
    pin_fn_ = pin_fn ? std::move(pin_fn) : PinFn(compat::PinHostRange);
    unpin_fn_ = unpin_fn ? std::move(unpin_fn) : UnpinFn(compat::UnpinHostRange);
    // What is there already, a slot region a range: the first to be written
    // is locked without waiting for the others.
    for (const SlotHeader& slot : header()->slots) {
      if (slot.capacity > 0 && slot.offset > 0) pin_marks_.push_back(slot.offset);
    }
    pin_marks_.push_back(file_bytes_);
    for (auto& m : pin_marks_) m = m / PageBytes() * PageBytes();
    std::sort(pin_marks_.begin(), pin_marks_.end());
    pin_marks_.erase(std::unique(pin_marks_.begin(), pin_marks_.end()), pin_marks_.end());
  }
  pinner_ = std::thread([this] { PinLoop(); });
}

bool SnapshotArena::Prefault(void* data, size_t bytes) {
#ifdef MADV_POPULATE_WRITE
  return ::madvise(data, bytes, MADV_POPULATE_WRITE) == 0;
#else
  (void)data;
  (void)bytes;
  return false;
#endif
}

uint64_t SnapshotArena::PinnedBytesLocked() const {
  return pinned_.empty() ? 0 : static_cast<uint64_t>(pinned_.back().first - base_) + pinned_.back().second;
}

uint64_t SnapshotArena::pinned_bytes() const {
  std::lock_guard<std::mutex> lock(pin_mu_);
  return PinnedBytesLocked();
}

bool SnapshotArena::WaitPinned() {
  std::unique_lock<std::mutex> lock(pin_mu_);
  pin_cv_.wait(lock, [this] {
    return !pin_ || pin_stop_ || PinnedBytesLocked() >= file_bytes_ / PageBytes() * PageBytes();
  });
  return pin_ && PinnedBytesLocked() >= file_bytes_ / PageBytes() * PageBytes();
}

// Page-locked for the side stream's copies (snapshot.h); pageable if that
// fails, which is slower but correct. Whole pages only: a file an older
// build left at another size keeps its last partial page pageable.
void SnapshotArena::PinLoop() {
  std::unique_lock<std::mutex> lock(pin_mu_);
  for (;;) {
    const uint64_t from = PinnedBytesLocked();
    auto next = pin_marks_.end();  // the first mark past what is locked
    pin_cv_.wait(lock, [&] {
      next = std::upper_bound(pin_marks_.begin(), pin_marks_.end(), from);
      return pin_stop_ || next != pin_marks_.end();
    });
    if (pin_stop_) return;
    const uint64_t end = *next;
    lock.unlock();
    const bool ok = pin_fn_(base_ + from, end - from);  // seconds, unlocked
    lock.lock();
    if (!ok) pin_ = false;
    if (ok) pinned_.emplace_back(base_ + from, end - from);
    pin_cv_.notify_all();
    if (!ok) return;
  }
}

// Growth (file_bytes_ is the caller's; the mark is what the thread reads).
void SnapshotArena::PinUpTo(uint64_t end) {
  {
    std::lock_guard<std::mutex> lock(pin_mu_);
    if (!pin_) return;
    end = end / PageBytes() * PageBytes();
    if (!pin_marks_.empty() && end <= pin_marks_.back()) return;
    pin_marks_.push_back(end);
  }
  pin_cv_.notify_all();
}

SnapshotArena::SlotInfo SnapshotArena::info(int slot) const {
  SlotInfo i;
  const SlotHeader& s = header()->slots[slot];
  if (__atomic_load_n(&s.state, __ATOMIC_ACQUIRE) != kComplete) return i;
  i.step = s.step;
  i.first_layer = s.first_layer;
  i.last_layer = s.last_layer;
  i.ranges = GetRanges(s.num_ranges, s.ranges);
  i.tp = s.tp;
  i.tp_rank = s.tp_rank;
  i.lineage = s.lineage;
  return i;
}

int SnapshotArena::SlotAt(int64_t step) const {
  for (int i = 0; i < kSlots; ++i) {
    if (info(i).complete() && info(i).step == step) return i;
  }
  return -1;
}

Result<StageSnapshot> SnapshotArena::View(int slot) const {
  const SlotHeader& s = header()->slots[slot];
  const std::string where = name_ + " slot " + std::to_string(slot);
  if (!info(slot).complete()) return Status::DataErr(where + ": no complete snapshot");
  if (s.offset + s.capacity > file_bytes_ || s.count < 0 ||
      static_cast<uint64_t>(s.count) * sizeof(Entry) > s.capacity) {
    return Status::DataErr(where + ": damaged slot header");
  }
  StageSnapshot out;
  out.step = s.step;
  out.first_layer = s.first_layer;
  out.last_layer = s.last_layer;
  out.ranges = GetRanges(s.num_ranges, s.ranges);
  out.tp = s.tp;
  out.tp_rank = s.tp_rank;
  char* region = base_ + s.offset;
  const auto* entries = reinterpret_cast<const Entry*>(region);
  for (int i = 0; i < s.count; ++i) {
    const Entry& e = entries[i];
    if (e.ndim < 0 || e.ndim > kMaxDims || e.offset + 3 * e.nbytes > s.capacity ||
        std::memchr(e.key, '\0', kKeyBytes) == nullptr) {
      return Status::DataErr(where + ": damaged entry " + std::to_string(i));
    }
    std::vector<int64_t> shape(e.shape, e.shape + e.ndim);
    auto options = torch::TensorOptions().dtype(static_cast<c10::ScalarType>(e.dtype));
    char* data = region + e.offset;
    TensorSnapshot t;
    t.value = torch::from_blob(data, shape, options);
    t.exp_avg = torch::from_blob(data + e.nbytes, shape, options);
    t.exp_avg_sq = torch::from_blob(data + 2 * e.nbytes, shape, options);
    t.adam_step = e.adam_step;
    if (static_cast<uint64_t>(t.value.nbytes()) != e.nbytes) {
      return Status::DataErr(where + ": entry " + std::string(e.key) + " has a wrong size");
    }
    out.tensors.emplace(e.key, std::move(t));
  }
  return out;
}

Status SnapshotArena::Prepare(int slot, const StageSnapshot& like, StageSnapshot* out) {
  const uint64_t table = Align(like.tensors.size() * sizeof(Entry), 64);
  uint64_t needed = table;
  for (const auto& [key, t] : like.tensors) {
    if (key.size() >= kKeyBytes) return Status::Internal("snapshot key too long: " + key);
    if (t.value.dim() > kMaxDims) return Status::Internal("snapshot tensor of too many dims: " + key);
    needed += 3 * Align(static_cast<uint64_t>(t.value.nbytes()), 64);
  }
  if (like.ranges.size() > static_cast<size_t>(kMaxRanges)) {
    return Status::Internal("a snapshot of " + std::to_string(like.ranges.size()) + " layer ranges (at most " +
                            std::to_string(kMaxRanges) + ")");
  }
  SlotHeader& s = header()->slots[slot];
  __atomic_store_n(&s.state, kEmpty, __ATOMIC_RELEASE);
  if (needed > s.capacity) {  // a new region at the end; the old one is abandoned
    const uint64_t offset = Align(file_bytes_, PageBytes());
    OB_RETURN_IF_ERROR(Grow(offset + needed));
    s.offset = offset;
    s.capacity = needed;
  }
  s.step = -2;
  s.first_layer = like.first_layer;
  s.last_layer = like.last_layer;
  PutRanges(like.ranges, &s.num_ranges, s.ranges);
  s.tp = like.tp;
  s.tp_rank = like.tp_rank;
  s.count = static_cast<int32_t>(like.tensors.size());
  char* region = base_ + s.offset;
  auto* entries = reinterpret_cast<Entry*>(region);
  uint64_t at = table;
  out->step = -2;
  out->first_layer = like.first_layer;
  out->last_layer = like.last_layer;
  out->ranges = like.ranges;
  out->tp = like.tp;
  out->tp_rank = like.tp_rank;
  out->tensors.clear();
  int i = 0;
  for (const auto& [key, t] : like.tensors) {  // map order: the table is sorted by key
    Entry& e = entries[i++];
    std::memset(&e, 0, sizeof e);
    std::memcpy(e.key, key.data(), key.size());
    e.dtype = static_cast<int32_t>(t.value.scalar_type());
    e.ndim = static_cast<int32_t>(t.value.dim());
    for (int d = 0; d < e.ndim; ++d) e.shape[d] = t.value.size(d);
    e.nbytes = static_cast<uint64_t>(t.value.nbytes());
    e.offset = at;
    at += 3 * Align(e.nbytes, 64);
    auto options = torch::TensorOptions().dtype(t.value.scalar_type());
    char* data = region + e.offset;
    TensorSnapshot v;
    v.value = torch::from_blob(data, t.value.sizes(), options);
    v.exp_avg = torch::from_blob(data + e.nbytes, t.value.sizes(), options);
    v.exp_avg_sq = torch::from_blob(data + 2 * e.nbytes, t.value.sizes(), options);
    out->tensors.emplace(key, std::move(v));
  }
  return Status::Ok();
}

void SnapshotArena::Begin(int slot) {
  SlotHeader& s = header()->slots[slot];
  __atomic_store_n(&s.state, kWriting, __ATOMIC_RELEASE);
  s.step = -2;
}

void SnapshotArena::Commit(int slot, const StageSnapshot& snap) {
  SlotHeader& s = header()->slots[slot];
  auto* entries = reinterpret_cast<Entry*>(base_ + s.offset);
  int i = 0;
  for (const auto& [key, t] : snap.tensors) {
    if (i < s.count) entries[i].adam_step = t.adam_step;
    ++i;
  }
  s.first_layer = snap.first_layer;
  s.last_layer = snap.last_layer;
  if (snap.ranges.size() <= static_cast<size_t>(kMaxRanges)) PutRanges(snap.ranges, &s.num_ranges, s.ranges);
  s.tp = snap.tp;
  s.tp_rank = snap.tp_rank;
  s.step = snap.step;
  s.lineage = lineage_;
  __atomic_store_n(&s.state, kComplete, __ATOMIC_RELEASE);
}

}  // namespace ob::runtime
