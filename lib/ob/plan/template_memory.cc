// Why no template fits, for BuildTemplates' errors: the least GPU memory
// some node count needs, and the first layer that does not fit alone.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "ob/plan/templates_impl.h"

namespace ob::plan::detail {

// The least GPU memory with which some node count n ≤ max_nodes has a
// partition that fits: a minimax DP over stage memory instead of time. The
// in-flight term is taken as linear in r, which the model is up to rounding;
// the answer is then confirmed against StageFits and nudged up if needed.
uint64_t LeastMemoryFor(const Problem& p, int max_nodes) {
  const int L = p.num_layers();
  auto fits_somewhere = [&](uint64_t memory) {
    Problem q = p;
    q.cluster.gpu_memory = memory;
    for (int k : StagesPerNodeChoices(q)) {
      const int R = std::min(L, max_nodes * k);
      if (R < k) continue;
      const std::vector<double> F = MinimaxFromBack(MakeTable(q, k, R));
      for (int S = k; S <= R; S += k)
        if (F[static_cast<size_t>(S) * (L + 1)] != kInf) return true;
    }
    return false;
  };
  double least = kInf;
  for (int k : StagesPerNodeChoices(p)) {
    const int tp = p.cluster.gpus_per_node / k;
    const int R = std::min(L, max_nodes * k);
    if (R < k) continue;
    std::vector<double> base(static_cast<size_t>(L) * L), per(static_cast<size_t>(L) * L);
    for (int j = 0; j < L; ++j)
      for (int e = j; e < L; ++e) {
        base[j * L + e] = static_cast<double>(StageMemoryBytes(p, j, e, tp, 0));
        per[j * L + e] = static_cast<double>(StageMemoryBytes(p, j, e, tp, 1)) - base[j * L + e];
      }
    std::vector<double> F(static_cast<size_t>(R + 1) * (L + 1), kInf);
    F[L] = 0;
    for (int r = 1; r <= R; ++r)
      for (int j = 0; j + r <= L; ++j) {
        double best = kInf;
        for (int e = j; e <= L - r; ++e) {
          const double rest = F[static_cast<size_t>(r - 1) * (L + 1) + e + 1];
          best = std::min(best, std::max(base[j * L + e] + r * per[j * L + e], rest));
        }
        F[static_cast<size_t>(r) * (L + 1) + j] = best;
      }
    for (int S = k; S <= R; S += k) least = std::min(least, F[static_cast<size_t>(S) * (L + 1)]);
  }
  if (least == kInf) return 0;
  uint64_t memory = static_cast<uint64_t>(std::ceil(least));
  for (int tries = 0; tries < 20 && !fits_somewhere(memory); ++tries)
    memory += std::max<uint64_t>(memory / 1000, 1);
  return memory;
}

// Rounded up (a need is not understated); under 0.1 GiB in MiB, where the
// tenths of a GiB said "0.1 GiB" of --gpu-memory 1e-9.
std::string GiBText(uint64_t bytes) {
  char buf[32];
  const double gib = static_cast<double>(bytes) / (1ull << 30);
  if (gib < 0.1) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", std::ceil(gib * 1024 * 10) / 10);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f GiB", std::ceil(gib * 10) / 10);
  }
  return buf;
}

// Why no node count works: the first layer that does not fit even alone on
// a whole node with one micro-batch in flight, else the model as a whole.
Status NothingFits(const Problem& p) {
  const int g = p.cluster.gpus_per_node;
  const int L = p.num_layers();
  // A node's GPUs are k stages × tensor parallelism t; t must divide the
  // heads (and 4 × the hidden size), so a node can hold more GPUs than the
  // layers can use ("the model needs at least 0.0 GiB per GPU" said it).
  const std::vector<int> ks = StagesPerNodeChoices(p);
  if (std::none_of(ks.begin(), ks.end(), [&](int k) { return k <= L; })) {
    int widest = 1;  // the largest tensor-parallel degree the model allows
    for (int t = 1; t <= std::max(1, p.n_head); ++t) {
      const bool divides = p.TpDivides(t);
      if (divides && (p.tp <= 0 || t == p.tp)) widest = t;
    }
    return Status::Config(
        "no layout uses a node's " + std::to_string(g) + " GPUs: as stages × tensor parallelism, with a degree the "
        "model allows (at most " + std::to_string(widest) + ": it divides the " + std::to_string(p.n_head) +
        " heads), a node needs " + (ks.empty() ? std::string("more") : "at least " + std::to_string(ks.front())) +
        " stages, and the model has " + std::to_string(L) + " layers; plan for at most " +
        std::to_string(L * widest) + " GPUs a node (--gpus-per-node)");
  }
  const uint64_t need = LeastMemoryFor(p, p.num_layers());
  const std::string have = GiBText(p.cluster.gpu_memory) + " per GPU";
  for (int l = 0; l < p.num_layers(); ++l) {
    if (StageFits(p, l, l, g, 1)) continue;
    return Status::Config("layer " + std::to_string(l) + " does not fit in " + have +
                          " even alone with tensor parallelism " + std::to_string(g) +
                          " (needs " + GiBText(StageMemoryBytes(p, l, l, g, 1)) +
                          "); the model needs at least " + GiBText(need) + " per GPU");
  }
  return Status::Config("no stage partition fits in " + have + " at any node count (" +
                        std::to_string(p.num_layers()) +
                        " layers, 1F1B in-flight activations); the model needs at least " +
                        GiBText(need) + " per GPU");
}

}  // namespace ob::plan::detail
