// The layers a rank holds, as the runtime passes them around (topology.h
// RankInfo::ranges, snapshots, the recovery's holdings, the slot lists
// workers publish): [first, last] pairs in chunk order, none overlapping;
// one pair without chunks. Torch-free, pure.
#pragma once

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace ob::runtime {

using LayerRanges = std::vector<std::pair<int, int>>;

// A holding's ranges: its `ranges`, or [first_layer, last_layer] where it
// has none (one chunk, or a holding made before chunks); none when first
// > last.
template <typename Holding>
LayerRanges RangesOf(const Holding& h) {
  if (!h.ranges.empty()) return h.ranges;
  if (h.first_layer > h.last_layer) return {};
  return {{h.first_layer, h.last_layer}};
}

inline bool InRanges(const LayerRanges& r, int layer) {
  return std::any_of(r.begin(), r.end(), [layer](const auto& x) { return x.first <= layer && layer <= x.second; });
}

// Whether a holding holds `layer`: InRanges(RangesOf(h), layer) without
// copying its ranges (the recovery asks it of every rank for every layer).
template <typename Holding>
bool HoldsLayer(const Holding& h, int layer) {
  if (!h.ranges.empty()) return InRanges(h.ranges, layer);
  return h.first_layer <= layer && layer <= h.last_layer;
}

// How many layers they hold, and how many of them both do.
inline int RangesWidth(const LayerRanges& r) {
  int n = 0;
  for (const auto& [first, last] : r) n += std::max(0, last - first + 1);
  return n;
}
inline int RangesOverlap(const LayerRanges& a, const LayerRanges& b) {
  int n = 0;
  for (const auto& x : a) {
    for (const auto& y : b) n += std::max(0, std::min(x.second, y.second) - std::max(x.first, y.first) + 1);
  }
  return n;
}

// "2-5", "0-1+4-5"; "-" for none.
inline std::string RangesText(const LayerRanges& r) {
  if (r.empty()) return "-";
  std::string s;
  for (const auto& [first, last] : r) s += (s.empty() ? "" : "+") + std::to_string(first) + "-" + std::to_string(last);
  return s;
}

// RangesText's form back; false when malformed.
inline bool ParseRanges(const std::string& text, LayerRanges* out) {
  out->clear();
  if (text == "-") return true;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t end = std::min(text.find('+', at), text.size());
    int first = 0, last = 0, used = 0;
    const std::string part = text.substr(at, end - at);
    if (std::sscanf(part.c_str(), "%d-%d%n", &first, &last, &used) != 2 || used != static_cast<int>(part.size()) ||
        first < 0 || last < first) {
      return false;
    }
    out->emplace_back(first, last);
    at = end + 1;
  }
  return !out->empty();
}

}  // namespace ob::runtime
