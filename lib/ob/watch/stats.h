// Robust statistics for the detectors: medians, the median absolute
// deviation, a bounded window of recent values and a k-of-n vote.
// Pure functions and small values; no shared state.
#pragma once

#include <cstddef>
#include <deque>
#include <vector>

namespace ob::watch {

// The median of `v` (the mean of the middle two for an even count); 0 when
// empty. Takes a copy: callers keep their order.
double Median(std::vector<double> v);

// The median absolute deviation from `median`, unscaled; 0 when empty.
double Mad(const std::vector<double>& v, double median);

// 1.4826 × MAD estimates σ for normal data.
inline constexpr double kMadToSigma = 1.4826;

// The last `capacity` values pushed (capacity ≥ 1).
class Window {
 public:
  explicit Window(size_t capacity) : capacity_(capacity < 1 ? 1 : capacity) {}
  void Push(double v) {
    values_.push_back(v);
    if (values_.size() > capacity_) values_.pop_front();
  }
  void Clear() { values_.clear(); }
  size_t size() const { return values_.size(); }
  bool full() const { return values_.size() == capacity_; }
  double back() const { return values_.back(); }
  std::vector<double> values() const { return {values_.begin(), values_.end()}; }
  double median() const { return Median(values()); }

 private:
  size_t capacity_;
  std::deque<double> values_;
};

// A vote over the last n observations: Confirmed() when at least k of them
// were true. Reset() starts a fresh vote, so successive confirmations rest
// on disjoint evidence.
class KOfN {
 public:
  KOfN(int k, int n) : k_(k), n_(n < 1 ? 1 : n) {}
  void Push(bool hit) {
    bits_.push_back(hit);
    if (static_cast<int>(bits_.size()) > n_) bits_.pop_front();
  }
  int hits() const {
    int h = 0;
    for (bool b : bits_) h += b ? 1 : 0;
    return h;
  }
  bool Confirmed() const { return hits() >= k_; }
  void Reset() { bits_.clear(); }
  int k() const { return k_; }
  int n() const { return n_; }

 private:
  int k_, n_;
  std::deque<bool> bits_;
};

}  // namespace ob::watch
