// A run's timeline as SVG (ob-watch --plot): step time and compute time
// (forward + backward) per rank over steps, one polyline per (generation,
// rank) in each panel, events as vertical lines with labels, generation
// changes as dashed lines, axes with ticks and units, and a legend naming
// each line's host, rank and generation.
//
// Timeline keeps every step record's figures (a few dozen bytes each);
// drawing thins lines to at most two points per pixel column (the column's
// lowest and highest), so spikes stay visible. Values above the 99.5th
// percentile × 1.15 are drawn at the top edge. Not thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ob/metrics.pb.h"
#include "ob/watch/state.h"

namespace ob::watch {

class Timeline {
 public:
  // Keeps a step record's figures; heartbeats and exits are not drawn.
  void Add(const pb::Metrics& m);
  void AddEvent(const pb::Event& e);
  // The SVG document; `title` heads it. An empty timeline draws empty axes.
  std::string Svg(const std::string& title) const;

 private:
  struct Point {
    uint64_t step;
    double step_seconds, compute_seconds;
  };
  struct Series {
    std::string host;
    std::vector<Point> points;
  };
  std::map<RankKey, Series> series_;
  std::vector<pb::Event> events_;
  std::map<uint64_t, uint64_t> generation_first_step_;
};

}  // namespace ob::watch
