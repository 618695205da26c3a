// SnapshotArena (runtime/snapshot_arena.h): snapshots in a memfd that a
// later process maps again and finds intact, and a slot caught mid-write
// that reads as incomplete.
#include "torch_catch.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <vector>

#include "ob/runtime/snapshot_arena.h"

namespace {

using ob::runtime::SnapshotArena;
using ob::runtime::StageSnapshot;
using ob::runtime::TensorSnapshot;

StageSnapshot Like(int first, int last, int64_t width) {
  StageSnapshot s;
  s.first_layer = first;
  s.last_layer = last;
  for (int l = first; l <= last; ++l) {
    TensorSnapshot t;
    t.value = torch::empty({width, 3});
    s.tensors[std::to_string(l) + ".w"] = t;
  }
  TensorSnapshot tied;
  tied.value = torch::empty({5});
  s.tensors[StageSnapshot::kTied] = tied;
  return s;
}

// Fills `views` with values derived from `seed` and commits it as `step`.
void Write(SnapshotArena& arena, int slot, StageSnapshot& views, int64_t step, float seed) {
  arena.Begin(slot);
  float x = seed;
  for (auto& [key, t] : views.tensors) {
    t.value.fill_(x);
    t.exp_avg.fill_(x + 1);
    t.exp_avg_sq.fill_(x + 2);
    t.adam_step = static_cast<int64_t>(x);
    x += 10;
  }
  views.step = step;
  arena.Commit(slot, views);
}

}  // namespace

TEST_CASE("snapshots in a shared arena outlive the arena that wrote them") {
  const int fd = memfd_create("arena-test", MFD_CLOEXEC);
  REQUIRE(fd >= 0);
  {
    auto a = SnapshotArena::Open(fd, "test arena");
    REQUIRE(a.ok());
    StageSnapshot s0, s1;
    REQUIRE((*a)->Prepare(0, Like(2, 4, 7), &s0).ok());
    REQUIRE((*a)->Prepare(1, Like(2, 4, 7), &s1).ok());
    CHECK_FALSE((*a)->info(0).complete());
    Write(**a, 0, s0, 11, 1.0f);
    Write(**a, 1, s1, 12, 3.0f);
    (*a)->Begin(0);  // a writer killed while copying step 13 into slot 0
    s0.tensors.begin()->second.value.fill_(-1);
  }
  auto b = SnapshotArena::Open(fd, "test arena");
  REQUIRE(b.ok());
  CHECK_FALSE((*b)->info(0).complete());
  CHECK((*b)->SlotAt(11) == -1);
  REQUIRE((*b)->SlotAt(12) == 1);
  CHECK((*b)->info(1).first_layer == 2);
  CHECK((*b)->info(1).last_layer == 4);
  auto view = (*b)->View(1);
  REQUIRE(view.ok());
  CHECK(view->step == 12);
  REQUIRE(view->tensors.size() == 4);
  float x = 3.0f;
  for (const auto& [key, t] : view->tensors) {
    CHECK(t.value.sizes() == (key == StageSnapshot::kTied ? torch::IntArrayRef{5} : torch::IntArrayRef{7, 3}));
    CHECK(t.value.eq(x).all().item<bool>());
    CHECK(t.exp_avg.eq(x + 1).all().item<bool>());
    CHECK(t.exp_avg_sq.eq(x + 2).all().item<bool>());
    CHECK(t.adam_step == static_cast<int64_t>(x));
    x += 10;
  }
  CHECK_FALSE((*b)->View(0).ok());

  // A larger layout moves the slot; the other slot's views stay valid.
  StageSnapshot big;
  REQUIRE((*b)->Prepare(0, Like(0, 9, 1000), &big).ok());
  Write(**b, 0, big, 13, 5.0f);
  CHECK(view->tensors.at("2.w").value.eq(3.0f).all().item<bool>());
  CHECK((*b)->SlotAt(13) == 0);
  close(fd);
}

TEST_CASE("every snapshot carries the lineage its writer set, for the next process to see") {
  const int fd = memfd_create("arena-lineage", MFD_CLOEXEC);
  REQUIRE(fd >= 0);
  {
    auto a = SnapshotArena::Open(fd, "lineage arena");
    REQUIRE(a.ok());
    StageSnapshot s0, s1;
    REQUIRE((*a)->Prepare(0, Like(0, 1, 4), &s0).ok());
    REQUIRE((*a)->Prepare(1, Like(0, 1, 4), &s1).ok());
    (*a)->set_lineage(3);
    Write(**a, 0, s0, 30, 1.0f);  // before a rollback: lineage 3
    (*a)->set_lineage(7);
    Write(**a, 1, s1, 19, 2.0f);  // the rollback's checkpoint: lineage 7
  }
  auto b = SnapshotArena::Open(fd, "lineage arena");
  REQUIRE(b.ok());
  CHECK((*b)->info(0).step == 30);
  CHECK((*b)->info(0).lineage == 3);
  CHECK((*b)->info(1).step == 19);
  CHECK((*b)->info(1).lineage == 7);
  close(fd);
}

TEST_CASE("a descriptor that is not an arena is refused") {
  const int fd = memfd_create("not-arena", MFD_CLOEXEC);
  REQUIRE(fd >= 0);
  const std::string junk(8192, 'x');
  REQUIRE(write(fd, junk.data(), junk.size()) == static_cast<ssize_t>(junk.size()));
  auto a = SnapshotArena::Open(fd, "junk");
  REQUIRE_FALSE(a.ok());
  CHECK(a.status().message().find("not a snapshot arena") != std::string::npos);
  close(fd);
}

TEST_CASE("a restarted worker pins what its predecessor wrote, and every range whole pages once") {
  // On an H200 a worker restarted after kill -9 found its arena already
  // written and pinned none of it (pinning is per process, and only growth
  // was pinned): its snapshots went through pageable memory, 0.16 s of
  // every step on the training thread instead of 0.005.
  const int fd = memfd_create("arena-pin-test", MFD_CLOEXEC);
  REQUIRE(fd >= 0);
  std::mutex mu;  // the pin and unpin functions run on the arena's thread
  std::vector<std::pair<char*, size_t>> pinned;
  std::vector<char*> unpinned;
  auto pin = [&](void* p, size_t n) {
    std::lock_guard<std::mutex> lock(mu);
    pinned.emplace_back(static_cast<char*>(p), n);
    return true;
  };
  auto unpin = [&](void* p) {
    std::lock_guard<std::mutex> lock(mu);
    unpinned.push_back(static_cast<char*>(p));
  };
  const long page = sysconf(_SC_PAGESIZE);
  {
    auto first = SnapshotArena::Open(fd, "first worker");
    REQUIRE(first.ok());
    StageSnapshot s;
    REQUIRE((*first)->Prepare(0, Like(0, 2, 1001), &s).ok());  // 64-byte, not page, multiples
    Write(**first, 0, s, 3, 1.0f);
  }
  const uint64_t written = static_cast<uint64_t>(lseek(fd, 0, SEEK_END));
  CHECK(written % page == 0);
  {
    auto restarted = SnapshotArena::Open(fd, "restarted worker");
    REQUIRE(restarted.ok());
    (*restarted)->set_pin(true, pin, unpin);
    REQUIRE((*restarted)->WaitPinned());
    std::lock_guard<std::mutex> lock(mu);
    // Everything the first worker wrote: the header, then slot 0's region
    // on its own, so that the slot is never half locked.
    REQUIRE(pinned.size() == 2);
    CHECK(pinned[0].first + pinned[0].second == pinned[1].first);
    CHECK(pinned[0].second + pinned[1].second == written);
    CHECK((*restarted)->pinned_bytes() == written);
  }
  CHECK(unpinned.size() == 2);  // given back when the arena goes
  pinned.clear();
  unpinned.clear();
  {
    auto restarted = SnapshotArena::Open(fd, "restarted again");
    REQUIRE(restarted.ok());
    (*restarted)->set_pin(true, pin, unpin);
    StageSnapshot s;
    REQUIRE((*restarted)->Prepare(1, Like(0, 2, 1001), &s).ok());  // grows: only the new pages
    REQUIRE((*restarted)->WaitPinned());
    std::lock_guard<std::mutex> lock(mu);
    REQUIRE(pinned.size() == 3);
    for (size_t i = 1; i < pinned.size(); ++i) {
      CHECK(pinned[i].first == pinned[i - 1].first + pinned[i - 1].second);
    }
    for (const auto& [p, n] : pinned) {
      CHECK(reinterpret_cast<uintptr_t>(p) % page == 0);
      CHECK(n % page == 0);
    }
    CHECK(static_cast<uint64_t>(lseek(fd, 0, SEEK_END)) ==
          pinned[0].second + pinned[1].second + pinned[2].second);
  }
  CHECK(unpinned.size() == 3);
  // A failed pin leaves the arena pageable, and nothing is tried again.
  pinned.clear();
  unpinned.clear();
  {
    auto again = SnapshotArena::Open(fd, "third worker");
    REQUIRE(again.ok());
    std::atomic<int> tries{0};
    (*again)->set_pin(true, [&](void*, size_t) { return ++tries, false; }, unpin);
    CHECK_FALSE((*again)->WaitPinned());
    StageSnapshot s;
    REQUIRE((*again)->Prepare(0, Like(0, 2, 5000), &s).ok());
    CHECK_FALSE((*again)->WaitPinned());
    CHECK(tries == 1);
    CHECK((*again)->pinned_bytes() == 0);
  }
  CHECK(unpinned.empty());
  close(fd);
}

TEST_CASE("pinning the arena never holds up the worker that asked for it") {
  // An H100 worker restarted after kill -9 spent 8 of its 8.9 s of
  // recovery page-locking its arena before it copied anything back.
  std::mutex mu;  // before the arena: its thread uses them until it goes
  std::condition_variable cv;
  bool release = false;
  std::atomic<int> calls{0};
  auto let_go = [&] {
    {
      std::lock_guard<std::mutex> lock(mu);
      release = true;
    }
    cv.notify_all();
  };
  auto arena = SnapshotArena::Anonymous();
  REQUIRE(arena.ok());
  struct Guard {  // a failed check must not leave the arena's thread waiting
    std::function<void()> fn;
    ~Guard() { fn(); }
  } guard{let_go};
  StageSnapshot s;
  REQUIRE((*arena)->Prepare(0, Like(0, 1, 4000), &s).ok());
  (*arena)->set_pin(true, [&](void*, size_t) {
    ++calls;
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return release; });  // a lock that takes "seconds"
    return true;
  }, [](void*) {});
  // The caller goes on while the first range is still being locked: it
  // writes a snapshot into the pageable memory meanwhile.
  Write(**arena, 0, s, 7, 2.0f);
  CHECK((*arena)->info(0).step == 7);
  CHECK((*arena)->pinned_bytes() == 0);
  let_go();
  CHECK((*arena)->WaitPinned());
  CHECK(calls >= 1);
  auto view = (*arena)->View(0);
  REQUIRE(view.ok());
  CHECK(view->tensors.at("0.w").value[0][0].item<float>() == 2.0f);
}

TEST_CASE("prefaulting a shared region maps its pages and changes none of its bytes") {
  constexpr size_t kPages = 64;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE)), bytes = kPages * page;
  const int fd = ::memfd_create("ob-prefault-test", MFD_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, static_cast<off_t>(bytes)) == 0);
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  REQUIRE(p != MAP_FAILED);
  auto* c = static_cast<unsigned char*>(p);
  for (size_t i = 0; i < bytes / 2; i += 97) c[i] = static_cast<unsigned char>(i % 251 + 1);
  // Half written, half holes: none is resident in the second half yet.
  std::vector<unsigned char> resident(kPages);
  REQUIRE(::mincore(p, bytes, resident.data()) == 0);
  CHECK((resident.back() & 1) == 0);
  CHECK(SnapshotArena::Prefault(p, bytes));
  REQUIRE(::mincore(p, bytes, resident.data()) == 0);
  for (size_t k = 0; k < resident.size(); ++k) {
    INFO("page " << k);
    CHECK((resident[k] & 1) == 1);
  }
  bool same = true;
  for (size_t i = 0; i < bytes; ++i) {
    const unsigned char want = i < bytes / 2 && i % 97 == 0 ? static_cast<unsigned char>(i % 251 + 1) : 0;
    same = same && c[i] == want;
  }
  CHECK(same);
  ::munmap(p, bytes);
  ::close(fd);
}
