#include "ob/plan/schedule.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <sstream>
#include <tuple>
#include <utility>

#include "ob/io/text.h"
#include "ob/runtime/schedule.h"

namespace ob::plan {
namespace {

std::string Num(double v, int decimals = 1) { return io::Fixed(v, decimals); }

// Forward and backward seconds of one micro-batch through a stage: the
// compute split by the layers' own forward/backward ratio, the tensor-parallel
// all-reduces (what StageComputeSeconds adds beyond compute / tp) half each way,
// and what its recomputation mode computes again in the backward.
std::pair<double, double> StageOpSeconds(const Problem& p, const StageShape& st) {
  double fwd = 0, bwd = 0;
  for (int l = st.first; l <= st.last; ++l) fwd += p.layers[l].forward, bwd += p.layers[l].backward;
  const int tp = std::max(1, st.tp);
  const double plain = StageComputeSeconds(p, st.first, st.last, tp);
  const double extra = plain - (fwd + bwd) / tp;
  const double again = StageComputeSeconds(p, st.first, st.last, tp, st.recompute) - plain;
  return {fwd / tp + extra / 2, bwd / tp + extra / 2 + again};
}

// One pipeline's op durations per stage and the one-way transfer after each
// stage, each way (see Simulate1F1B).
struct PipelineCosts {
  std::vector<double> fwd, bwd, send, send_back;
};

PipelineCosts CostsOf(const Problem& p, const Template& t, const std::vector<int>& nodes,
                      const BandwidthMatrix* bw) {
  const int S = static_cast<int>(t.stages.size());
  PipelineCosts c;
  c.fwd.assign(S, 0), c.bwd.assign(S, 0), c.send.assign(S, 0), c.send_back.assign(S, 0);
  for (int i = 0; i < S; ++i) {
    std::tie(c.fwd[i], c.bwd[i]) = StageOpSeconds(p, t.stages[i]);
    if (i + 1 == S) continue;
    const int a = t.NodeOf(i), b = t.NodeOf(i + 1);
    if (a == b) {  // the next stage is on the same node
      c.send[i] = c.send_back[i] = StageBoundarySeconds(p, t.stages[i].last, false) / 2;
    } else if (bw && b < static_cast<int>(nodes.size())) {
      const int na = nodes[a], nb = nodes[b];
      c.send[i] = BoundarySeconds(p, t.stages[i].last, bw->Bandwidth(na, nb), bw->Latency(na, nb)) / 2;
      c.send_back[i] = BoundarySeconds(p, t.stages[i].last, bw->Bandwidth(nb, na), bw->Latency(nb, na)) / 2;
    } else {
      c.send[i] = c.send_back[i] = StageBoundarySeconds(p, t.stages[i].last, true) / 2;
    }
  }
  return c;
}

// Each stage's op order, the workers' own (runtime::OneFOneB).
std::vector<std::vector<ScheduledOp>> OneFOneBOrder(int S, int m) {
  std::vector<std::vector<ScheduledOp>> order(S);
  for (int i = 0; i < S; ++i) {
    for (const runtime::PipelineOp& o : runtime::OneFOneB(i, S, m)) {
      ScheduledOp op;
      op.stage = i;
      op.forward = o.forward;
      op.microbatch = o.microbatch;
      order[i].push_back(op);
    }
  }
  return order;
}

// When the next op of stage i (in `order`) may start: its input's arrival,
// or a negative number while that input is not computed yet.
double ReadyAt(const ScheduledOp& op, int S, const PipelineCosts& c,
               const std::vector<std::vector<double>>& f_end, const std::vector<std::vector<double>>& b_end) {
  const int i = op.stage;
  if (op.forward) {
    if (i == 0) return 0;
    const double e = f_end[i - 1][op.microbatch];
    return e < 0 ? -1 : e + c.send[i - 1];
  }
  if (i + 1 == S) return f_end[i][op.microbatch];
  const double e = b_end[i + 1][op.microbatch];
  return e < 0 ? -1 : e + c.send_back[i];
}

}  // namespace

std::vector<ScheduledOp> Simulate1F1B(const Problem& p, const Template& t, int microbatches,
                                      const std::vector<int>& nodes, const BandwidthMatrix* bw) {
  const int S = static_cast<int>(t.stages.size());
  const int m = microbatches;
  if (S == 0 || m <= 0) return {};
  const PipelineCosts c = CostsOf(p, t, nodes, bw);
  std::vector<std::vector<ScheduledOp>> order = OneFOneBOrder(S, m);
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
        const double ready = ReadyAt(op, S, c, f_end, b_end);
        if (ready < 0) break;
        op.start = std::max(ready, free_at[i]);
        op.end = op.start + (op.forward ? c.fwd[i] : c.bwd[i]);
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

double ContentionSlowdown(const std::vector<double>& curve, int k) {
  if (curve.empty() || k <= 1) return 1.0;
  const int n = static_cast<int>(curve.size());
  if (k <= n) return curve[k - 1];
  return curve.back() * k / n;
}

PipelineTimes SharedCoresTimes(const Problem& p, const TemplateSet& ts, const Instantiation& inst) {
  const std::vector<double>& curve = p.cluster.contention;
  // The profile timed the layers with all of its processes computing:
  // alone, an op takes its time over that many's slowdown.
  const double measured_at = ContentionSlowdown(curve, static_cast<int>(curve.size()));
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // One stage of one pipeline running its program (runtime::StageProgram).
  struct Lane {
    int pipe = 0, stage = 0, procs = 1;
    std::vector<runtime::StageInstr> program;
    size_t pc = 0;
    double left = -1;        // a compute's work left, in seconds alone; < 0: none running
    double start = 0;        // when the current instruction started (a compute) or was posted
    bool posted = false;     // the current batch of messages is posted
    std::vector<double> done;  // per message of the posted batch: when it completes; kInf: unmatched
  };
  struct Pipe {
    const Template* t = nullptr;
    PipelineCosts c;
    double end = 0;
    int first_lane = 0;
  };
  std::vector<Pipe> pipes;
  std::vector<Lane> lanes;
  for (size_t j = 0; j < inst.pipelines.size(); ++j) {
    const auto& pi = inst.pipelines[j];
    Pipe q;
    q.t = ts.ForNodes(pi.template_nodes);
    q.first_lane = static_cast<int>(lanes.size());
    if (q.t != nullptr && pi.microbatches > 0) {
      const int S = static_cast<int>(q.t->stages.size());
      q.c = CostsOf(p, *q.t, pi.nodes, nullptr);
      for (int i = 0; i < S; ++i) {
        Lane l;
        l.pipe = static_cast<int>(j);
        l.stage = i;
        l.procs = std::max(1, q.t->stages[i].tp);
        l.program = runtime::StageProgram(i, S, pi.microbatches);
        lanes.push_back(std::move(l));
      }
    }
    pipes.push_back(std::move(q));
  }
  // A message between neighbours meets when both have posted the batches
  // holding it (a rendezvous, as NCCL's and Gloo's point-to-point are) and
  // arrives its transfer time later; a batch completes with its last
  // message. Computes share the cores: between two events, the k
  // processes computing each run at 1 / slowdown(k) of their speed alone.
  auto match = [&](Lane& l) {
    const Pipe& q = pipes[l.pipe];
    const auto& batch = l.program[l.pc].comm;
    for (size_t m = 0; m < batch.size(); ++m) {
      if (l.done[m] < kInf) continue;
      const runtime::P2p& msg = batch[m];
      Lane& peer = lanes[q.first_lane + msg.peer];
      if (!peer.posted) continue;
      const auto& theirs = peer.program[peer.pc].comm;
      for (size_t n = 0; n < theirs.size(); ++n) {
        const runtime::P2p& o = theirs[n];
        if (o.send == msg.send || o.activation != msg.activation || o.peer != l.stage || o.microbatch != msg.microbatch)
          continue;
        const int low = std::min(l.stage, msg.peer);  // the boundary after stage `low`
        const double transfer = msg.activation ? q.c.send[low] : q.c.send_back[low];
        l.done[m] = peer.done[n] = std::max(l.start, peer.start) + transfer;
      }
    }
  };
  double now = 0;
  std::vector<std::vector<double>> stage_busy(pipes.size());
  for (const Lane& l : lanes) stage_busy[l.pipe].resize(l.stage + 1, 0.0);
  for (;;) {
    // Start what can start now; complete the batches whose messages have
    // all arrived by now; repeat until nothing changes.
    for (bool changed = true; changed;) {
      changed = false;
      for (Lane& l : lanes) {
        if (l.pc >= l.program.size() || l.left >= 0) continue;
        const runtime::StageInstr& in = l.program[l.pc];
        if (in.kind != runtime::StageInstr::kComm) {
          const auto& c = pipes[l.pipe].c;
          l.left = (in.kind == runtime::StageInstr::kForward ? c.fwd[l.stage] : c.bwd[l.stage]) / measured_at;
          l.start = now;
          continue;
        }
        if (!l.posted) {
          l.posted = true;
          l.start = now;
          l.done.assign(in.comm.size(), kInf);
          changed = true;
        }
        match(l);
        double last = 0;
        for (double d : l.done) last = std::max(last, d);
        if (last <= now) {
          l.posted = false;
          ++l.pc;
          pipes[l.pipe].end = std::max(pipes[l.pipe].end, now);
          changed = true;
        }
      }
    }
    int busy = 0;
    double next_arrival = kInf;
    bool left_any = false;
    for (const Lane& l : lanes) {
      if (l.pc >= l.program.size()) continue;
      left_any = true;
      if (l.left >= 0) busy += l.procs;
      if (l.posted)
        for (double d : l.done)
          if (d > now && d < kInf) next_arrival = std::min(next_arrival, d);
    }
    if (!left_any) break;
    const double rate = 1.0 / ContentionSlowdown(curve, busy);
    double first_end = kInf;
    for (const Lane& l : lanes)
      if (l.left >= 0) first_end = std::min(first_end, l.left / rate);
    const double dt = std::min(first_end, next_arrival - now);
    assert(dt < kInf && "the pipelines' programs deadlocked");
    if (!(dt < kInf)) break;
    const bool ends = first_end <= dt;
    now += dt;
    for (Lane& l : lanes) {
      if (l.left < 0) continue;
      if (ends && l.left / rate <= first_end * (1 + 1e-12)) {
        stage_busy[l.pipe][l.stage] += now - l.start;
        l.left = -1;
        ++l.pc;
        pipes[l.pipe].end = std::max(pipes[l.pipe].end, now);
      } else {
        l.left = std::max(0.0, l.left - dt * rate);
      }
    }
  }
  PipelineTimes out;
  for (const Lane& l : lanes) out.busy += stage_busy[l.pipe][l.stage] * l.procs;
  out.stage_busy = std::move(stage_busy);
  for (const Pipe& q : pipes) out.seconds.push_back(q.t ? q.end + StepTailSeconds(p, *q.t) : 0.0);
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
    lanes.t = ts.ForNodes(pi.template_nodes);
    if (lanes.t) lanes.ops = Simulate1F1B(p, *lanes.t, pi.microbatches, pi.nodes, bw);
    for (const auto& op : lanes.ops) lanes.makespan = std::max(lanes.makespan, op.end);
    horizon = std::max(horizon, lanes.makespan);
    microbatches += pi.microbatches;
    pipes.push_back(std::move(lanes));
  }
  if (horizon <= 0) horizon = 1e-3;
  const double ms = horizon * 1e3;
  const double step = io::TickStep(ms, 10);
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
  o << "<text x=\"10\" y=\"22\" font-size=\"15\" font-weight=\"bold\">" << io::XmlEscape(title)
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
      << "\" text-anchor=\"middle\">" << io::XmlEscape(Num(v, step < 1 ? 2 : 0)) << "</text>\n";
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
    const double top = y;
    for (int i = 0; i < S; ++i) {
      const double ly = y + i * (kLaneH + kLaneGap);
      const int q = lanes.t->NodeOf(i);
      const std::string node =
          q < static_cast<int>(pi.nodes.size()) ? std::to_string(pi.nodes[q]) : "?";
      const auto& st = lanes.t->stages[i];
      const std::string label = "pipeline " + std::to_string(j) + " stage " + std::to_string(i) +
                                " (node " + node + ", layers " + std::to_string(st.first) + "-" +
                                std::to_string(st.last) + ")";
      o << "<text class=\"lane\" x=\"" << Num(kLabelW - 6) << "\" y=\"" << Num(ly + kLaneH - 5)
        << "\" text-anchor=\"end\">" << io::XmlEscape(label) << "</text>"
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
      << io::XmlEscape(Num(lanes.makespan * 1e3, 2) + " ms") << "</text>\n";
    y = bottom + kLaneGap + kPipeGap;
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace ob::plan
