// Replanner (see replanner.h): the costs of candidate layouts, and the
// moves that build them: placing undersized survivor groups, growing
// pipelines, forming new ones from spare and added nodes.
#include "ob/plan/replanner.h"

#include <algorithm>
#include <cassert>
#include <set>
#include <utility>

#include "ob/plan/instantiation.h"

namespace ob::plan::detail {

Replanner::Replanner(const Problem& p, const TemplateSet& ts, std::unordered_map<int, Held> held)
    : p_(p), ts_(ts), n0_(ts.min_nodes), held_(std::move(held)) {
  prefix_.assign(p.num_layers() + 1, 0);
  for (int l = 0; l < p.num_layers(); ++l)
    prefix_[l + 1] = prefix_[l] + p.layers[l].state_bytes;
}

bool Replanner::Refresh(Layout& l) {
  int count = static_cast<int>(l.idle.size());
  for (const Pipe& pipe : l.pipes) count += static_cast<int>(pipe.nodes.size());
  Problem q = p_;
  q.cluster.nodes = count;
  auto inst = Instantiate(q, ts_);
  if (!inst.ok()) return false;
  std::vector<int> sizes;
  for (const auto& pipe : inst->pipelines) sizes.push_back(pipe.template_nodes);
  if (!(Time(sizes) < Time(l) * (1 - kFreshGain))) return false;
  std::multiset<int> want(sizes.begin(), sizes.end());
  Layout out;
  std::vector<int> free;
  for (const Pipe& pipe : l.pipes) {
    auto it = want.find(pipe.template_nodes);
    if (it != want.end()) {
      want.erase(it);
      out.bytes += pipe.bytes;
      out.pipes.push_back(pipe);
    } else {
      free.insert(free.end(), pipe.nodes.begin(), pipe.nodes.end());
    }
  }
  free.insert(free.end(), l.idle.begin(), l.idle.end());
  size_t at = 0;
  for (auto it = want.rbegin(); it != want.rend(); ++it) {
    const size_t n = static_cast<size_t>(*it);
    if (at + n > free.size()) return false;
    AddPipe(out, std::vector<int>(free.begin() + at, free.begin() + at + n), std::numeric_limits<int>::max());
    at += n;
  }
  out.idle.assign(free.begin() + at, free.end());
  l = std::move(out);
  return true;
}

uint64_t Replanner::Cost(int n, Slice a, Slice b) const {
  const Template* t = ts_.ForNodes(n);
  assert(t && a.size + b.size == n);
  uint64_t bytes = 0;
  for (int pos = 0; pos < n; ++pos) {
    const int node = pos < a.size ? a.data[pos] : b.data[pos - a.size];
    bytes += Missing(node, NodeSpans(*t, pos));
  }
  return bytes;
}

uint64_t Replanner::Missing(int node, const std::vector<Span>& want) const {
  uint64_t bytes = 0;
  for (const Span& w : want) bytes += SpanBytes(w);
  auto it = held_.find(node);
  if (it != held_.end()) {
    // Spans of one node never overlap one another.
    for (const Span& w : want)
      for (const Span& have : it->second.spans)
        bytes -= SpanBytes({std::max(w.first, have.first), std::min(w.last, have.last)});
  }
  return bytes;
}

double Replanner::Time(std::vector<int> sizes) {
  if (sizes.empty()) return kNoTime;
  std::sort(sizes.begin(), sizes.end());
  auto it = times_.find(sizes);
  if (it != times_.end()) return it->second;
  double time = kNoTime;
  auto split = SplitBatch(p_, ts_, sizes);
  if (split.ok()) {
    time = 0;
    for (size_t j = 0; j < sizes.size(); ++j)
      time = std::max(time, PipelineSeconds(p_, *ts_.ForNodes(sizes[j]), (*split)[j]));
  }
  times_.emplace(std::move(sizes), time);
  return time;
}

std::vector<int> Replanner::Sizes(const Layout& l) {
  std::vector<int> s;
  s.reserve(l.pipes.size() + 1);
  for (const auto& pipe : l.pipes) s.push_back(pipe.template_nodes);
  return s;
}

int Replanner::LargestTemplateAtMost(int c) const {
  for (int n = std::min(c, std::max(ts_.max_nodes(), n0_)); n >= n0_; --n)
    if (ts_.ForNodes(n)) return n;
  return 0;
}

void Replanner::AddPipe(Layout& l, std::vector<int> nodes, int origin) const {
  Pipe pipe;
  pipe.template_nodes = static_cast<int>(nodes.size());
  pipe.nodes = std::move(nodes);
  pipe.origin = origin;
  pipe.bytes = Cost(pipe.template_nodes, Of(pipe.nodes));
  l.bytes += pipe.bytes;
  l.pipes.push_back(std::move(pipe));
}

void Replanner::Relay(Layout& l, int j) const {
  Pipe& pipe = l.pipes[j];
  pipe.template_nodes = static_cast<int>(pipe.nodes.size());
  l.bytes -= pipe.bytes;
  pipe.bytes = Cost(pipe.template_nodes, Of(pipe.nodes));
  l.bytes += pipe.bytes;
}

void Replanner::Place(Layout& l, const Group& cluster) {
  const std::vector<int>& u = cluster.nodes;
  const int c = static_cast<int>(u.size());
  if (c >= n0_ && LargestTemplateAtMost(c) > 0) {
    const int n = LargestTemplateAtMost(c);
    AddPipe(l, std::vector<int>(u.begin(), u.begin() + n), cluster.origin);
    l.spare.insert(l.spare.end(), u.begin() + n, u.end());
    return;
  }
  Layout spread;
  const std::vector<PlaceOption> options = PlaceOptions(l, cluster, &spread);
  if (options.empty()) {
    l.spare.insert(l.spare.end(), u.begin(), u.end());
    return;
  }
  Apply(l, cluster, Fastest(l, cluster, options, spread), spread);
}

std::vector<Replanner::PlaceOption> Replanner::PlaceOptions(const Layout& l, const Group& cluster, Layout* spread) {
  const std::vector<int>& u = cluster.nodes;
  const int c = static_cast<int>(u.size());
  const int need = n0_ - c;
  std::vector<PlaceOption> options;
  const int pipes = static_cast<int>(l.pipes.size());
  const auto minus = [](uint64_t a, uint64_t b) {
    return static_cast<int64_t>(a) - static_cast<int64_t>(b);
  };
  if (static_cast<int>(l.added.size()) >= need)
    options.push_back({kComplete, -1, minus(Cost(n0_, Of(u), Of(l.added, 0, need)), 0)});
  for (int d = 0; d < pipes; ++d) {
    const Pipe& pipe = l.pipes[d];
    const int size = static_cast<int>(pipe.nodes.size());
    if (Has(size - need)) {
      const uint64_t donor = Cost(size - need, Of(pipe.nodes, 0, size - need));
      const uint64_t fresh = Cost(n0_, Of(u), Of(pipe.nodes, size - need, size));
      options.push_back({kBorrow, d, minus(donor + fresh, pipe.bytes)});
    }
    if (Has(size + c))
      options.push_back({kJoin, d, minus(Cost(size + c, Of(pipe.nodes), Of(u)), pipe.bytes)});
  }
  if (c > 1) {
    *spread = l;
    std::vector<int> rest = u;
    Grow(*spread, rest);
    if (rest.empty()) options.push_back({kSpread, -1, minus(spread->bytes, l.bytes)});
  }
  return options;
}

const Replanner::PlaceOption& Replanner::Fastest(const Layout& l, const Group& cluster,
                                                 const std::vector<PlaceOption>& options, const Layout& spread) {
  const int c = static_cast<int>(cluster.nodes.size());
  const int need = n0_ - c;
  int64_t least = options[0].delta;
  for (const auto& o : options) least = std::min(least, o.delta);
  const PlaceOption* best = nullptr;
  double best_time = kNoTime;
  for (const auto& o : options) {
    if (o.delta != least) continue;
    std::vector<int> sizes = Sizes(l);
    switch (o.kind) {
      case kComplete: sizes.push_back(n0_); break;
      case kBorrow: sizes[o.pipe] -= need; sizes.push_back(n0_); break;
      case kJoin: sizes[o.pipe] += c; break;
      case kSpread: sizes = Sizes(spread); break;
    }
    const double time = Time(std::move(sizes));
    if (!best || time < best_time) best = &o, best_time = time;
  }
  return *best;
}

void Replanner::Apply(Layout& l, const Group& cluster, const PlaceOption& how, Layout& spread) const {
  const std::vector<int>& u = cluster.nodes;
  const int need = n0_ - static_cast<int>(u.size());
  switch (how.kind) {
    case kComplete: {
      std::vector<int> nodes = u;
      nodes.insert(nodes.end(), l.added.begin(), l.added.begin() + need);
      l.added.erase(l.added.begin(), l.added.begin() + need);
      AddPipe(l, std::move(nodes), cluster.origin);
      break;
    }
    case kBorrow: {
      Pipe& donor = l.pipes[how.pipe];
      std::vector<int> nodes = u;
      nodes.insert(nodes.end(), donor.nodes.end() - need, donor.nodes.end());
      donor.nodes.resize(donor.nodes.size() - need);
      Relay(l, how.pipe);
      AddPipe(l, std::move(nodes), cluster.origin);
      break;
    }
    case kJoin:
      l.pipes[how.pipe].nodes.insert(l.pipes[how.pipe].nodes.end(), u.begin(), u.end());
      Relay(l, how.pipe);
      break;
    case kSpread: l = std::move(spread); break;
  }
}

void Replanner::Grow(Layout& l, std::vector<int>& pool) {
  std::vector<int> rest;
  std::vector<char> changed(l.pipes.size(), 0);
  for (int node : pool) {
    std::vector<int> sizes;
    for (const Pipe& pipe : l.pipes) sizes.push_back(static_cast<int>(pipe.nodes.size()));
    int best = -1;
    double best_time = kNoTime;
    std::map<int, double> by_size;  // pipelines of one size grow alike
    for (int j = 0; j < static_cast<int>(sizes.size()); ++j) {
      const int size = sizes[j];
      if (!Has(size + 1)) continue;
      auto it = by_size.find(size);
      if (it == by_size.end()) {
        std::vector<int> grown = sizes;
        grown[j] = size + 1;
        it = by_size.emplace(size, Time(std::move(grown))).first;
      }
      const double time = it->second;
      if (best < 0 || time < best_time || (time == best_time && size < sizes[best])) {
        best = j;
        best_time = time;
      }
    }
    if (best < 0) {
      rest.push_back(node);
      continue;
    }
    l.pipes[best].nodes.push_back(node);
    changed[best] = 1;
  }
  for (size_t j = 0; j < changed.size(); ++j)
    if (changed[j]) Relay(l, static_cast<int>(j));
  pool = std::move(rest);
}

void Replanner::FinishPool(Layout& l) {
  std::vector<int> pool = std::move(l.spare);
  pool.insert(pool.end(), l.added.begin(), l.added.end());
  l.spare.clear();
  l.added.clear();
  Layout grown = l;
  PlacePool(grown, pool, /*new_pipelines=*/false);
  PlacePool(l, pool, /*new_pipelines=*/true);
  if (grown.idle.size() < l.idle.size() ||
      (grown.idle.size() == l.idle.size() && Time(grown) < Time(l))) {
    l = std::move(grown);
  }
}

void Replanner::PlacePool(Layout& l, std::vector<int> pool, bool new_pipelines) {
  const int total = static_cast<int>(pool.size());
  const int room = p_.microbatches - static_cast<int>(l.pipes.size());
  if (new_pipelines && total >= n0_ && room > 0) {
    const int qmin = std::max(1, (total + ts_.max_nodes() - 1) / std::max(1, ts_.max_nodes()));
    const int qmax = std::min({total / n0_, room, qmin + kMaxSplitsTried - 1});
    int best_q = 0;
    double best_time = kNoTime;
    for (int q = qmin; q <= qmax; ++q) {
      const int base = total / q, extra = total % q;
      if (!Has(base) || (extra > 0 && !Has(base + 1))) continue;
      std::vector<int> sizes = Sizes(l);
      for (int i = 0; i < q; ++i) sizes.push_back(base + (i < extra ? 1 : 0));
      const double time = Time(std::move(sizes));
      if (time < best_time) best_q = q, best_time = time;
    }
    if (best_q > 0) {
      const int base = total / best_q, extra = total % best_q;
      int at = 0;
      for (int i = 0; i < best_q; ++i) {
        const int n = base + (i < extra ? 1 : 0);
        AddPipe(l, std::vector<int>(pool.begin() + at, pool.begin() + at + n),
                std::numeric_limits<int>::max());
        at += n;
      }
      pool.clear();
    }
  }
  Grow(l, pool);
  while (!pool.empty() && static_cast<int>(l.pipes.size()) < p_.microbatches) {
    const int c = static_cast<int>(pool.size());
    if (c >= n0_ && LargestTemplateAtMost(c) > 0) {
      const int n = LargestTemplateAtMost(c);
      AddPipe(l, std::vector<int>(pool.begin(), pool.begin() + n),
              std::numeric_limits<int>::max());
      pool.erase(pool.begin(), pool.begin() + n);
      continue;
    }
    const int need = n0_ - c;
    int donor = -1;
    for (int d = 0; d < static_cast<int>(l.pipes.size()); ++d) {
      const int size = static_cast<int>(l.pipes[d].nodes.size());
      if (Has(size - need) && (donor < 0 || size > static_cast<int>(l.pipes[donor].nodes.size())))
        donor = d;
    }
    if (donor < 0) break;
    std::vector<int>& from = l.pipes[donor].nodes;
    pool.insert(pool.end(), from.end() - need, from.end());
    from.resize(from.size() - need);
    Relay(l, donor);
  }
  l.idle = std::move(pool);
}

}  // namespace ob::plan::detail
