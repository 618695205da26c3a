// Checkpoint files and directories: the safetensors writer and reader, the
// commit protocol, and the offline operations (list, latest, verify,
// export, prune). Torch-free.
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "ob/ckpt/checkpoint.h"
#include "ob/ckpt/safetensors.h"
#include "ob/io/file.h"
#include "ob/io/message.h"
#include "ob/launch/master/commit_queue.h"

namespace {

namespace fs = std::filesystem;
using namespace ob::ckpt;
namespace pb = ob::pb;

// A fresh directory under TMPDIR, removed with the object.
// The temporaries (io::CreateTemporary: NAME.tmp.PID.N) left in `dir`.
std::vector<std::string> Temporaries(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.find(".tmp") != std::string::npos) out.push_back(name);
  }
  return out;
}

struct TempDir {
  std::string path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "ob-ckpt-test.XXXXXX").string();
    path = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    ob::io::RemoveTree(path, &ec);
  }
  std::string operator/(const std::string& name) const { return path + "/" + name; }
};

std::string Slurp(const std::string& path) {
  auto r = ob::io::ReadFile(path);
  REQUIRE(r.ok());
  return *r;
}

void Spit(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A file of 8-byte length + `json` + `data_bytes` zero bytes.
std::string RawFile(const std::string& json, size_t data_bytes, uint64_t length = UINT64_MAX) {
  if (length == UINT64_MAX) length = json.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(length >> (8 * i));
  return out + json + std::string(data_bytes, '\0');
}

std::vector<char> Bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<char> v(n);
  for (auto& c : v) c = static_cast<char>(rng());
  return v;
}

// Writes `step` through the library as `writers` ranks would: layer l goes
// to rank l % writers. `skip` layers are left out (an incomplete save).
void WriteStepFiles(const std::string& dir, int64_t step, int layers, int writers,
                    const std::vector<int>& skip = {}) {
  REQUIRE(BeginStep(dir, step).ok());
  for (int rank = 0; rank < writers; ++rank) {
    ob::pb::Manifest part;
    for (int l = rank; l < layers; l += writers) {
      if (std::find(skip.begin(), skip.end(), l) != skip.end()) continue;
      auto w = Bytes(64, static_cast<uint32_t>(step * 100 + l));
      auto m = Bytes(64, static_cast<uint32_t>(step * 100 + l + 50));
      std::vector<TensorView> t = {
          {std::to_string(l) + ".w", DType::kF32, {4, 4}, w.data(), 64},
          {std::to_string(l) + ".w.exp_avg", DType::kF32, {4, 4}, m.data(), 64},
          {std::to_string(l) + ".w.exp_avg_sq", DType::kF32, {4, 4}, m.data(), 64}};
      if (l == 0) {
        t.push_back({"tied", DType::kBF16, {8, 4}, w.data(), 64});
        t.push_back({"tied.exp_avg", DType::kF32, {4, 4}, m.data(), 64});
        t.push_back({"tied.exp_avg_sq", DType::kF32, {4, 4}, m.data(), 64});
      }
      auto f = WriteLayer(dir, step, l, t, {{std::to_string(l) + ".w.adam_step", "7"}});
      REQUIRE(f.ok());
      *part.add_files() = *f;
    }
    REQUIRE(WritePart(dir, step, rank, part).ok());
  }
}

pb::Manifest Base() {
  ob::pb::Manifest base;
  base.mutable_model()->set_name("gpt-test");
  base.set_data_seed(42);
  return base;
}

void SaveStep(const std::string& dir, int64_t step, int layers = 4) {
  WriteStepFiles(dir, step, layers, 2);
  auto m = Commit(dir, step, Base(), layers);
  REQUIRE(m.ok());
}

}  // namespace

// --- safetensors ------------------------------------------------------------

TEST_CASE("dtype names, sizes and parsing agree with the safetensors spelling") {
  const std::vector<std::tuple<DType, std::string, size_t>> all = {
      {DType::kF64, "F64", 8}, {DType::kF32, "F32", 4}, {DType::kF16, "F16", 2},
      {DType::kBF16, "BF16", 2}, {DType::kI64, "I64", 8}, {DType::kI32, "I32", 4},
      {DType::kI16, "I16", 2}, {DType::kI8, "I8", 1}, {DType::kU8, "U8", 1},
      {DType::kBool, "BOOL", 1}};
  for (const auto& [d, name, size] : all) {
    CHECK(DTypeName(d) == name);
    CHECK(DTypeSize(d) == size);
    auto p = ParseDType(name);
    REQUIRE(p.ok());
    CHECK(*p == d);
  }
  CHECK(ParseDType("f32").status().message() == "unknown dtype 'f32'");
}

TEST_CASE("safetensors round-trips every dtype, metadata and odd names") {
  TempDir t;
  const std::vector<DType> dtypes = {DType::kF64, DType::kF32, DType::kF16, DType::kBF16,
                                     DType::kI64, DType::kI32, DType::kI16, DType::kI8,
                                     DType::kU8,  DType::kBool};
  std::vector<std::vector<char>> data;
  std::vector<TensorView> views;
  for (size_t i = 0; i < dtypes.size(); ++i) {
    const std::vector<int64_t> shape = {static_cast<int64_t>(i + 1), 3};
    data.push_back(Bytes(DTypeSize(dtypes[i]) * (i + 1) * 3, static_cast<uint32_t>(i)));
    views.push_back({std::string("t.") + DTypeName(dtypes[i]), dtypes[i], shape, data.back().data(),
                     data.back().size()});
  }
  views.push_back({"scalar", DType::kF32, {}, data[1].data(), 4});
  views.push_back({"empty", DType::kF32, {0, 5}, nullptr, 0});
  views.push_back({"odd \"name\"\\ é\n", DType::kU8, {2}, data[0].data(), 2});
  const std::map<std::string, std::string> meta = {{"format", "pt"},
                                                   {"quote\"d", "line\nbreak \x01 ∑"}};
  const std::string path = t / "a.safetensors";
  uint64_t size = 0;
  std::string sum;
  REQUIRE(WriteSafetensors(path, views, meta, &size, &sum).ok());
  CHECK(Temporaries(t.path).empty());

  const std::string file = Slurp(path);
  CHECK(size == file.size());
  CHECK(sum == Checksum(file.data(), file.size()));
  CHECK(sum.rfind("xxh3:", 0) == 0);
  CHECK(sum.size() == 5 + 16);

  auto h = ReadSafetensorsHeader(path);
  REQUIRE(h.ok());
  CHECK(h->data_offset % 8 == 0);
  CHECK(file[8] == '{');
  CHECK(h->file_size == file.size());
  CHECK(h->metadata == meta);
  REQUIRE(h->tensors.size() == views.size());
  for (size_t i = 0; i < views.size(); ++i) {
    const auto& e = h->tensors[i];
    INFO(views[i].name);
    CHECK(e.name == views[i].name);
    CHECK(e.dtype == views[i].dtype);
    CHECK(e.shape == views[i].shape);
    CHECK(e.end - e.begin == views[i].bytes);
    std::vector<char> back(views[i].bytes);
    REQUIRE(ReadTensor(path, *h, e, back.data()).ok());
    if (views[i].bytes) CHECK(std::memcmp(back.data(), views[i].data, views[i].bytes) == 0);
  }
}

TEST_CASE("the writer refuses bad tensors and reports I/O errors without leftovers") {
  TempDir t;
  float x[4] = {1, 2, 3, 4};
  auto st = WriteSafetensors(t / "a", {{"a", DType::kF32, {2, 3}, x, 16}}, {}, nullptr, nullptr);
  CHECK(st.code() == ob::Code::kDataErr);
  CHECK_THAT(st.message(), Catch::Contains("tensor 'a' has 16 bytes, F32[2, 3] needs 24"));
  st = WriteSafetensors(t / "a", {{"a", DType::kF32, {4}, x, 16}, {"a", DType::kF32, {4}, x, 16}},
                        {}, nullptr, nullptr);
  CHECK_THAT(st.message(), Catch::Contains("duplicate tensor name 'a'"));
  st = WriteSafetensors(t / "a", {{"__metadata__", DType::kF32, {4}, x, 16}}, {}, nullptr, nullptr);
  CHECK_THAT(st.message(), Catch::Contains("reserved"));
  st = WriteSafetensors(t / "a", {{"a", DType::kF32, {-1}, x, 16}}, {}, nullptr, nullptr);
  CHECK_THAT(st.message(), Catch::Contains("bad shape F32[-1]"));
  CHECK_FALSE(fs::exists(t / "a"));

  st = WriteSafetensors(t / "no/such/dir/a", {{"a", DType::kF32, {4}, x, 16}}, {}, nullptr, nullptr);
  CHECK(st.code() == ob::Code::kIoErr);
  CHECK_THAT(st.message(), Catch::Contains("no/such/dir/a: cannot create: No such file or directory"));

  // A write that fails half-way (here: past a file-size limit, EFBIG, as a
  // full disk fails with ENOSPC) leaves no temporary file.
  {
    struct rlimit old {};
    REQUIRE(getrlimit(RLIMIT_FSIZE, &old) == 0);
    auto* const xfsz = ::signal(SIGXFSZ, SIG_IGN);  // the write fails instead of killing us
    struct rlimit small = old;
    small.rlim_cur = 4096;
    REQUIRE(setrlimit(RLIMIT_FSIZE, &small) == 0);
    std::vector<char> big(1 << 16);
    st = WriteSafetensors(t / "full", {{"a", DType::kU8, {1 << 16}, big.data(), big.size()}}, {},
                          nullptr, nullptr);
    setrlimit(RLIMIT_FSIZE, &old);
    ::signal(SIGXFSZ, xfsz);
    CHECK(st.code() == ob::Code::kIoErr);
    CHECK_THAT(st.message(), Catch::Contains("full: write failed: File too large"));
    CHECK(Temporaries(t.path).empty());
    CHECK_FALSE(fs::exists(t / "full"));
  }
}

TEST_CASE("two writers of one file never share a temporary: each result is whole") {
  // Both wrote TARGET.tmp: the second's open truncated the first's bytes,
  // the first renamed the file the second still wrote, and the second's
  // rename failed; a file of zeros and two writers' bytes, the first said ok.
  TempDir t;
  const std::string path = t / "one.safetensors";
  std::vector<char> a(4096, 'a'), b(4096, 'b');
  auto first = SafetensorsWriter::Open(path, {{"x", DType::kU8, {4096}}}, {});
  auto second = SafetensorsWriter::Open(path, {{"x", DType::kU8, {4096}}}, {});
  REQUIRE(first.ok());
  REQUIRE(second.ok());
  REQUIRE((*first)->Append(a.data(), 2048).ok());
  REQUIRE((*second)->Append(b.data(), 4096).ok());
  REQUIRE((*first)->Append(a.data(), 2048).ok());
  std::string sum_a, sum_b;
  REQUIRE((*first)->Finish(nullptr, &sum_a).ok());
  const std::string file_a = Slurp(path);
  CHECK(Checksum(file_a.data(), file_a.size()) == sum_a);
  REQUIRE((*second)->Finish(nullptr, &sum_b).ok());
  const std::string file_b = Slurp(path);
  CHECK(Checksum(file_b.data(), file_b.size()) == sum_b);
  CHECK(file_b.substr(file_b.size() - 4096) == std::string(4096, 'b'));
  CHECK(Temporaries(t.path).empty());
}

TEST_CASE("the streaming writer takes data in pieces and checks the count") {
  TempDir t;
  std::vector<char> d = Bytes(40, 1);
  auto w = SafetensorsWriter::Open(t / "s", {{"a", DType::kF32, {2, 2}}, {"b", DType::kI64, {3}}},
                                   {});
  REQUIRE(w.ok());
  CHECK((*w)->tensors()[1].begin == 16);
  CHECK((*w)->tensors()[1].end == 40);
  for (size_t i = 0; i < 40; i += 7) REQUIRE((*w)->Append(d.data() + i, std::min<size_t>(7, 40 - i)).ok());
  CHECK((*w)->Append(d.data(), 1).code() == ob::Code::kDataErr);
  uint64_t size = 0;
  REQUIRE((*w)->Finish(&size, nullptr).ok());
  auto h = ReadSafetensorsHeader(t / "s");
  REQUIRE(h.ok());
  CHECK(size == h->file_size);

  auto short_writer = SafetensorsWriter::Open(t / "short", {{"a", DType::kF32, {2}}}, {});
  REQUIRE(short_writer.ok());
  REQUIRE((*short_writer)->Append(d.data(), 4).ok());
  CHECK_THAT((*short_writer)->Finish(nullptr, nullptr).message(),
             Catch::Contains("only 4 of 8 data bytes"));
  CHECK_FALSE(fs::exists(t / "short"));
  CHECK(Temporaries(t.path).empty());
}

TEST_CASE("the reader accepts what the format allows") {
  TempDir t;
  // Whitespace, escapes, an empty metadata object, key order, padding.
  const std::string json =
      " { \"b\" : {\"shape\":[2],\"dtype\":\"U8\",\"data_offsets\":[4,6]},\n"
      "\"__metadata__\":{},\"\\u00e9\\ud83d\\ude00\":{\"dtype\":\"I16\",\"shape\":[2],"
      "\"data_offsets\":[0,4]}}   ";
  Spit(t / "ok", RawFile(json, 6));
  auto h = ReadSafetensorsHeader(t / "ok");
  REQUIRE(h.ok());
  REQUIRE(h->tensors.size() == 2);
  CHECK(h->tensors[0].name == "\xc3\xa9\xf0\x9f\x98\x80");  // by offset: é😀 first
  CHECK(h->tensors[1].name == "b");
  Spit(t / "empty", RawFile("{}", 0));
  CHECK(ReadSafetensorsHeader(t / "empty").ok());
}

TEST_CASE("malformed safetensors headers are each refused with a precise message") {
  TempDir t;
  const std::string a16 = R"("a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]})";
  struct Case {
    const char* what;
    std::string bytes;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"too short", "abc", "too short for a safetensors file (3 bytes)"},
      {"length beyond the file", RawFile("{}", 0, 1000),
       "header length 1000 is beyond the end of the file (10 bytes)"},
      {"empty header", RawFile("", 0), "malformed header JSON: expected '{' to open the header object, found the end"},
      {"not an object", RawFile("[]", 0), "at byte 8: expected '{'"},
      {"cut JSON", RawFile("{\"a\":", 0), "tensor 'a' must be an object, found the end"},
      {"trailing garbage", RawFile("{} x", 0), "unexpected text after the header object"},
      {"missing comma", RawFile("{" + a16 + " \"b\":1}", 16), "expected ',' or '}'"},
      {"unknown dtype", RawFile(R"({"a":{"dtype":"F8","shape":[2],"data_offsets":[0,2]}})", 2),
       "tensor 'a': unknown dtype 'F8'"},
      {"offsets vs shape", RawFile(R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", 12),
       "tensor 'a': data_offsets [0, 12] hold 12 bytes, F32[2, 2] needs 16"},
      {"reversed offsets", RawFile(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", 4),
       "data_offsets [4, 0] end before they begin"},
      {"overlap",
       RawFile("{" + a16 + R"(,"b":{"dtype":"U8","shape":[8],"data_offsets":[8,16]}})", 16),
       "tensors 'a' and 'b' overlap"},
      {"beyond the file", RawFile("{" + a16 + "}", 8),
       "tensor 'a': data_offsets [0, 16] lie beyond the end of the file (the data section holds 8 bytes)"},
      {"gap", RawFile(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})", 8),
       "4 unused bytes before tensor 'a'"},
      {"bytes after", RawFile("{" + a16 + "}", 20), "4 bytes after the last tensor"},
      {"duplicate name", RawFile("{" + a16 + "," + a16 + "}", 16), "duplicate tensor name 'a'"},
      {"negative dim", RawFile(R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})", 0),
       "tensor 'a' shape must not be negative"},
      {"fractional dim", RawFile(R"({"a":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}})", 1),
       "tensor 'a' shape must be an integer"},
      {"huge dim", RawFile(R"({"a":{"dtype":"U8","shape":[99999999999999999999],"data_offsets":[0,1]}})", 1),
       "tensor 'a' shape is too large"},
      {"overflowing shape",
       RawFile(R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,1]}})", 1),
       "shape F64[4294967296, 4294967296] is too large"},
      {"leading zero", RawFile(R"({"a":{"dtype":"U8","shape":[01],"data_offsets":[0,1]}})", 1),
       "leading zero"},
      {"missing field", RawFile(R"({"a":{"dtype":"U8","shape":[1]}})", 1), "tensor 'a': no data_offsets"},
      {"unknown field", RawFile(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1}})", 1),
       "tensor 'a': unknown field 'x'"},
      {"three offsets", RawFile(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}})", 1),
       "data_offsets must be [begin, end]"},
      {"metadata number", RawFile(R"({"__metadata__":{"k":1}})", 0),
       "__metadata__ value of 'k' is not a string"},
      {"metadata twice", RawFile(R"({"__metadata__":{},"__metadata__":{}})", 0),
       "__metadata__ given twice"},
      {"bad escape", RawFile(R"({"a\q":{}})", 0), "bad escape '\\q'"},
      {"lone surrogate", RawFile(R"({"\ud800x":{}})", 0), "high surrogate without its low half"},
      {"control character", RawFile("{\"a\x01\":{}}", 0), "control character in a string"},
      {"bad UTF-8", RawFile("{\"\xff\":{}}", 0), "header is not valid UTF-8 (byte 10)"},
  };
  for (const auto& c : cases) {
    INFO(c.what);
    Spit(t / "bad.safetensors", c.bytes);
    auto h = ReadSafetensorsHeader(t / "bad.safetensors");
    REQUIRE_FALSE(h.ok());
    CHECK(h.status().code() == ob::Code::kDataErr);
    CHECK(h.status().message().rfind(t / "bad.safetensors: ", 0) == 0);
    CHECK_THAT(h.status().message(), Catch::Contains(c.message));
  }
  auto missing = ReadSafetensorsHeader(t / "missing");
  CHECK(missing.status().code() == ob::Code::kNoInput);
}

TEST_CASE("every truncation of a safetensors file is refused") {
  TempDir t;
  float x[6] = {1, 2, 3, 4, 5, 6};
  REQUIRE(WriteSafetensors(t / "f", {{"a", DType::kF32, {6}, x, 24}}, {{"k", "v"}}, nullptr, nullptr).ok());
  const std::string bytes = Slurp(t / "f");
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    INFO("cut at " << cut);
    Spit(t / "cut", bytes.substr(0, cut));
    auto h = ReadSafetensorsHeader(t / "cut");
    CHECK(h.status().code() == ob::Code::kDataErr);
  }
}

// --- checkpoint directories --------------------------------------------------

TEST_CASE("Commit merges every part and moves latest") {
  TempDir t;
  const std::string dir = t / "ck";
  WriteStepFiles(dir, 5, 6, 3);
  CHECK(BeginStep(dir, 5).ok());  // idempotent, as every writer calls it
  ob::pb::Manifest base = Base();
  base.set_plan("plan-bytes");
  auto m = Commit(dir, 5, base, 6);
  REQUIRE(m.ok());
  CHECK(m->step() == 5);
  CHECK(m->num_layers() == 6);
  CHECK(m->plan() == "plan-bytes");
  CHECK(m->data_seed() == 42);
  CHECK(m->created_unix_ms() > 0);
  REQUIRE(m->files_size() == 6);
  for (int l = 0; l < 6; ++l) {
    CHECK(m->files(l).path() == LayerFileName(l));
    CHECK(m->files(l).layers(0) == static_cast<uint32_t>(l));
  }
  CHECK(StepDirName(5) == "step-000000000005");
  CHECK(fs::is_directory(dir + "/step-000000000005"));
  CHECK_FALSE(fs::exists(dir + "/step-000000000005.partial"));
  CHECK(Slurp(dir + "/latest") == "step-000000000005\n");
  CHECK(fs::exists(dir + "/step-000000000005/manifest.json"));
  for (const auto& e : fs::directory_iterator(dir + "/step-000000000005"))
    CHECK(e.path().filename().string().rfind("part-", 0) != 0);
  auto loaded = LoadManifest(dir + "/step-000000000005");
  REQUIRE(loaded.ok());
  CHECK(loaded->SerializeAsString() == m->SerializeAsString());
  CHECK(Verify(dir + "/step-000000000005").ok());

  // A run resumed from an older checkpoint saves step 5 again: it replaces it.
  WriteStepFiles(dir, 5, 6, 2);
  base.set_data_seed(43);
  REQUIRE(Commit(dir, 5, base, 6).ok());
  CHECK(LoadManifest(dir + "/step-000000000005")->data_seed() == 43);
  CHECK(Verify(dir + "/step-000000000005").ok());
  CHECK(fs::directory_iterator(dir) != fs::directory_iterator());
  for (const auto& e : fs::directory_iterator(dir))
    CHECK((e.path().filename() == "latest" || e.path().filename() == "step-000000000005"));
}

TEST_CASE("Commit refuses an incomplete or inconsistent save and commits nothing") {
  TempDir t;
  const std::string dir = t / "ck";
  SaveStep(dir, 1);
  WriteStepFiles(dir, 2, 8, 2, {3, 7});
  auto m = Commit(dir, 2, Base(), 8);
  CHECK(m.status().code() == ob::Code::kDataErr);
  CHECK_THAT(m.status().message(), Catch::EndsWith("step-000000000002.partial: incomplete: layers 3, 7 missing"));
  CHECK_FALSE(fs::exists(dir + "/step-000000000002"));
  CHECK(Slurp(dir + "/latest") == "step-000000000001\n");

  // A layer in two parts.
  ob::pb::Manifest extra;
  auto f = WriteLayer(dir, 2, 3, {}, {});
  REQUIRE(f.ok());
  *extra.add_files() = *f;
  f->set_path("copy.safetensors");
  fs::copy_file(dir + "/step-000000000002.partial/" + LayerFileName(3),
                dir + "/step-000000000002.partial/copy.safetensors");
  *extra.add_files() = *f;
  REQUIRE(WritePart(dir, 2, 9, extra).ok());
  m = Commit(dir, 2, Base(), 8);
  CHECK_THAT(m.status().message(), Catch::Contains("layer 3 is in both layer-0003.safetensors (part-9.pb) and copy.safetensors (part-9.pb)"));

  // A file shorter than its part says.
  extra.Clear();
  f = WriteLayer(dir, 2, 3, {}, {});
  *extra.add_files() = *f;
  f = WriteLayer(dir, 2, 7, {}, {});
  *extra.add_files() = *f;
  REQUIRE(WritePart(dir, 2, 9, extra).ok());
  fs::resize_file(dir + "/step-000000000002.partial/" + LayerFileName(7), 3);
  m = Commit(dir, 2, Base(), 8);
  CHECK_THAT(m.status().message(), Catch::Contains("layer-0007.safetensors: 3 bytes, part-9.pb says"));
  // Layers the model does not have.
  m = Commit(dir, 2, Base(), 4);
  CHECK_THAT(m.status().message(), Catch::Contains("is outside 0..3"));
  CHECK_FALSE(fs::exists(dir + "/step-000000000002"));

  CHECK(Commit(dir, 3, Base(), 8).status().code() == ob::Code::kNoInput);
  // What a killed run left is cleared before the next one starts.
  auto removed = RemovePartials(dir);
  REQUIRE(removed.ok());
  CHECK(removed->size() == 1);
  CHECK_FALSE(fs::exists(dir + "/step-000000000002.partial"));
}

TEST_CASE("List and Latest tell complete checkpoints from the rest") {
  TempDir t;
  const std::string dir = t / "ck";
  CHECK(Latest(dir).status().code() == ob::Code::kNoInput);
  CHECK(List(dir).status().code() == ob::Code::kNoInput);
  fs::create_directories(dir);
  CHECK(Latest(dir).status().code() == ob::Code::kNoInput);
  SaveStep(dir, 1);
  SaveStep(dir, 2);
  SaveStep(dir, 3);
  WriteStepFiles(dir, 4, 4, 2);  // being written
  CHECK(*Latest(dir) == dir + "/step-000000000003");

  auto all = List(dir);
  REQUIRE(all.ok());
  REQUIRE(all->size() == 4);
  CHECK((*all)[2].complete);
  CHECK((*all)[2].latest);
  CHECK_FALSE((*all)[3].complete);
  CHECK((*all)[3].path == dir + "/step-000000000004.partial");
  uint64_t expect = 0;
  auto manifest = LoadManifest(dir + "/step-000000000003");
  REQUIRE(manifest.ok());
  for (const auto& f : manifest->files()) expect += f.size();
  CHECK((*all)[2].bytes == expect);

  // latest names a damaged checkpoint: the newest complete one is used.
  fs::remove(dir + "/step-000000000003/" + LayerFileName(2));
  CHECK(*Latest(dir) == dir + "/step-000000000002");
  CHECK_FALSE((*List(dir))[2].complete);
  // latest names an older complete one: it wins (it is what was committed last).
  Spit(dir + "/latest", "step-000000000001\n");
  CHECK(*Latest(dir) == dir + "/step-000000000001");
  // latest is garbage, names a partial, or is missing: newest complete.
  for (const char* text : {"../../etc\n", "step-000000000004.partial\n", "", "step-000000000009\n"}) {
    Spit(dir + "/latest", text);
    CHECK(*Latest(dir) == dir + "/step-000000000002");
  }
  fs::remove(dir + "/latest");
  CHECK(*Latest(dir) == dir + "/step-000000000002");
  // A manifest of another step under this step's name is not complete.
  fs::rename(dir + "/step-000000000002", dir + "/step-000000000007");
  CHECK(*Latest(dir) == dir + "/step-000000000001");
}

TEST_CASE("LoadManifest refuses paths that leave the checkpoint directory") {
  TempDir t;
  const std::string dir = t / "ck";
  SaveStep(dir, 1);
  const std::string ckpt = dir + "/step-000000000001";
  const pb::Manifest good = *LoadManifest(ckpt);
  for (const auto& [path, message] : std::vector<std::pair<std::string, std::string>>{
           {"/etc/passwd", "file path '/etc/passwd' leaves the checkpoint directory (absolute)"},
           {"../outside", "file path '../outside' leaves the checkpoint directory (contains '..')"},
           {"a/../../b", "leaves the checkpoint directory (contains '..')"},
           {"", "file path '' is empty"},
           {"a//b", "is not a plain relative path"},
           {LayerFileName(1), "is listed twice"}}) {
    INFO(path);
    pb::Manifest m = good;
    m.mutable_files(0)->set_path(path);
    Spit(ckpt + "/manifest.pb", ob::io::SerializeMessage(m, ob::io::kManifestFormatVersion));
    auto r = LoadManifest(ckpt);
    CHECK(r.status().code() == ob::Code::kDataErr);
    CHECK_THAT(r.status().message(), Catch::Contains(ckpt + "/manifest.pb: "));
    CHECK_THAT(r.status().message(), Catch::Contains(message));
    CHECK(Verify(ckpt).code() == ob::Code::kDataErr);
  }
  pb::Manifest m = good;
  m.mutable_files()->RemoveLast();
  Spit(ckpt + "/manifest.pb", ob::io::SerializeMessage(m, ob::io::kManifestFormatVersion));
  CHECK_THAT(LoadManifest(ckpt).status().message(), Catch::Contains("4 layers, but the files list 3"));
  m = good;
  m.mutable_files(3)->set_layers(0, 7);
  Spit(ckpt + "/manifest.pb", ob::io::SerializeMessage(m, ob::io::kManifestFormatVersion));
  CHECK_THAT(LoadManifest(ckpt).status().message(), Catch::Contains("holds layer 7 of 4"));
  m.mutable_files(3)->set_layers(0, 1);
  Spit(ckpt + "/manifest.pb", ob::io::SerializeMessage(m, ob::io::kManifestFormatVersion));
  CHECK_THAT(LoadManifest(ckpt).status().message(), Catch::Contains("layer 1 is in two files"));
  m.set_num_layers(4000000000u);  // hostile: refused without sizing anything by it
  Spit(ckpt + "/manifest.pb", ob::io::SerializeMessage(m, ob::io::kManifestFormatVersion));
  CHECK_THAT(LoadManifest(ckpt).status().message(), Catch::Contains("4000000000 layers"));
  fs::remove(ckpt + "/manifest.pb");
  CHECK_THAT(LoadManifest(ckpt).status().message(), Catch::Contains("manifest.pb: missing"));
  CHECK(LoadManifest(t / "nowhere").status().code() == ob::Code::kNoInput);
}

TEST_CASE("Verify names the damaged file") {
  TempDir t;
  const std::string dir = t / "ck";
  SaveStep(dir, 1);
  const std::string ckpt = dir + "/step-000000000001";
  const std::string victim = ckpt + "/" + LayerFileName(1);
  const std::string original = Slurp(victim);
  uint64_t last_done = 0, last_total = 0;
  REQUIRE(Verify(ckpt, [&](uint64_t d, uint64_t t) { last_done = d, last_total = t; }).ok());
  CHECK(last_done == last_total);
  CHECK(last_total > 0);

  std::string flipped = original;
  flipped[original.size() - 5] ^= 0x10;
  Spit(victim, flipped);
  auto st = Verify(ckpt);
  CHECK(st.code() == ob::Code::kDataErr);
  CHECK_THAT(st.message(), Catch::StartsWith(victim + ": checksum mismatch"));

  Spit(victim, original.substr(0, original.size() - 1));
  CHECK_THAT(Verify(ckpt).message(), Catch::EndsWith("(truncated)"));

  fs::remove(victim);
  CHECK(Verify(ckpt).message() == victim + ": missing");

  // A symbolic link out of the checkpoint, even to an identical file.
  Spit(t / "outside", original);
  fs::create_symlink(t / "outside", victim);
  CHECK_THAT(Verify(ckpt).message(), Catch::Contains("leaves the checkpoint directory"));
  fs::remove(victim);
  Spit(victim, original);
  CHECK(Verify(ckpt).ok());
}

TEST_CASE("NewestVerified passes over damaged and refused checkpoints, newest first") {
  TempDir t;
  const std::string dir = t / "ck";
  CHECK(NewestVerified(dir).status().code() == ob::Code::kNoInput);
  fs::create_directories(dir);
  CHECK(NewestVerified(dir).status().code() == ob::Code::kNoInput);
  for (int64_t step : {1, 2, 3}) SaveStep(dir, step);
  auto v = NewestVerified(dir);
  REQUIRE(v.ok());
  CHECK(v->path == dir + "/step-000000000003");
  CHECK(v->manifest.step() == 3);
  CHECK(v->skipped.empty());

  // The newest damaged (a flipped byte only Verify sees), the next refused.
  const std::string victim = dir + "/step-000000000003/" + LayerFileName(2);
  std::string bytes = Slurp(victim);
  bytes[bytes.size() - 3] ^= 0x01;
  Spit(victim, bytes);
  auto refuse2 = [](const ob::pb::Manifest& m) { return m.step() == 2 ? std::string("not ours") : ""; };
  v = NewestVerified(dir, refuse2);
  REQUIRE(v.ok());
  CHECK(v->path == dir + "/step-000000000001");
  REQUIRE(v->skipped.size() == 2);
  CHECK_THAT(v->skipped[0], Catch::StartsWith(victim + ": checksum mismatch"));
  CHECK(v->skipped[1] == dir + "/step-000000000002: not ours");

  // A truncated file in the newest (issue 54): passed over with its reason
  // too, not in silence.
  Spit(victim, bytes.substr(0, bytes.size() / 2));
  v = NewestVerified(dir, refuse2);
  REQUIRE(v.ok());
  CHECK(v->path == dir + "/step-000000000001");
  REQUIRE(v->skipped.size() == 2);
  CHECK_THAT(v->skipped[0], Catch::StartsWith(victim + ": ") && Catch::Contains("(truncated)"));

  // None qualifies: kDataErr naming the newest and why (never "none").
  auto none = NewestVerified(dir, [](const ob::pb::Manifest&) { return std::string("another job"); });
  CHECK(none.status().code() == ob::Code::kDataErr);
  CHECK_THAT(none.status().message(), Catch::Contains("none of 3 checkpoint(s) can be used (newest: " + victim));
}

TEST_CASE("a refuted checkpoint is kept, and nothing resumes from it or counts it") {
  TempDir t;
  const std::string dir = t / "ck";
  for (int64_t step : {1, 2, 3, 4}) SaveStep(dir, step);
  const std::string three = StepPath(dir, 3), four = StepPath(dir, 4);
  CHECK(RefutedWhy(four).empty());
  CHECK(Refute(dir + "/step-000000000009", "x").code() == ob::Code::kNoInput);
  REQUIRE(Refute(four, "trained on host h4's copy,\nwhich differs").ok());
  REQUIRE(Refute(three, "the same").ok());
  CHECK(RefutedWhy(four) == "trained on host h4's copy, which differs");  // one line
  // Verify says so before it reads a file; every file is still there.
  const ob::Status v = Verify(four);
  CHECK(v.code() == ob::Code::kDataErr);
  CHECK(v.message() == four + ": refuted: trained on host h4's copy, which differs (remove " + four +
                           "/REFUTED to use it anyway)");
  CHECK(fs::exists(four + "/" + LayerFileName(3)));
  CHECK(LoadManifest(four).ok());
  CHECK(NotRefuted(four).message() == v.message());
  CHECK(NotRefuted(StepPath(dir, 2)).ok());
  // Nor exported, to safetensors or to Hugging Face's layout: nothing written.
  const ob::Status out = Export(four, t / "w.safetensors", false);
  CHECK(out.message() == v.message());
  CHECK_FALSE(fs::exists(t / "w.safetensors"));
  // `latest` named step 4: it names the newest good one now, and a resume
  // says which newer ones it passed over.
  CHECK(Slurp(dir + "/latest") == "step-000000000002\n");
  {
    auto v = NewestVerified(dir);
    REQUIRE(v.ok());
    CHECK(v->path == StepPath(dir, 2));
    CHECK(v->skipped == std::vector<std::string>{Verify(four).message(), Verify(three).message()});
  }
  // A resume passes over both; Latest too, were `latest` to name step 4.
  Spit(dir + "/latest", "step-000000000004\n");
  auto newest = NewestVerified(dir);
  REQUIRE(newest.ok());
  CHECK(newest->path == StepPath(dir, 2));
  REQUIRE(newest->skipped.size() == 2);
  CHECK_THAT(newest->skipped[0], Catch::StartsWith(four + ": refuted: trained on host h4's copy"));
  CHECK(*Latest(dir) == StepPath(dir, 2));
  // List tells them apart; they are complete still.
  auto all = List(dir);
  REQUIRE(all.ok());
  REQUIRE(all->size() == 4);
  CHECK(all->at(3).complete);
  CHECK(all->at(3).refuted == "trained on host h4's copy, which differs");
  CHECK(all->at(1).refuted.empty());
  // Prune keeps the newest good one and leaves the refuted alone.
  auto removed = Prune(dir, 1);
  REQUIRE(removed.ok());
  CHECK(*removed == std::vector<std::string>{StepPath(dir, 1)});
  CHECK(fs::exists(three));
  CHECK(fs::exists(four));
  // Saving the step again (a resume from step 2 gets there) replaces it, verdict and all.
  SaveStep(dir, 4);
  CHECK(RefutedWhy(four).empty());
  CHECK(Verify(four).ok());
  CHECK(*Latest(dir) == four);
  // None left to name: no `latest` (a resume starts from none of them).
  {
    const std::string solo = t / "solo";
    SaveStep(solo, 1);
    REQUIRE(Refute(StepPath(solo, 1) + "/", "bad").ok());
    CHECK_FALSE(fs::exists(solo + "/latest"));
    CHECK(Latest(solo).status().code() == ob::Code::kNoInput);
  }
  // An empty or unreadable file still refutes.
  Spit(three + "/REFUTED", "");
  CHECK(RefutedWhy(three) == "no reason given");
  fs::remove(three + "/REFUTED");
  fs::create_directory(three + "/REFUTED");
  CHECK(RefutedWhy(three) == "a REFUTED that is not a readable plain file");
  fs::remove(three + "/REFUTED");
  // Planted as a link to an endless device, or as a FIFO: no hang, no flood.
  fs::create_symlink("/dev/zero", three + "/REFUTED");
  CHECK_THAT(RefutedWhy(three), Catch::StartsWith("a REFUTED that cannot be opened"));
  fs::remove(three + "/REFUTED");
  REQUIRE(mkfifo((three + "/REFUTED").c_str(), 0600) == 0);
  CHECK(RefutedWhy(three) == "a REFUTED that is not a readable plain file");
  CHECK(Verify(three).code() == ob::Code::kDataErr);
}

TEST_CASE("a FIFO or a device planted as latest or a manifest neither hangs nor floods a reader") {
  TempDir t;
  const std::string dir = t / "ck";
  SaveStep(dir, 1);
  SaveStep(dir, 2);
  fs::remove(dir + "/latest");
  fs::create_symlink("/dev/zero", dir + "/latest");  // before: read until memory ran out
  CHECK(*Latest(dir) == StepPath(dir, 2));
  fs::remove(StepPath(dir, 2) + "/manifest.pb");
  REQUIRE(mkfifo((StepPath(dir, 2) + "/manifest.pb").c_str(), 0600) == 0);  // before: its open waited forever
  auto all = List(dir);
  REQUIRE(all.ok());
  CHECK(all->at(0).complete);
  CHECK_FALSE(all->at(1).complete);
  const ob::Status v = Verify(StepPath(dir, 2));
  CHECK(v.code() == ob::Code::kDataErr);
  CHECK(v.message() == StepPath(dir, 2) + "/manifest.pb: not a regular file (a FIFO)");
  CHECK(*Latest(dir) == StepPath(dir, 1));
  auto newest = NewestVerified(dir);
  REQUIRE(newest.ok());
  CHECK(newest->path == StepPath(dir, 1));
}

TEST_CASE("Export streams weights, and moments on request") {
  TempDir t;
  const std::string dir = t / "ck";
  SaveStep(dir, 3);
  const std::string ckpt = dir + "/step-000000000003";
  REQUIRE(Export(ckpt, t / "w.safetensors", false).ok());
  auto h = ReadSafetensorsHeader(t / "w.safetensors");
  REQUIRE(h.ok());
  std::vector<std::string> names;
  for (const auto& e : h->tensors) names.push_back(e.name);
  CHECK(names == std::vector<std::string>{"0.w", "tied", "1.w", "2.w", "3.w"});
  CHECK(h->metadata.at("format") == "pt");
  CHECK(h->metadata.at("ob.step") == "3");
  CHECK(h->metadata.count("0.w.adam_step") == 0);
  // Same bytes as the layer file holds.
  auto src = ReadSafetensorsHeader(ckpt + "/" + LayerFileName(2));
  std::vector<char> a(64), b(64);
  REQUIRE(ReadTensor(ckpt + "/" + LayerFileName(2), *src, src->tensors[0], a.data()).ok());
  REQUIRE(ReadTensor(t / "w.safetensors", *h, h->tensors[3], b.data()).ok());
  CHECK(a == b);

  REQUIRE(Export(ckpt, t / "all.safetensors", true).ok());
  auto all = ReadSafetensorsHeader(t / "all.safetensors");
  REQUIRE(all.ok());
  CHECK(all->tensors.size() == 4 * 3 + 3);
  CHECK(all->metadata.at("2.w.adam_step") == "7");

  // A damaged source: nothing is written.
  std::string bytes = Slurp(ckpt + "/" + LayerFileName(3));
  bytes[bytes.size() - 1] ^= 1;
  Spit(ckpt + "/" + LayerFileName(3), bytes);
  auto st = Export(ckpt, t / "bad.safetensors", false);
  CHECK(st.code() == ob::Code::kDataErr);
  CHECK_THAT(st.message(), Catch::Contains(LayerFileName(3) + ": checksum mismatch"));
  CHECK_FALSE(fs::exists(t / "bad.safetensors"));
  CHECK(Temporaries(t.path).empty());
}

TEST_CASE("Prune keeps the newest, latest's and those being written") {
  TempDir t;
  const std::string dir = t / "ck";
  for (int s = 1; s <= 6; ++s) SaveStep(dir, s);
  WriteStepFiles(dir, 7, 4, 2);  // being written
  CHECK(Prune(dir, 0).status().code() == ob::Code::kUsage);

  auto removed = Prune(dir, 3);
  REQUIRE(removed.ok());
  CHECK(*removed == std::vector<std::string>{dir + "/step-000000000001", dir + "/step-000000000002",
                                             dir + "/step-000000000003"});
  CHECK(fs::exists(dir + "/step-000000000007.partial"));
  for (int s = 4; s <= 6; ++s) CHECK(fs::exists(StepPath(dir, s)));

  // latest names an old one: it stays; the newest complete one always stays.
  Spit(dir + "/latest", "step-000000000004\n");
  removed = Prune(dir, 1);
  REQUIRE(removed.ok());
  CHECK(*removed == std::vector<std::string>{dir + "/step-000000000005"});
  CHECK(fs::exists(StepPath(dir, 4)));
  CHECK(fs::exists(StepPath(dir, 6)));
  CHECK(fs::exists(dir + "/step-000000000007.partial"));

  // A damaged newest one does not count as the newest complete one.
  fs::remove(StepPath(dir, 6) + "/manifest.pb");
  removed = Prune(dir, 1);
  REQUIRE(removed.ok());
  CHECK(removed->empty());
  CHECK(fs::exists(StepPath(dir, 4)));
  CHECK(fs::exists(StepPath(dir, 6)));
}

// --- the master's commit queue ---------------------------------------------

TEST_CASE("CommitQueue commits a step once every rank wrote it, in order, with retention") {
  TempDir t;
  const std::string dir = t / "ck";
  ob::launch::CommitQueue q(dir, 2, 4);
  int bases = 0;
  auto base = [&](int64_t step) {
    ++bases;
    pb::Manifest m = Base();
    m.set_samples_seen(static_cast<uint64_t>(step) * 10);
    return m;
  };
  auto drain = [&] {
    std::vector<int64_t> done;
    while (!q.idle()) {
      if (auto o = q.Poll(base, true)) {
        REQUIRE(o->manifest.ok());
        CHECK(o->manifest->samples_seen() == static_cast<uint64_t>(o->step) * 10);
        CHECK(o->commit_ms >= 0);
        done.push_back(o->step);
      }
    }
    return done;
  };

  WriteStepFiles(dir, 1, 4, 2);
  q.Part(1, 0, 2);
  q.Part(1, 0, 2);  // a repeated report counts once
  CHECK(q.idle());
  q.Part(1, 1, 2);
  CHECK_FALSE(q.idle());
  CHECK(drain() == std::vector<int64_t>{1});
  CHECK(bases == 1);
  CHECK(*Latest(dir) == StepPath(dir, 1));

  // A step one rank failed is never committed, whatever the others report.
  WriteStepFiles(dir, 2, 4, 2);
  CHECK(q.Failed(2));
  CHECK_FALSE(q.Failed(2));  // reported once
  q.Part(2, 0, 2);
  q.Part(2, 1, 2);
  CHECK(q.idle());

  // Parts of an earlier generation's workers no longer count.
  WriteStepFiles(dir, 3, 4, 2);
  q.Part(3, 0, 2);
  q.ForgetParts();
  q.Part(3, 1, 2);
  CHECK(q.idle());

  // Several ready steps commit one at a time in step order; keep 2.
  for (int64_t s = 4; s <= 6; ++s) WriteStepFiles(dir, s, 4, 2);
  for (int64_t s = 4; s <= 6; ++s)
    for (uint32_t r = 0; r < 2; ++r) q.Part(s, r, 2);
  CHECK(drain() == std::vector<int64_t>{4, 5, 6});
  CHECK(*Latest(dir) == StepPath(dir, 6));
  auto list = List(dir);
  REQUIRE(list.ok());
  std::vector<int64_t> complete;
  for (const auto& c : *list)
    if (c.complete) complete.push_back(c.step);
  CHECK(complete == std::vector<int64_t>{5, 6});
}
