#include "ob/watch/plot.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "ob/io/text.h"
#include "ob/watch/events.h"

namespace ob::watch {
namespace {

std::string Num(double v, int decimals = 1) { return io::Fixed(v, decimals); }

// Geometry, in SVG user units (pixels).
constexpr double kWidth = 1100;
constexpr double kLeft = 70;          // y-axis labels
constexpr double kPlotW = 760;
constexpr double kLegendX = kLeft + kPlotW + 24;
constexpr double kTitleH = 48;
constexpr double kLabelRowH = 14;     // one row of event labels
constexpr int kLabelRows = 4;
constexpr double kPanelH = 240;
constexpr double kPanelGap = 56;
constexpr double kBottom = 64;

// tab10, so neighbouring ranks differ.
const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                          "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
const char* kDash[] = {"", "6,3", "2,2", "8,3,2,3"};

const char* KindColor(pb::EventKind k) {
  switch (k) {
    case pb::EVENT_CRASH: return "#d62728";
    case pb::EVENT_HANG: return "#9467bd";
    case pb::EVENT_STRAGGLER: return "#ff7f0e";
    case pb::EVENT_LOSS_NAN: return "#8b0000";
    case pb::EVENT_LOSS_SPIKE: return "#e377c2";
    case pb::EVENT_THROUGHPUT_DROP: return "#8c564b";
    case pb::EVENT_MEMORY_GROWTH: return "#bcbd22";
    case pb::EVENT_RECOVERY: return "#2ca02c";
    case pb::EVENT_ACTION: return "#17becf";
    default: return "#333333";
  }
}

std::string TickLabel(double v, double step) {
  const int decimals = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  return Num(v, std::min(decimals, 6));
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(i), v.end());
  return v[i];
}

}  // namespace

void Timeline::Add(const pb::Metrics& m) {
  if (m.heartbeat() || m.has_exit() || m.evaluation_only()) return;
  Series& s = series_[{m.generation(), m.rank()}];
  if (!m.host().empty()) s.host = m.host();
  s.points.push_back({m.step(), m.step_seconds(), m.forward_seconds() + m.backward_seconds()});
  auto it = generation_first_step_.find(m.generation());
  if (it == generation_first_step_.end()) generation_first_step_[m.generation()] = m.step();
  else it->second = std::min(it->second, m.step());
}

void Timeline::AddEvent(const pb::Event& e) { events_.push_back(e); }

std::string Timeline::Svg(const std::string& title) const {
  // The x range: every step drawn, and every event.
  uint64_t lo = UINT64_MAX, hi = 0;
  for (const auto& [key, s] : series_)
    for (const auto& p : s.points) {
      lo = std::min(lo, p.step);
      hi = std::max(hi, p.step);
    }
  for (const auto& e : events_) {
    lo = std::min(lo, e.step());
    hi = std::max(hi, e.step());
  }
  if (lo == UINT64_MAX) lo = hi = 0;
  if (hi == lo) hi = lo + 1;
  const double x0 = static_cast<double>(lo), x1 = static_cast<double>(hi);
  auto X = [&](double step) { return kLeft + (step - x0) / (x1 - x0) * kPlotW; };

  const double labels_top = kTitleH;
  const double panel_top[2] = {labels_top + kLabelRows * kLabelRowH + 8,
                               labels_top + kLabelRows * kLabelRowH + 8 + kPanelH + kPanelGap};
  const double height = panel_top[1] + kPanelH + kBottom;
  const char* panel_title[2] = {"step time (s)", "compute: forward + backward (s)"};

  std::ostringstream o;
  o << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << Num(kWidth, 0) << "\" height=\""
    << Num(height, 0) << "\" viewBox=\"0 0 " << Num(kWidth, 0) << " " << Num(height, 0)
    << "\" font-family=\"sans-serif\" font-size=\"11\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << Num(kLeft) << "\" y=\"22\" font-size=\"15\" font-weight=\"bold\">" << io::XmlEscape(title)
    << "</text>\n";
  size_t points = 0;
  for (const auto& [key, s] : series_) points += s.points.size();
  o << "<text x=\"" << Num(kLeft) << "\" y=\"38\" fill=\"#555\">" << series_.size()
    << " rank series, " << points << " steps drawn, " << events_.size()
    << " events (vertical lines); dashed grey lines: a new generation</text>\n";

  // Series are drawn in (generation, rank) order. A colour follows a host
  // (and the rank's place among its host's ranks) across generations, so a
  // host keeps its colour when the ranks are renumbered.
  std::vector<const std::pair<const RankKey, Series>*> order;
  for (const auto& kv : series_) order.push_back(&kv);
  std::map<std::string, size_t> slot_of;  // "host#k" → colour slot
  std::map<std::pair<uint64_t, std::string>, int> on_host;
  std::vector<size_t> style(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    const std::string host = order[i]->second.host;
    const int k = on_host[{order[i]->first.generation, host}]++;
    const std::string key = host + "#" + std::to_string(k);
    auto it = slot_of.find(key);
    if (it == slot_of.end()) it = slot_of.emplace(key, slot_of.size()).first;
    style[i] = it->second;
  }

  for (int panel = 0; panel < 2; ++panel) {
    const double top = panel_top[panel], bottom = top + kPanelH;
    std::vector<double> values;
    for (const auto* kv : order)
      for (const auto& p : kv->second.points)
        values.push_back(panel == 0 ? p.step_seconds : p.compute_seconds);
    double ymax = Percentile(values, 0.995) * 1.15;
    if (!(ymax > 0)) ymax = 1;
    const double ystep = io::TickStep(ymax, 5);
    ymax = std::ceil(ymax / ystep - 1e-9) * ystep;
    auto Y = [&](double v) { return bottom - std::min(std::max(v, 0.0), ymax) / ymax * kPanelH; };

    o << "<g class=\"panel\" id=\"panel-" << (panel == 0 ? "step" : "compute") << "\">\n";
    o << "<text x=\"" << Num(kLeft) << "\" y=\"" << Num(top - 6) << "\" font-weight=\"bold\">"
      << panel_title[panel] << "</text>\n";
    // Grid and y ticks.
    for (double v = 0; v <= ymax + ystep / 2; v += ystep) {
      o << "<line x1=\"" << Num(kLeft) << "\" x2=\"" << Num(kLeft + kPlotW) << "\" y1=\"" << Num(Y(v))
        << "\" y2=\"" << Num(Y(v)) << "\" stroke=\"#e5e5e5\"/>"
        << "<text x=\"" << Num(kLeft - 6) << "\" y=\"" << Num(Y(v) + 4)
        << "\" text-anchor=\"end\">" << TickLabel(v, ystep) << "</text>\n";
    }
    // x ticks.
    const double xstep = std::max(1.0, io::TickStep(x1 - x0, 8));
    for (double v = std::ceil(x0 / xstep) * xstep; v <= x1 + 1e-9; v += xstep) {
      o << "<line x1=\"" << Num(X(v)) << "\" x2=\"" << Num(X(v)) << "\" y1=\"" << Num(bottom)
        << "\" y2=\"" << Num(bottom + 4) << "\" stroke=\"#333\"/>"
        << "<text x=\"" << Num(X(v)) << "\" y=\"" << Num(bottom + 16)
        << "\" text-anchor=\"middle\">" << TickLabel(v, xstep) << "</text>\n";
    }
    o << "<text x=\"" << Num(kLeft + kPlotW / 2) << "\" y=\"" << Num(bottom + 32)
      << "\" text-anchor=\"middle\">step</text>\n";
    o << "<text transform=\"translate(" << Num(kLeft - 48) << "," << Num(top + kPanelH / 2)
      << ") rotate(-90)\" text-anchor=\"middle\">seconds</text>\n";

    // Generation boundaries.
    for (const auto& [gen, first] : generation_first_step_) {
      if (gen == generation_first_step_.begin()->first) continue;
      const double x = X(static_cast<double>(first));
      o << "<line class=\"generation\" x1=\"" << Num(x) << "\" x2=\"" << Num(x) << "\" y1=\""
        << Num(top) << "\" y2=\"" << Num(bottom) << "\" stroke=\"#999\" stroke-dasharray=\"4,4\"/>"
        << "<text x=\"" << Num(x + 3) << "\" y=\"" << Num(bottom - 4) << "\" fill=\"#777\">gen " << gen
        << "</text>\n";
    }
    // Events.
    for (const auto& e : events_) {
      const double x = X(static_cast<double>(e.step()));
      o << "<line class=\"event\" x1=\"" << Num(x) << "\" x2=\"" << Num(x) << "\" y1=\"" << Num(top)
        << "\" y2=\"" << Num(bottom) << "\" stroke=\"" << KindColor(e.kind())
        << "\" stroke-width=\"1.2\" opacity=\"0.8\"><title>" << io::XmlEscape(EventLine(e)) << "</title></line>\n";
    }
    // One polyline per series, thinned to two points per pixel column.
    for (size_t index = 0; index < order.size(); ++index) {
      const auto* kv = order[index];
      const auto& pts = kv->second.points;
      std::vector<Point> sorted = pts;
      std::stable_sort(sorted.begin(), sorted.end(),
                       [](const Point& a, const Point& b) { return a.step < b.step; });
      std::ostringstream line;
      int column = -1;
      double cmin = 0, cmax = 0;
      uint64_t smin = 0, smax = 0;
      auto flush = [&] {
        if (column < 0) return;
        const bool min_first = smin <= smax;
        const double a = min_first ? cmin : cmax, b = min_first ? cmax : cmin;
        const double xa = X(static_cast<double>(min_first ? smin : smax));
        const double xb = X(static_cast<double>(min_first ? smax : smin));
        line << Num(xa, 2) << "," << Num(Y(a), 2) << " ";
        if (smin != smax) line << Num(xb, 2) << "," << Num(Y(b), 2) << " ";
      };
      for (const auto& p : sorted) {
        const double v = panel == 0 ? p.step_seconds : p.compute_seconds;
        const int col = static_cast<int>(X(static_cast<double>(p.step)));
        if (col != column) {
          flush();
          column = col;
          cmin = cmax = v;
          smin = smax = p.step;
        } else {
          if (v < cmin) { cmin = v; smin = p.step; }
          if (v > cmax) { cmax = v; smax = p.step; }
        }
      }
      flush();
      const char* dash = kDash[(style[index] / 10) % 4];
      o << "<polyline class=\"rank\" data-generation=\"" << kv->first.generation << "\" data-rank=\""
        << kv->first.rank << "\" fill=\"none\" stroke=\"" << kPalette[style[index] % 10]
        << "\" stroke-width=\"1.3\" stroke-opacity=\"0.85\""
        << (*dash ? std::string(" stroke-dasharray=\"") + dash + "\"" : "")
        << " points=\"" << line.str() << "\"><title>" << io::XmlEscape(kv->second.host) << " rank "
        << kv->first.rank << " (generation " << kv->first.generation << ")</title></polyline>\n";
    }
    o << "<rect x=\"" << Num(kLeft) << "\" y=\"" << Num(top) << "\" width=\"" << Num(kPlotW)
      << "\" height=\"" << Num(kPanelH) << "\" fill=\"none\" stroke=\"#333\"/>\n</g>\n";
  }

  // Event labels above the top panel, in up to kLabelRows rows; a label that
  // would overlap in every row is left to the line's tooltip.
  std::vector<double> row_end(kLabelRows, -1e9);
  size_t unlabelled = 0;
  for (const auto& e : events_) {
    const double x = X(static_cast<double>(e.step()));
    std::string label = KindName(e.kind());
    if (!e.host().empty()) label += " " + e.host();
    if (e.rank() >= 0) label += " r" + std::to_string(e.rank());
    const double w = 6.2 * static_cast<double>(label.size());
    const double lx = std::min(x, kLeft + kPlotW - w);  // keep it inside the plot width
    int row = -1;
    for (int r = 0; r < kLabelRows && row < 0; ++r)
      if (lx > row_end[r] + 4) row = r;
    if (row < 0) {
      ++unlabelled;
      continue;
    }
    row_end[row] = lx + w;
    const double y = labels_top + (row + 1) * kLabelRowH - 3;
    o << "<text class=\"event-label\" x=\"" << Num(lx) << "\" y=\"" << Num(y) << "\" fill=\""
      << KindColor(e.kind()) << "\" font-size=\"10.5\">" << io::XmlEscape(label) << "</text>"
      << "<line x1=\"" << Num(x) << "\" x2=\"" << Num(x) << "\" y1=\"" << Num(y + 2) << "\" y2=\""
      << Num(panel_top[0]) << "\" stroke=\"" << KindColor(e.kind()) << "\" stroke-width=\"0.6\""
      << " stroke-dasharray=\"1,2\"/>\n";
  }
  if (unlabelled > 0)
    o << "<text x=\"" << Num(kLeft + kPlotW) << "\" y=\"38\" text-anchor=\"end\" fill=\"#555\">"
      << unlabelled << " event labels left out (hover a line)</text>\n";

  // Legend: one entry per series, then the event colours in use.
  double ly = panel_top[0];
  o << "<g class=\"legend\">\n<text x=\"" << Num(kLegendX) << "\" y=\"" << Num(ly - 6)
    << "\" font-weight=\"bold\">ranks</text>\n";
  constexpr size_t kMaxLegend = 28;
  for (size_t index = 0; index < order.size(); ++index) {
    const auto* kv = order[index];
    if (index == kMaxLegend) {
      o << "<text x=\"" << Num(kLegendX) << "\" y=\"" << Num(ly + 10) << "\" fill=\"#555\">… "
        << order.size() - kMaxLegend << " more</text>\n";
      ly += 16;
      break;
    }
    const char* dash = kDash[(style[index] / 10) % 4];
    o << "<line x1=\"" << Num(kLegendX) << "\" x2=\"" << Num(kLegendX + 22) << "\" y1=\"" << Num(ly + 6)
      << "\" y2=\"" << Num(ly + 6) << "\" stroke=\"" << kPalette[style[index] % 10] << "\" stroke-width=\"2\""
      << (*dash ? std::string(" stroke-dasharray=\"") + dash + "\"" : "") << "/>"
      << "<text x=\"" << Num(kLegendX + 28) << "\" y=\"" << Num(ly + 10) << "\">"
      << io::XmlEscape(kv->second.host) << " · rank " << kv->first.rank << " · gen " << kv->first.generation
      << "</text>\n";
    ly += 16;
  }
  std::map<pb::EventKind, size_t> kinds;
  for (const auto& e : events_) kinds[e.kind()]++;
  if (!kinds.empty()) {
    ly += 10;
    o << "<text x=\"" << Num(kLegendX) << "\" y=\"" << Num(ly + 4) << "\" font-weight=\"bold\">events</text>\n";
    ly += 10;
    for (const auto& [k, n] : kinds) {
      o << "<line x1=\"" << Num(kLegendX + 11) << "\" x2=\"" << Num(kLegendX + 11) << "\" y1=\""
        << Num(ly) << "\" y2=\"" << Num(ly + 12) << "\" stroke=\"" << KindColor(k)
        << "\" stroke-width=\"2\"/><text x=\"" << Num(kLegendX + 28) << "\" y=\"" << Num(ly + 10)
        << "\">" << KindName(k) << " (" << n << ")</text>\n";
      ly += 16;
    }
  }
  o << "</g>\n</svg>\n";
  return o.str();
}

}  // namespace ob::watch
