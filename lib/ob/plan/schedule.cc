#include "ob/plan/schedule.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <tuple>
#include <utility>

namespace ob::plan {
namespace {

// Forward and backward seconds of one micro-batch through a stage: the
// compute split by the layers' own forward/backward ratio, the tensor-parallel
// all-reduces (what StageComputeSeconds adds beyond compute / tp) half each way.
std::pair<double, double> StageOpSeconds(const Problem& p, const StageShape& st) {
  double fwd = 0, bwd = 0;
  for (int l = st.first; l <= st.last; ++l) fwd += p.layers[l].forward, bwd += p.layers[l].backward;
  const int tp = std::max(1, st.tp);
  const double extra = StageComputeSeconds(p, st.first, st.last, tp) - (fwd + bwd) / tp;
  return {fwd / tp + extra / 2, bwd / tp + extra / 2};
}

const Template* FindTemplate(const TemplateSet& ts, int nodes) {
  for (const auto& t : ts.templates)
    if (t.nodes == nodes) return &t;
  return nullptr;
}

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string Num(double v, int decimals = 1) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

// A round tick step (1, 2 or 5 × 10^k) giving about `want` ticks over `span`.
double TickStep(double span, int want) {
  if (span <= 0) return 1;
  const double raw = span / want, base = std::pow(10.0, std::floor(std::log10(raw)));
  for (double f : {1.0, 2.0, 5.0})
    if (f * base >= raw) return f * base;
  return 10 * base;
}

}  // namespace

std::vector<ScheduledOp> Simulate1F1B(const Problem& p, const Template& t, int microbatches,
                                      const std::vector<int>& nodes, const BandwidthMatrix* bw) {
  const int S = static_cast<int>(t.stages.size());
  const int m = microbatches;
  const int k = std::max(1, t.stages_per_node);
  if (S == 0 || m <= 0) return {};
  // Per stage: op durations, and the one-way transfer after it each way.
  std::vector<double> fwd(S), bwd(S), send(S, 0), send_back(S, 0);
  for (int i = 0; i < S; ++i) {
    std::tie(fwd[i], bwd[i]) = StageOpSeconds(p, t.stages[i]);
    if (i + 1 == S) continue;
    const int a = i / k, b = (i + 1) / k;
    if (a == b) {  // the next stage is on the same node
      send[i] = send_back[i] = StageBoundarySeconds(p, t.stages[i].last, false) / 2;
    } else if (bw && b < static_cast<int>(nodes.size())) {
      const int na = nodes[a], nb = nodes[b];
      send[i] = BoundarySeconds(p, t.stages[i].last, bw->Bandwidth(na, nb), bw->Latency(na, nb)) / 2;
      send_back[i] =
          BoundarySeconds(p, t.stages[i].last, bw->Bandwidth(nb, na), bw->Latency(nb, na)) / 2;
    } else {
      send[i] = send_back[i] = StageBoundarySeconds(p, t.stages[i].last, true) / 2;
    }
  }
  // Each stage's op order: warm-up forwards, one-forward-one-backward, drain.
  std::vector<std::vector<ScheduledOp>> order(S);
  for (int i = 0; i < S; ++i) {
    const int warm = std::min(S - i - 1, m);
    int f = 0, b = 0;
    auto add = [&](bool forward) {
      ScheduledOp op;
      op.stage = i;
      op.forward = forward;
      op.microbatch = forward ? f++ : b++;
      order[i].push_back(op);
    };
    for (int w = 0; w < warm; ++w) add(true);
    while (f < m) add(true), add(false);
    while (b < m) add(false);
  }
  // Run ops in each stage's order as soon as their input has arrived; 1F1B
  // cannot deadlock, so every sweep schedules something.
  std::vector<std::vector<double>> f_end(S, std::vector<double>(m, -1)), b_end = f_end;
  std::vector<size_t> next(S, 0);
  std::vector<double> free_at(S, 0);
  size_t done = 0;
  const size_t total = static_cast<size_t>(S) * m * 2;
  while (done < total) {
    const size_t before = done;
    for (int i = 0; i < S; ++i) {
      while (next[i] < order[i].size()) {
        ScheduledOp& op = order[i][next[i]];
        double ready;
        if (op.forward) {
          ready = i == 0 ? 0 : f_end[i - 1][op.microbatch];
          if (ready < 0) break;
          if (i > 0) ready += send[i - 1];
        } else {
          ready = i + 1 == S ? f_end[i][op.microbatch] : b_end[i + 1][op.microbatch];
          if (ready < 0) break;
          if (i + 1 < S) ready += send_back[i];
        }
        op.start = std::max(ready, free_at[i]);
        op.end = op.start + (op.forward ? fwd[i] : bwd[i]);
        free_at[i] = op.end;
        (op.forward ? f_end : b_end)[i][op.microbatch] = op.end;
        ++next[i];
        ++done;
      }
    }
    assert(done > before && "1F1B deadlocked");
    if (done == before) break;
  }
  std::vector<ScheduledOp> out;
  out.reserve(total);
  for (auto& ops : order) out.insert(out.end(), ops.begin(), ops.end());
  return out;
}

std::string ScheduleSvg(const Problem& p, const TemplateSet& ts, const Instantiation& inst,
                        const BandwidthMatrix* bw) {
  // Layout, in pixels.
  // Lane labels run to ~48 characters ("pipeline 12 stage 31 (node 1023, layers 90-97)").
  const double kLabelW = 300, kPlotW = 1000, kRight = 90, kLaneH = 18, kLaneGap = 3;
  const double kTop = 58, kPipeGap = 22, kAxisH = 36;
  struct Lanes {
    std::vector<ScheduledOp> ops;
    const Template* t;
    double makespan = 0;
  };
  std::vector<Lanes> pipes;
  double horizon = 0;
  int microbatches = 0;
  for (const auto& pi : inst.pipelines) {
    Lanes lanes;
    lanes.t = FindTemplate(ts, pi.template_nodes);
    if (lanes.t) lanes.ops = Simulate1F1B(p, *lanes.t, pi.microbatches, pi.nodes, bw);
    for (const auto& op : lanes.ops) lanes.makespan = std::max(lanes.makespan, op.end);
    horizon = std::max(horizon, lanes.makespan);
    microbatches += pi.microbatches;
    pipes.push_back(std::move(lanes));
  }
  if (horizon <= 0) horizon = 1e-3;
  const double ms = horizon * 1e3;
  const double step = TickStep(ms, 10);
  const double x_max_ms = std::ceil(ms / step) * step;
  auto x = [&](double seconds) { return kLabelW + seconds * 1e3 / x_max_ms * kPlotW; };

  double height = kTop;
  for (const auto& lanes : pipes)
    height += (lanes.t ? lanes.t->stages.size() : 0) * (kLaneH + kLaneGap) + kPipeGap;
  const double plot_bottom = height;
  height += kAxisH + 20;
  const double width = kLabelW + kPlotW + kRight;

  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << Num(width, 0) << "\" height=\""
    << Num(height, 0) << "\" viewBox=\"0 0 " << Num(width, 0) << ' ' << Num(height, 0)
    << "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  o << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  const std::string title = "1F1B schedule: " + std::to_string(inst.pipelines.size()) +
                            " pipeline(s), " + std::to_string(microbatches) +
                            " micro-batches, iteration " + Num(ms, 2) + " ms (compute and " +
                            "transfers; all-reduce not shown)";
  o << "<text x=\"10\" y=\"22\" font-size=\"15\" font-weight=\"bold\">" << Escape(title)
    << "</text>\n";
  // Legend.
  o << "<rect x=\"10\" y=\"32\" width=\"12\" height=\"12\" fill=\"#4c78a8\"/>"
    << "<text x=\"26\" y=\"42\">forward</text>"
    << "<rect x=\"86\" y=\"32\" width=\"12\" height=\"12\" fill=\"#f58518\"/>"
    << "<text x=\"102\" y=\"42\">backward</text>"
    << "<text x=\"170\" y=\"42\" fill=\"#666\">gaps are idle time; red line: pipeline makespan</text>\n";
  // Grid lines and the time axis.
  for (double v = 0; v <= x_max_ms + step / 2; v += step) {
    const double px = kLabelW + v / x_max_ms * kPlotW;
    o << "<line x1=\"" << Num(px) << "\" y1=\"" << Num(kTop - 6) << "\" x2=\"" << Num(px)
      << "\" y2=\"" << Num(plot_bottom) << "\" stroke=\"#e4e4e4\"/>"
      << "<text x=\"" << Num(px) << "\" y=\"" << Num(plot_bottom + 16)
      << "\" text-anchor=\"middle\">" << Escape(Num(v, step < 1 ? 2 : 0)) << "</text>\n";
  }
  o << "<line x1=\"" << Num(kLabelW) << "\" y1=\"" << Num(plot_bottom) << "\" x2=\""
    << Num(kLabelW + kPlotW) << "\" y2=\"" << Num(plot_bottom) << "\" stroke=\"#333\"/>\n";
  o << "<text x=\"" << Num(kLabelW + kPlotW / 2) << "\" y=\"" << Num(plot_bottom + 32)
    << "\" text-anchor=\"middle\">time (ms)</text>\n";

  double y = kTop;
  for (size_t j = 0; j < pipes.size(); ++j) {
    const auto& lanes = pipes[j];
    const auto& pi = inst.pipelines[j];
    if (!lanes.t) continue;
    const int S = static_cast<int>(lanes.t->stages.size());
    const int k = std::max(1, lanes.t->stages_per_node);
    const double top = y;
    for (int i = 0; i < S; ++i) {
      const double ly = y + i * (kLaneH + kLaneGap);
      const int q = i / k;
      const std::string node =
          q < static_cast<int>(pi.nodes.size()) ? std::to_string(pi.nodes[q]) : "?";
      const auto& st = lanes.t->stages[i];
      const std::string label = "pipeline " + std::to_string(j) + " stage " + std::to_string(i) +
                                " (node " + node + ", layers " + std::to_string(st.first) + "-" +
                                std::to_string(st.last) + ")";
      o << "<text class=\"lane\" x=\"" << Num(kLabelW - 6) << "\" y=\"" << Num(ly + kLaneH - 5)
        << "\" text-anchor=\"end\">" << Escape(label) << "</text>"
        << "<rect x=\"" << Num(kLabelW) << "\" y=\"" << Num(ly) << "\" width=\"" << Num(kPlotW)
        << "\" height=\"" << Num(kLaneH) << "\" fill=\"#f7f7f7\"/>\n";
    }
    for (const auto& op : lanes.ops) {
      const double ly = y + op.stage * (kLaneH + kLaneGap);
      const double x0 = x(op.start), w = std::max(0.5, x(op.end) - x0);
      o << "<rect x=\"" << Num(x0, 2) << "\" y=\"" << Num(ly) << "\" width=\"" << Num(w, 2)
        << "\" height=\"" << Num(kLaneH) << "\" fill=\"" << (op.forward ? "#4c78a8" : "#f58518")
        << "\" stroke=\"white\" stroke-width=\"0.5\"><title>"
        << (op.forward ? "forward" : "backward") << " micro-batch " << op.microbatch << ", "
        << Num(op.start * 1e3, 3) << "-" << Num(op.end * 1e3, 3) << " ms</title></rect>";
      const std::string mb = std::to_string(op.microbatch);
      if (w >= 7.0 * mb.size() + 4)
        o << "<text x=\"" << Num(x0 + w / 2, 2) << "\" y=\"" << Num(ly + kLaneH - 5)
          << "\" text-anchor=\"middle\" fill=\"white\" font-size=\"10\">" << mb << "</text>";
      o << '\n';
    }
    const double bottom = y + S * (kLaneH + kLaneGap) - kLaneGap;
    const double mx = x(lanes.makespan);
    o << "<line x1=\"" << Num(mx, 2) << "\" y1=\"" << Num(top - 4) << "\" x2=\"" << Num(mx, 2)
      << "\" y2=\"" << Num(bottom + 4) << "\" stroke=\"#d62728\" stroke-width=\"2\"/>"
      << "<text x=\"" << Num(mx + 4, 2) << "\" y=\"" << Num(top + 8) << "\" fill=\"#d62728\">"
      << Escape(Num(lanes.makespan * 1e3, 2) + " ms") << "</text>\n";
    y = bottom + kLaneGap + kPipeGap;
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace ob::plan
