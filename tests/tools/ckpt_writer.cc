// ckpt_writer: saves a synthetic multi-layer model through ob's checkpoint
// library, step after step, the way training does (several writer threads,
// one part each, then one commit). Test-only: the crash, full-disk and
// export tests kill it, starve it of space and read what it wrote.
//
//   ckpt_writer --dir DIR --layers L [--writers W] [--steps N] [--keep K]
//               [--rows R] [--cols C]
//     Resumes after the latest complete checkpoint (removing what a killed
//     run left half-written) and commits N more steps; prints
//     "committed <step>" after each.
//   ckpt_writer --expect --step S --layers L [--rows R] [--cols C] [--with-optimizer]
//     Prints, as JSON, what `ob-ckpt export` of step S must contain:
//     {"metadata": {...}, "tensors": {name: {"dtype", "shape", "values"}}}.
//
// Values are small integers and halves, exact in every dtype used, so an
// independent reader can compare them exactly.
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "ob/ckpt/checkpoint.h"

namespace {

using ob::ckpt::DType;

struct Options {
  std::string dir;
  int layers = 4;
  int writers = 2;
  int steps = 1;
  int keep = 0;
  int64_t rows = 8, cols = 16;
  bool expect = false;
  int64_t step = 0;
  bool with_optimizer = false;
};

// One parameter of a layer, with its values at a step.
struct Param {
  std::string name;     // "<layer>.w", "tied", ...
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<double> values;     // the weight
  std::vector<double> exp_avg;    // Adam moments, stored as F32
  std::vector<double> exp_avg_sq;
  int64_t adam_step;
};

uint16_t Half(double v) {  // exact for the values used: 0 or normal, |v| < 2^15
  if (v == 0) return 0;
  uint16_t sign = v < 0 ? 0x8000 : 0;
  if (v < 0) v = -v;
  int e = 0;
  double m = std::frexp(v, &e);  // v = m * 2^e, m in [0.5, 1)
  const auto frac = static_cast<uint16_t>((m * 2 - 1) * 1024);
  return static_cast<uint16_t>(sign | ((e - 1 + 15) << 10) | frac);
}

std::vector<Param> LayerParams(const Options& o, int64_t step, int layer) {
  std::vector<Param> ps;
  auto make = [&](const std::string& name, DType dtype, std::vector<int64_t> shape, auto value) {
    Param p{name, dtype, shape, {}, {}, {}, step};
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    for (int64_t i = 0; i < n; ++i) {
      const double v = value(i);
      p.values.push_back(v);
      p.exp_avg.push_back(v * 0.5);
      p.exp_avg_sq.push_back(static_cast<double>(i % 13 + 1));
    }
    ps.push_back(std::move(p));
  };
  const std::string l = std::to_string(layer);
  make(l + ".w", DType::kF32, {o.rows, o.cols},
       [&](int64_t i) { return static_cast<double>(step % 64 + layer) + (i % 97) * 0.25; });
  make(l + ".b", DType::kBF16, {o.cols},
       [&](int64_t i) { return static_cast<double>((step + layer + i) % 32 - 8); });
  if (layer == 0) {
    make("tied", DType::kF32, {o.cols, o.rows},
         [&](int64_t i) { return static_cast<double>(step % 16) - (i % 31) * 0.5; });
    make("0.pos", DType::kF16, {o.rows},
         [&](int64_t i) { return static_cast<double>((step + i) % 64) * 0.5; });
  }
  return ps;
}

std::string Encode(DType dtype, const std::vector<double>& values) {
  std::string out;
  for (double v : values) {
    if (dtype == DType::kF32) {
      float f = static_cast<float>(v);
      out.append(reinterpret_cast<const char*>(&f), 4);
    } else if (dtype == DType::kBF16) {
      float f = static_cast<float>(v);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      const auto h = static_cast<uint16_t>(bits >> 16);
      out.append(reinterpret_cast<const char*>(&h), 2);
    } else {
      const uint16_t h = Half(v);
      out.append(reinterpret_cast<const char*>(&h), 2);
    }
  }
  return out;
}

ob::Result<ob::pb::CheckpointFile> SaveLayer(const Options& o, int64_t step, int layer) {
  std::vector<Param> ps = LayerParams(o, step, layer);
  std::vector<std::string> buffers;  // kept alive for the views
  buffers.reserve(ps.size() * 3);
  std::vector<ob::ckpt::TensorView> views;
  std::map<std::string, std::string> metadata;
  for (const auto& p : ps) {
    auto add = [&](const std::string& name, DType dtype, const std::vector<double>& v) {
      buffers.push_back(Encode(dtype, v));
      views.push_back({name, dtype, p.shape, buffers.back().data(), buffers.back().size()});
    };
    add(p.name, p.dtype, p.values);
    add(p.name + ".exp_avg", DType::kF32, p.exp_avg);
    add(p.name + ".exp_avg_sq", DType::kF32, p.exp_avg_sq);
    metadata[p.name + ".adam_step"] = std::to_string(p.adam_step);
  }
  return ob::ckpt::WriteLayer(o.dir, step, layer, views, metadata);
}

ob::Status SaveStep(const Options& o, int64_t step) {
  OB_RETURN_IF_ERROR(ob::ckpt::BeginStep(o.dir, step));
  std::vector<ob::Status> results(static_cast<size_t>(o.writers));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < o.writers; ++rank) {
    threads.emplace_back([&, rank] {
      ob::pb::Manifest part;
      for (int layer = rank; layer < o.layers; layer += o.writers) {
        auto f = SaveLayer(o, step, layer);
        if (!f.ok()) {
          results[rank] = f.status();
          return;
        }
        *part.add_files() = *f;
      }
      results[rank] = ob::ckpt::WritePart(o.dir, step, rank, part);
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& s : results) OB_RETURN_IF_ERROR(s);
  ob::pb::Manifest base;
  base.mutable_model()->set_name("ckpt-writer");
  base.mutable_model()->set_n_layer(static_cast<uint32_t>(o.layers - 2 > 0 ? o.layers - 2 : 0));
  base.set_data_seed(1234);
  base.set_samples_seen(static_cast<uint64_t>(step) * 8);
  OB_ASSIGN_OR_RETURN(auto m, ob::ckpt::Commit(o.dir, step, base, o.layers));
  std::printf("committed %" PRId64 "\n", step);
  std::fflush(stdout);
  if (o.keep > 0) OB_RETURN_IF_ERROR(ob::ckpt::Prune(o.dir, o.keep).status());
  return ob::Status::Ok();
}

ob::Status Run(const Options& o) {
  OB_RETURN_IF_ERROR(ob::ckpt::RemovePartials(o.dir).status());
  int64_t next = 1;
  if (auto latest = ob::ckpt::Latest(o.dir); latest.ok()) {
    OB_ASSIGN_OR_RETURN(auto m, ob::ckpt::LoadManifest(*latest));
    next = static_cast<int64_t>(m.step()) + 1;
  }
  for (int i = 0; i < o.steps; ++i) OB_RETURN_IF_ERROR(SaveStep(o, next + i));
  return ob::Status::Ok();
}

void PrintValues(const std::vector<double>& v) {
  std::printf("[");
  for (size_t i = 0; i < v.size(); ++i) std::printf("%s%.17g", i ? "," : "", v[i]);
  std::printf("]");
}

void PrintExpected(const Options& o) {
  std::printf("{\"metadata\":{\"format\":\"pt\",\"ob.step\":\"%" PRId64 "\",\"ob.model\":\"ckpt-writer\"",
              o.step);
  std::vector<Param> all;
  for (int layer = 0; layer < o.layers; ++layer)
    for (auto& p : LayerParams(o, o.step, layer)) all.push_back(std::move(p));
  if (o.with_optimizer)
    for (const auto& p : all)
      std::printf(",\"%s.adam_step\":\"%" PRId64 "\"", p.name.c_str(), p.adam_step);
  std::printf("},\"tensors\":{");
  bool first = true;
  auto tensor = [&](const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                    const std::vector<double>& v) {
    std::printf("%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", first ? "" : ",", name.c_str(),
                ob::ckpt::DTypeName(dtype));
    first = false;
    for (size_t i = 0; i < shape.size(); ++i) std::printf("%s%" PRId64, i ? "," : "", shape[i]);
    std::printf("],\"values\":");
    PrintValues(v);
    std::printf("}");
  };
  for (const auto& p : all) {
    tensor(p.name, p.dtype, p.shape, p.values);
    if (!o.with_optimizer) continue;
    tensor(p.name + ".exp_avg", DType::kF32, p.shape, p.exp_avg);
    tensor(p.name + ".exp_avg_sq", DType::kF32, p.shape, p.exp_avg_sq);
  }
  std::printf("}}\n");
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app("Writes synthetic checkpoints through ob's library (a test tool).", "ckpt_writer");
  app.add_option("--dir", o.dir, "Checkpoint root directory");
  app.add_option("--layers", o.layers, "Global layers")->check(CLI::Range(1, 9999));
  app.add_option("--writers", o.writers, "Writer threads (ranks)")->check(CLI::Range(1, 64));
  app.add_option("--steps", o.steps, "Steps to commit");
  app.add_option("--keep", o.keep, "Prune to this many after each commit (0: never)");
  app.add_option("--rows", o.rows, "Rows of each weight")->check(CLI::Range(1, 1 << 20));
  app.add_option("--cols", o.cols, "Columns of each weight")->check(CLI::Range(1, 1 << 20));
  app.add_flag("--expect", o.expect, "Print what an export of --step holds, as JSON");
  app.add_option("--step", o.step, "The step for --expect");
  app.add_flag("--with-optimizer", o.with_optimizer, "--expect: with the Adam moments");
  CLI11_PARSE(app, argc, argv);
  if (o.expect) {
    PrintExpected(o);
    return 0;
  }
  if (o.dir.empty()) {
    std::fprintf(stderr, "ckpt_writer: --dir is required\n");
    return 64;
  }
  ob::Status s = Run(o);
  if (!s.ok()) {
    std::fprintf(stderr, "ckpt_writer: %s\n", s.message().c_str());
    return s.exit_code();
  }
  return 0;
}
