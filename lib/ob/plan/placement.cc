#include "ob/plan/placement.h"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <utility>

#include "ob/plan/replanner.h"
#include "ob/watch/stats.h"

namespace ob::plan {
namespace {

std::vector<double> OffDiagonal(const std::vector<double>& m, int n) {
  std::vector<double> v;
  for (int s = 0; s < n; ++s)
    for (int d = 0; d < n; ++d)
      if (s != d) v.push_back(m[s * n + d]);
  return v;
}

// The placement problem flattened into slots: slot s is position q of
// pipeline j, and assign[s] is the node sitting there. Evaluates the cost of
// header placement.h from scratch, and again after a swap touching only what
// the two slots influence.
class Evaluator {
 public:
  Evaluator(const Problem& p, const TemplateSet& ts, const Instantiation& inst,
            const BandwidthMatrix& bw)
      : bw_(&bw) {
    const int L = p.num_layers();
    for (size_t j = 0; j < inst.pipelines.size(); ++j) {
      const auto& pi = inst.pipelines[j];
      const Template* t = ts.ForNodes(pi.template_nodes);
      assert(t && static_cast<int>(pi.nodes.size()) == t->nodes && !t->stages.empty());
      Pipe pipe;
      pipe.first_slot = static_cast<int>(assign_.size());
      pipe.slots = t->nodes;
      pipe.m = std::max(1, pi.microbatches);
      // Each (virtual) stage's compute, and its boundary: inside the node,
      // or over the link from its node to the next one's (with chunks the
      // slices of one stage add up, and the loop's way back from the last
      // node to the first is a link too).
      const std::vector<StageShape>& vs = t->Virtual();
      const schedule::Chain chain = t->chain();
      const int S = static_cast<int>(t->stages.size());
      pipe.base.assign(static_cast<size_t>(S), 0.0);
      pipe.cross.assign(static_cast<size_t>(S), {});
      for (int k = 0; k < static_cast<int>(vs.size()); ++k) {
        const auto& st = vs[k];
        const int i = chain.StageOf(k);  // one chunk: k itself
        const bool last = k + 1 == static_cast<int>(vs.size());
        const int to = last ? -1 : chain.StageOf(k + 1);
        const bool crosses = !last && t->NodeOf(to) != t->NodeOf(i);
        pipe.base[i] += StageComputeSeconds(p, st);
        if (!crosses && to != i) pipe.base[i] += StageBoundarySeconds(p, st.last, false);
        if (crosses) pipe.cross[i].push_back({t->NodeOf(i), t->NodeOf(to), static_cast<double>(p.layers[st.last].output_bytes)});
      }
      pipes_.push_back(std::move(pipe));
      for (int q = 0; q < t->nodes; ++q) {
        assign_.push_back(pi.nodes[q]);
        slot_pipe_.push_back(static_cast<int>(j));
        std::vector<std::pair<int, int>> spans;
        for (const detail::Span& sp : detail::NodeSpans(*t, q)) spans.emplace_back(sp.first, sp.last);
        slot_layers_.push_back(std::move(spans));
      }
    }
    // One ring per layer through the slot holding it in every pipeline.
    const int P = static_cast<int>(pipes_.size());
    rings_.assign(L, {});
    for (int s = 0; s < static_cast<int>(assign_.size()); ++s)
      for (const auto& [first, last] : slot_layers_[s])
        for (int l = first; l <= last; ++l) rings_[l].push_back(s);
    grad_.resize(L);
    for (int l = 0; l < L; ++l) {
      grad_[l] = P > 1 && static_cast<int>(rings_[l].size()) == P
                     ? 2.0 * (P - 1) / P * static_cast<double>(p.layers[l].gradient_bytes)
                     : 0.0;
    }
    lat_factor_ = 2.0 * (P - 1);
    Recompute();
  }

  const std::vector<int>& assign() const { return assign_; }
  int slots() const { return static_cast<int>(assign_.size()); }
  double Iteration() const { return iteration_; }
  // What annealing minimises: the iteration time plus a small pull on every
  // pipeline, so moves that help a non-critical pipeline are not blind.
  double Energy() const { return iteration_ + 0.05 * mean_; }
  int pipelines() const { return static_cast<int>(pipes_.size()); }
  int critical() const { return critical_; }  // the pipeline that sets the time
  // First slot and slot count of pipeline j.
  std::pair<int, int> PipelineSlots(int j) const { return {pipes_[j].first_slot, pipes_[j].slots}; }

  void Recompute() {
    ring_.assign(rings_.size(), 0.0);
    slot_ar_.assign(assign_.size(), 0.0);
    for (size_t l = 0; l < rings_.size(); ++l) {
      ring_[l] = RingSeconds(static_cast<int>(l));
      for (int s : rings_[l]) slot_ar_[s] += ring_[l];
    }
    for (auto& pipe : pipes_) pipe.seconds = PipeSeconds(pipe);
    Aggregate();
  }

  // Swaps the nodes of two slots and brings the cost up to date.
  void Swap(int a, int b) {
    std::swap(assign_[a], assign_[b]);
    pipes_[slot_pipe_[a]].seconds = PipeSeconds(pipes_[slot_pipe_[a]]);
    if (slot_pipe_[b] != slot_pipe_[a]) pipes_[slot_pipe_[b]].seconds = PipeSeconds(pipes_[slot_pipe_[b]]);
    UpdateRings(a);
    if (slot_layers_[b] != slot_layers_[a]) UpdateRings(b);  // else a's rings held b
    Aggregate();
  }

 private:
  // A boundary of a stage over the network: from its node's position to
  // another's (the next one's; with chunks also the first's), `bytes` each way.
  struct Crossing {
    int from = 0, to = 0;
    double bytes = 0;
  };
  struct Pipe {
    int first_slot = 0, slots = 0, m = 1;
    std::vector<double> base;                  // per stage: compute + nominal intra-node boundaries
    std::vector<std::vector<Crossing>> cross;  // per stage: its boundaries over links
    double seconds = 0;                        // Σw + (m − 1)·max w
  };

  double Link(int a, int b, double bytes) const {
    return bytes / bw_->Bandwidth(a, b) + bw_->Latency(a, b) + bytes / bw_->Bandwidth(b, a) +
           bw_->Latency(b, a);
  }

  double PipeSeconds(const Pipe& pipe) const {
    double sum = 0, worst = 0;
    for (size_t i = 0; i < pipe.base.size(); ++i) {
      double w = pipe.base[i];
      for (const Crossing& c : pipe.cross[i])
        w += Link(assign_[pipe.first_slot + c.from], assign_[pipe.first_slot + c.to], c.bytes);
      sum += w;
      worst = std::max(worst, w);
    }
    return sum + (pipe.m - 1) * worst;
  }

  double RingSeconds(int l) const {
    if (grad_[l] == 0) return 0.0;
    const auto& r = rings_[l];
    double slowest = std::numeric_limits<double>::infinity(), lat = 0;
    for (size_t i = 0; i < r.size(); ++i) {
      const int a = assign_[r[i]], b = assign_[r[(i + 1) % r.size()]];
      slowest = std::min(slowest, bw_->Bandwidth(a, b));
      lat = std::max(lat, bw_->Latency(a, b));
    }
    return grad_[l] / slowest + lat_factor_ * lat;
  }

  void UpdateRings(int s) {
    for (const auto& [first, last] : slot_layers_[s])
      for (int l = first; l <= last; ++l) {
        const double now = RingSeconds(l), delta = now - ring_[l];
        if (delta == 0) continue;
        ring_[l] = now;
        for (int r : rings_[l]) slot_ar_[r] += delta;
      }
  }

  void Aggregate() {
    iteration_ = 0;
    double sum = 0;
    for (size_t j = 0; j < pipes_.size(); ++j) {
      const Pipe& pipe = pipes_[j];
      double ar = 0;
      for (int s = pipe.first_slot; s < pipe.first_slot + pipe.slots; ++s) ar = std::max(ar, slot_ar_[s]);
      if (pipe.seconds + ar > iteration_) iteration_ = pipe.seconds + ar, critical_ = static_cast<int>(j);
      sum += pipe.seconds + ar;
    }
    mean_ = pipes_.empty() ? 0 : sum / pipes_.size();
  }

  const BandwidthMatrix* bw_;
  std::vector<Pipe> pipes_;
  std::vector<int> assign_, slot_pipe_;
  std::vector<std::vector<std::pair<int, int>>> slot_layers_;  // layer ranges [first, last] held by the slot
  std::vector<std::vector<int>> rings_;           // per layer: the slots holding it
  std::vector<double> grad_;                      // per layer: 2(P−1)/P · gradient bytes
  std::vector<double> ring_, slot_ar_;            // per layer ring time; per slot Σ of its rings
  double lat_factor_ = 0;                         // 2(P−1) latency steps per ring
  double iteration_ = 0, mean_ = 0;
  int critical_ = 0;
};

Instantiation WithAssignment(const Instantiation& inst, const std::vector<int>& assign) {
  Instantiation out = inst;
  size_t s = 0;
  for (auto& pi : out.pipelines)
    for (int& node : pi.nodes) node = assign[s++];
  return out;
}

// Greedy start: each pipeline in turn is a chain that steps to the unused
// node whose link to the current one is cheapest for that boundary's bytes;
// of the chains from each possible first node, the cheapest is kept.
std::vector<int> GreedyAssignment(const Problem& p, const TemplateSet& ts, const Instantiation& inst,
                                  const BandwidthMatrix& bw) {
  std::vector<int> pool;
  for (const auto& pi : inst.pipelines) pool.insert(pool.end(), pi.nodes.begin(), pi.nodes.end());
  std::sort(pool.begin(), pool.end());
  std::vector<bool> used(bw.nodes, false);
  std::vector<int> assign;
  auto link = [&](int a, int b, double bytes) {
    return bytes / bw.Bandwidth(a, b) + bw.Latency(a, b) + bytes / bw.Bandwidth(b, a) +
           bw.Latency(b, a);
  };
  for (const auto& pi : inst.pipelines) {
    const Template* t = ts.ForNodes(pi.template_nodes);
    std::vector<double> bytes;  // boundary after each node but the last
    for (int q = 0; q + 1 < t->nodes; ++q)
      bytes.push_back(static_cast<double>(p.layers[t->stages[t->LastStageOn(q)].last].output_bytes));
    std::vector<int> best_chain;
    double best_cost = std::numeric_limits<double>::infinity();
    int starts = 0;
    for (int start : pool) {
      if (used[start]) continue;
      if (++starts > 64) break;  // enough candidates on big clusters
      std::vector<int> chain{start};
      std::vector<bool> taken = used;
      taken[start] = true;
      double cost = 0;
      for (double b : bytes) {
        int next = -1;
        double next_cost = std::numeric_limits<double>::infinity();
        for (int c : pool) {
          if (taken[c]) continue;
          const double lc = link(chain.back(), c, b);
          if (lc < next_cost) next = c, next_cost = lc;
        }
        chain.push_back(next);
        taken[next] = true;
        cost += next_cost;
      }
      if (cost < best_cost) best_cost = cost, best_chain = std::move(chain);
    }
    for (int node : best_chain) used[node] = true;
    assign.insert(assign.end(), best_chain.begin(), best_chain.end());
  }
  return assign;
}

// Ring-first start: one path through all nodes along fast links, laid over
// the slots in order of the layers they hold (pipeline order among equals),
// so the nodes of one data-parallel ring sit together on the path and
// consecutive stages stay near. Wins when rings cost more than boundaries.
std::vector<int> RingAssignment(const Problem& p, const TemplateSet& ts, const Instantiation& inst,
                                const BandwidthMatrix& bw) {
  std::vector<int> pool;
  std::vector<double> mid;  // per slot: the middle of its layer range
  for (const auto& pi : inst.pipelines) {
    const Template* t = ts.ForNodes(pi.template_nodes);
    pool.insert(pool.end(), pi.nodes.begin(), pi.nodes.end());
    for (int q = 0; q < t->nodes; ++q)
      mid.push_back((t->stages[t->FirstStageOn(q)].first + t->stages[t->LastStageOn(q)].last + 1) /
                    (2.0 * p.num_layers()));
  }
  std::sort(pool.begin(), pool.end());
  std::vector<int> order(mid.size());
  for (size_t s = 0; s < order.size(); ++s) order[s] = static_cast<int>(s);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return mid[a] < mid[b]; });
  auto cost = [&](int a, int b) { return 1 / bw.Bandwidth(a, b) + 1 / bw.Bandwidth(b, a); };
  std::vector<int> best_path;
  double best_cost = std::numeric_limits<double>::infinity();
  for (size_t start = 0; start < pool.size() && start < 16; ++start) {
    std::vector<bool> taken(bw.nodes, false);
    std::vector<int> path{pool[start]};
    taken[pool[start]] = true;
    double total = 0;
    while (path.size() < pool.size()) {
      int next = -1;
      double next_cost = std::numeric_limits<double>::infinity();
      for (int c : pool)
        if (!taken[c] && cost(path.back(), c) < next_cost) next = c, next_cost = cost(path.back(), c);
      path.push_back(next);
      taken[next] = true;
      total += next_cost;
    }
    if (total < best_cost) best_cost = total, best_path = std::move(path);
  }
  std::vector<int> assign(order.size());
  for (size_t i = 0; i < order.size(); ++i) assign[order[i]] = best_path[i];
  return assign;
}

// Plans with more slots skip the pairwise descent: a sweep is O(slots²)
// evaluations.
constexpr int kPolishSlots = 64;

// Steepest-first descent: swaps any pair that lowers the iteration time (or
// keeps it and lowers the energy) until no pair does or time runs out.
void Polish(Evaluator* ev, std::chrono::steady_clock::time_point deadline) {
  const int n = ev->slots();
  for (bool improved = true; improved && std::chrono::steady_clock::now() < deadline;) {
    improved = false;
    for (int a = 0; a < n; ++a)
      for (int b = a + 1; b < n; ++b) {
        const double cost = ev->Iteration(), energy = ev->Energy();
        ev->Swap(a, b);
        if (ev->Iteration() < cost - 1e-12 ||
            (ev->Iteration() <= cost && ev->Energy() < energy - 1e-12)) {
          improved = true;
        } else {
          ev->Swap(a, b);
        }
      }
  }
}

}  // namespace

double BandwidthMatrix::MedianBandwidth() const { return watch::Median(OffDiagonal(bytes_per_s, nodes)); }
double BandwidthMatrix::MedianLatency() const { return watch::Median(OffDiagonal(latency, nodes)); }

Result<BandwidthMatrix> MatrixFromProfile(const pb::NetworkMatrix& m, int nodes) {
  if (m.hosts_size() != nodes)
    return Status::DataErr("bandwidth matrix has " + std::to_string(m.hosts_size()) +
                           " hosts, the cluster " + std::to_string(nodes));
  BandwidthMatrix bw;
  bw.nodes = nodes;
  bw.bytes_per_s.assign(static_cast<size_t>(nodes) * nodes, 0.0);
  bw.latency.assign(static_cast<size_t>(nodes) * nodes, 0.0);
  std::vector<bool> seen(static_cast<size_t>(nodes) * nodes, false);
  auto pair = [&](uint32_t s, uint32_t d) { return m.hosts(s) + " -> " + m.hosts(d); };
  for (int i = 0; i < m.links_size(); ++i) {
    const auto& link = m.links(i);
    if (link.src() >= static_cast<uint32_t>(nodes) || link.dst() >= static_cast<uint32_t>(nodes) ||
        link.src() == link.dst())
      return Status::DataErr("bandwidth matrix link " + std::to_string(i) + " has src " +
                             std::to_string(link.src()) + " and dst " + std::to_string(link.dst()) +
                             " (hosts 0.." + std::to_string(nodes - 1) + ")");
    const size_t at = static_cast<size_t>(link.src()) * nodes + link.dst();
    if (seen[at]) return Status::DataErr("bandwidth matrix has two links " + pair(link.src(), link.dst()));
    const double b = link.bandwidth_bytes_per_s(), lat = link.latency_seconds();
    if (!std::isfinite(b) || b <= 0)
      return Status::DataErr("bandwidth matrix link " + pair(link.src(), link.dst()) +
                             " has bandwidth " + std::to_string(b) + " bytes/s");
    if (!std::isfinite(lat) || lat < 0)
      return Status::DataErr("bandwidth matrix link " + pair(link.src(), link.dst()) +
                             " has latency " + std::to_string(lat) + " s");
    seen[at] = true;
    bw.bytes_per_s[at] = b;
    bw.latency[at] = lat;
  }
  for (int s = 0; s < nodes; ++s)
    for (int d = 0; d < nodes; ++d)
      if (s != d && !seen[static_cast<size_t>(s) * nodes + d])
        return Status::DataErr("bandwidth matrix has no link " + pair(s, d));
  return bw;
}

double PlacedIterationSeconds(const Problem& p, const TemplateSet& ts, const Instantiation& inst,
                              const BandwidthMatrix& bw) {
  return Evaluator(p, ts, inst, bw).Iteration();
}

Instantiation Place(const Problem& p, const TemplateSet& ts, const Instantiation& inst,
                    const BandwidthMatrix& bw, const PlacementOptions& opts) {
  Evaluator ev(p, ts, inst, bw);
  const int n = ev.slots();
  if (n < 2) return inst;
  const std::vector<int> identity = ev.assign();
  const double identity_cost = ev.Iteration();

  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(opts.time_limit_s));
  // Start from the best of the given order and the two greedy layouts, each
  // polished to a local optimum.
  if (n <= kPolishSlots) Polish(&ev, deadline);
  for (const auto& start : {GreedyAssignment(p, ts, inst, bw), RingAssignment(p, ts, inst, bw)}) {
    Evaluator candidate(p, ts, WithAssignment(inst, start), bw);
    if (n <= kPolishSlots) Polish(&candidate, deadline);
    if (candidate.Iteration() < ev.Iteration()) ev = candidate;
  }

  // A move swaps two slots, or (one move in eight) the whole node lists of
  // two pipelines of one size: that reorders the data-parallel rings, which
  // single swaps reach only through a valley.
  std::mt19937_64 rng(opts.seed);
  std::uniform_int_distribution<int> pick(0, n - 1);
  std::uniform_int_distribution<int> pick_pipe(0, ev.pipelines() - 1);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<std::pair<int, int>> move;
  auto propose = [&] {
    move.clear();
    if (ev.pipelines() > 1 && rng() % 8 == 0) {
      const auto [f1, n1] = ev.PipelineSlots(pick_pipe(rng));
      const auto [f2, n2] = ev.PipelineSlots(pick_pipe(rng));
      if (f1 != f2 && n1 == n2) {
        for (int q = 0; q < n1; ++q) move.emplace_back(f1 + q, f2 + q);
        return;
      }
    }
    // Half the swaps take a node of the critical pipeline: with many
    // pipelines, uniform swaps rarely touch the one that sets the time.
    int a = pick(rng);
    if (rng() % 2 == 0) {
      const auto [first, count] = ev.PipelineSlots(ev.critical());
      a = first + std::uniform_int_distribution<int>(0, count - 1)(rng);
    }
    int b = pick(rng);
    while (b == a) b = pick(rng);
    move.emplace_back(a, b);
  };
  auto apply = [&] {
    for (const auto& [a, b] : move) ev.Swap(a, b);
  };
  auto undo = [&] {
    for (auto it = move.rbegin(); it != move.rend(); ++it) ev.Swap(it->first, it->second);
  };

  // Initial temperature: an uphill move of average size is accepted half the
  // time; it cools geometrically to a thousandth of that.
  double uphill = 0;
  int ups = 0;
  for (int i = 0; i < 64; ++i) {
    propose();
    const double before = ev.Energy();
    apply();
    const double delta = ev.Energy() - before;
    undo();
    if (delta > 0) uphill += delta, ++ups;
  }
  const double t0 = ups ? uphill / ups / std::log(2.0) : 0.0;
  const double t_end = t0 * 1e-3;

  std::vector<int> best = ev.assign();
  double best_cost = ev.Iteration(), best_energy = ev.Energy();
  for (long i = 0; i < opts.moves && t0 > 0; ++i) {
    if ((i & 255) == 0 && std::chrono::steady_clock::now() > deadline) break;
    const double temp = t0 * std::pow(t_end / t0, static_cast<double>(i) / opts.moves);
    propose();
    const double before = ev.Energy();
    apply();
    const double delta = ev.Energy() - before;
    if (delta > 0 && unit(rng) >= std::exp(-delta / temp)) {
      undo();
      continue;
    }
    if (ev.Iteration() < best_cost || (ev.Iteration() == best_cost && ev.Energy() < best_energy)) {
      best = ev.assign();
      best_cost = ev.Iteration();
      best_energy = ev.Energy();
    }
  }

  if (n <= kPolishSlots) {
    Evaluator polish(p, ts, WithAssignment(inst, best), bw);
    Polish(&polish, deadline);
    if (polish.Iteration() < best_cost) best = polish.assign();
  }

  // Incremental sums drift; judge the winner afresh against the given order.
  Instantiation placed = WithAssignment(inst, best);
  if (PlacedIterationSeconds(p, ts, placed, bw) > identity_cost) return WithAssignment(inst, identity);
  return placed;
}

}  // namespace ob::plan
