#include "ob/plan/schedule.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>
#include <tuple>
#include <utility>

#include "ob/io/text.h"
#include "ob/plan/templates_impl.h"
#include "ob/schedule/program.h"
#include "ob/schedule/timing.h"

namespace ob::plan {
namespace {

std::string Num(double v, int decimals = 1) { return io::Fixed(v, decimals); }

const char* OpColour(schedule::Op::Type t) {
  switch (t) {
    case schedule::Op::kForward: return "#4c78a8";
    case schedule::Op::kWeightGrad: return "#54a24b";
    default: return "#f58518";
  }
}

const char* OpName(schedule::Op::Type t) {
  switch (t) {
    case schedule::Op::kForward: return "forward";
    case schedule::Op::kInputGrad: return "input gradient (B)";
    case schedule::Op::kWeightGrad: return "weight gradient (W)";
    default: return "backward";
  }
}

// Forward, input-gradient and weight-gradient seconds of one micro-batch
// through a stage: the compute split by the layers' own forward/backward
// ratio, the tensor-parallel all-reduces (what StageComputeSeconds adds
// beyond compute / tp) half each way, what its recomputation mode computes
// again in the backward, and the layers' weight gradients apart (they need
// no all-reduce: each rank's shard is its own).
schedule::StageCosts StageOps(const Problem& p, const StageShape& st) {
  double fwd = 0, bwd = 0, weight = 0;
  for (int l = st.first; l <= st.last; ++l) {
    fwd += p.layers[l].forward, bwd += p.layers[l].backward;
    weight += p.layers[l].weight_grad;
  }
  const int tp = std::max(1, st.tp);
  const double plain = StageComputeSeconds(p, st.first, st.last, tp);
  const double extra = plain - (fwd + bwd) / tp;
  const double again = StageComputeSeconds(p, st.first, st.last, tp, st.recompute) - plain;
  schedule::StageCosts c;
  c.forward = fwd / tp + extra / 2;
  c.weight_grad = weight / tp;
  c.input_grad = (bwd - weight) / tp + extra / 2 + again;
  return c;
}

// The saving of `s` on 1F1B at 1 and m micro-batches for these costs.
std::pair<double, double> Savings(const schedule::Schedule& s, const std::vector<schedule::StageCosts>& c, int m,
                                  double base_one, double base_m) {
  const double one = base_one - schedule::Makespan(s, c, 1);
  const double at = base_m - schedule::Makespan(s, c, m);
  return {one, at};
}

}  // namespace

std::vector<schedule::StageCosts> StageCostsOf(const Problem& p, const Template& t, const std::vector<int>& nodes,
                                               const BandwidthMatrix* bw) {
  const std::vector<StageShape>& vs = t.Virtual();
  const int V = static_cast<int>(vs.size());
  const schedule::Chain chain = t.chain();  // one chunk: virtual stage k is stage k
  std::vector<schedule::StageCosts> c(static_cast<size_t>(V));
  for (int k = 0; k < V; ++k) {
    c[k] = StageOps(p, vs[k]);
    if (k + 1 == V) continue;
    const int i = chain.StageOf(k), next = chain.StageOf(k + 1);
    if (i == next) continue;  // the next chunk is on this stage: no transfer
    const int a = t.NodeOf(i), b = t.NodeOf(next);
    if (a == b) {  // the next stage is on the same node
      c[k].send = c[k].send_back = StageBoundarySeconds(p, vs[k].last, false) / 2;
    } else if (bw && a < static_cast<int>(nodes.size()) && b < static_cast<int>(nodes.size())) {
      const int na = nodes[a], nb = nodes[b];
      c[k].send = BoundarySeconds(p, vs[k].last, bw->Bandwidth(na, nb), bw->Latency(na, nb)) / 2;
      c[k].send_back = BoundarySeconds(p, vs[k].last, bw->Bandwidth(nb, na), bw->Latency(nb, na)) / 2;
    } else {
      c[k].send = c[k].send_back = StageBoundarySeconds(p, vs[k].last, true) / 2;
    }
  }
  return c;
}

std::vector<ScheduledOp> SimulatePipeline(const Problem& p, const Template& t, int microbatches,
                                          const std::vector<int>& nodes, const BandwidthMatrix* bw) {
  if (t.stages.empty() || microbatches <= 0) return {};
  std::vector<ScheduledOp> out;
  // The order the workers run (made for the template's nominal costs),
  // timed on these nodes' links.
  const auto orders = schedule::Orders(*t.schedule, t.OrderCosts(), microbatches, t.chunks);
  for (const schedule::TimedOp& o :
       schedule::Simulate(*orders, StageCostsOf(p, t, nodes, bw), microbatches, t.schedule->placement)) {
    ScheduledOp op;
    op.stage = o.stage;
    op.chunk = o.op.chunk;
    op.microbatch = o.op.microbatch;
    op.type = o.op.type;
    op.forward = o.op.type == schedule::Op::kForward;
    op.start = o.start;
    op.end = o.end;
    out.push_back(op);
  }
  return out;
}

void ChooseSchedule(const Problem& p, Template* t, double m_expected) {
  const int S = static_cast<int>(t->stages.size());
  t->schedule = &schedule::OneFOneB();
  t->saved_one = t->saved = 0;
  t->saved_at = 1;
  if (S == 0) return;
  if (p.schedules.size() == 1 && p.schedules.front() == &schedule::OneFOneB()) return;
  // The share it is expected to run, at most 2S (the steady state by then
  // for every schedule here), rounded down to a power of two below that:
  // every template of S stages is then timed at one of a few shapes whose
  // orders are made once (the saving at fewer micro-batches is no larger:
  // an underestimate); memory at the most a share may hold.
  int m = 2 * S;
  if (!std::isinf(m_expected) && m_expected < 2 * S) {
    m = 1;
    while (2 * m <= m_expected) m *= 2;
  }
  const int m_memory = p.microbatches > 0 ? std::clamp(p.microbatches, 1, 2 * S) : 2 * S;
  const auto costs = StageCostsOf(p, *t, {}, nullptr);
  t->op_costs = costs;
  const double base_one = schedule::Makespan(schedule::OneFOneB(), costs, 1);
  const double base_m = schedule::Makespan(schedule::OneFOneB(), costs, m);
  const Template cut = *t;  // as cut for 1F1B: what chunked schedules cut again
  const std::vector<uint64_t> one_f_one_b_memory = t->stage_memory;
  const std::vector<schedule::Held> one_f_one_b_held = t->stage_held;
  bool have = false;
  double best_time = 0;
  for (const schedule::Schedule* s : p.schedules) {
    if (s->chunked()) continue;  // below
    std::vector<uint64_t> memory = one_f_one_b_memory;
    std::vector<schedule::Held> held = one_f_one_b_held;
    double one = 0, at = 0;
    if (s != &schedule::OneFOneB()) {
      bool fits = true;
      const auto peaks = schedule::PipelinePeaks(*s, costs, m_memory);
      for (int i = 0; i < S && fits; ++i) {
        const StageShape& st = t->stages[i];
        uint64_t most = 0;
        schedule::Held worst;
        for (const schedule::Held& h : peaks[i]) {
          const uint64_t b = StageMemoryBytes(p, st.first, st.last, st.tp, h, st.recompute);
          if (b >= most) most = b, worst = h;
        }
        memory[i] = most, held[i] = worst;
        fits = most <= p.cluster.gpu_memory;
      }
      if (!fits) continue;
      std::tie(one, at) = Savings(*s, costs, m, base_one, base_m);
      // Seconds must not fall as m grows: the saving grows by at most a
      // bottleneck a micro-batch.
      if (m > 1) at = std::min(at, one + t->bottleneck * (m - 1));
    }
    const double time = t->total + (m - 1) * t->bottleneck - at;
    if (have && !(time < best_time)) continue;
    have = true;
    best_time = time;
    t->schedule = s;
    t->saved_one = one;
    t->saved = m > 1 ? at : one;
    t->saved_at = m;
    t->stage_memory = std::move(memory);
    t->stage_held = std::move(held);
  }
  // Chunked schedules: the template cut again into S·v slices, each v the
  // schedule allows, timed by its own Σw and max w less its saving.
  for (const schedule::Schedule* s : p.schedules) {
    if (!s->chunked()) continue;
    for (int v = s->min_chunks; v <= s->max_chunks && S * v <= p.num_layers(); ++v) {
      std::optional<Template> c = detail::ChunkedTemplate(p, cut, *s, v, m, m_memory);
      if (!c) continue;
      // With the all-reduce it hides (the single-chunk schedules share one
      // tail, which their comparison above leaves out).
      const double time =
          c->total + (m - 1) * c->bottleneck - c->saved + StepTailSeconds(p, *c) - StepTailSeconds(p, cut);
      if (have && !(time < best_time)) continue;
      have = true;
      best_time = time;
      *t = std::move(*c);
    }
  }
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
  // One stage of one pipeline running its program (schedule::StageProgram).
  struct Lane {
    int pipe = 0, stage = 0, procs = 1;
    std::vector<schedule::StageInstr> program;
    size_t pc = 0;
    double left = -1;        // a compute's work left, in seconds alone; < 0: none running
    double start = 0;        // when the current instruction started (a compute) or was posted
    bool posted = false;     // the current batch of messages is posted
    std::vector<double> done;  // per message of the posted batch: when it completes; kInf: unmatched
  };
  struct Pipe {
    const Template* t = nullptr;
    std::vector<schedule::StageCosts> c;
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
      q.c = StageCostsOf(p, *q.t, pi.nodes, nullptr);
      for (int i = 0; i < S; ++i) {
        Lane l;
        l.pipe = static_cast<int>(j);
        l.stage = i;
        l.procs = std::max(1, q.t->stages[i].tp);
        l.program = schedule::StageProgram(*q.t->schedule, q.t->OrderCosts(), i, pi.microbatches, q.t->chunks);
        lanes.push_back(std::move(l));
      }
    }
    pipes.push_back(std::move(q));
  }
  // A send is posted with its batch and the sender goes on at once (the
  // workers wait for their sends only at the step's end); a receive's
  // message arrives its transfer time after both it and the send are
  // posted; a batch completes with its last receive. Computes share the
  // cores: between two events, the k processes computing each run at
  // 1 / slowdown(k) of their speed alone.
  std::map<std::tuple<int, int, bool, int>, double> sent;  // (pipeline, link, activation, micro-batch) → posted
  auto post = [&](Lane& l) {
    const auto& batch = l.program[l.pc].comm;
    for (size_t m = 0; m < batch.size(); ++m) {
      if (!batch[m].send) continue;
      sent[{l.pipe, batch[m].link, batch[m].activation, batch[m].microbatch}] = l.start;
      l.done[m] = l.start;
    }
  };
  auto match = [&](Lane& l) {
    const Pipe& q = pipes[l.pipe];
    const auto& batch = l.program[l.pc].comm;
    for (size_t m = 0; m < batch.size(); ++m) {
      if (l.done[m] < kInf) continue;
      const schedule::P2p& msg = batch[m];
      auto it = sent.find({l.pipe, msg.link, msg.activation, msg.microbatch});
      if (it == sent.end()) continue;
      const double transfer = msg.activation ? q.c[msg.link].send : q.c[msg.link].send_back;
      l.done[m] = std::max(l.start, it->second) + transfer;
      sent.erase(it);
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
        const schedule::StageInstr& in = l.program[l.pc];
        if (in.kind != schedule::StageInstr::kComm) {
          const int k = pipes[l.pipe].t->chain().At(l.stage, in.op.chunk);  // its slice
          l.left = pipes[l.pipe].c[k].Seconds(in.op.type) / measured_at;
          l.start = now;
          continue;
        }
        if (!l.posted) {
          l.posted = true;
          l.start = now;
          l.done.assign(in.comm.size(), kInf);
          post(l);
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
    if (lanes.t) lanes.ops = SimulatePipeline(p, *lanes.t, pi.microbatches, pi.nodes, bw);
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
  std::string names;  // the schedules the pipelines run, in order of appearance
  for (const auto& lanes : pipes) {
    if (!lanes.t) continue;
    const std::string n(lanes.t->schedule->name);
    if (names.find(n) == std::string::npos) names += (names.empty() ? "" : ", ") + n;
  }
  const std::string title = (names.empty() ? std::string("1f1b") : names) + " schedule: " + std::to_string(inst.pipelines.size()) +
                            " pipeline(s), " + std::to_string(microbatches) +
                            " micro-batches, iteration " + Num(ms, 2) + " ms (compute and " +
                            "transfers; all-reduce not shown)";
  o << "<text x=\"10\" y=\"22\" font-size=\"15\" font-weight=\"bold\">" << io::XmlEscape(title)
    << "</text>\n";
  // Legend.
  o << "<rect x=\"10\" y=\"32\" width=\"12\" height=\"12\" fill=\"#4c78a8\"/>"
    << "<text x=\"26\" y=\"42\">forward</text>"
    << "<rect x=\"86\" y=\"32\" width=\"12\" height=\"12\" fill=\"#f58518\"/>"
    << "<text x=\"102\" y=\"42\">backward (B)</text>"
    << "<rect x=\"186\" y=\"32\" width=\"12\" height=\"12\" fill=\"#54a24b\"/>"
    << "<text x=\"202\" y=\"42\">weight gradients (W)</text>"
    << "<text x=\"330\" y=\"42\" fill=\"#666\">gaps are idle time; red line: pipeline makespan</text>\n";
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
      std::string layers;
      for (const auto& [first, last] : lanes.t->LayersOf(i))
        layers += (layers.empty() ? "" : ",") + std::to_string(first) + "-" + std::to_string(last);
      const std::string label = "pipeline " + std::to_string(j) + " stage " + std::to_string(i) +
                                " (node " + node + ", layers " + layers + ")";
      o << "<text class=\"lane\" x=\"" << Num(kLabelW - 6) << "\" y=\"" << Num(ly + kLaneH - 5)
        << "\" text-anchor=\"end\">" << io::XmlEscape(label) << "</text>"
        << "<rect x=\"" << Num(kLabelW) << "\" y=\"" << Num(ly) << "\" width=\"" << Num(kPlotW)
        << "\" height=\"" << Num(kLaneH) << "\" fill=\"#f7f7f7\"/>\n";
    }
    for (const auto& op : lanes.ops) {
      const double ly = y + op.stage * (kLaneH + kLaneGap);
      const double x0 = x(op.start), w = std::max(0.5, x(op.end) - x0);
      o << "<rect x=\"" << Num(x0, 2) << "\" y=\"" << Num(ly) << "\" width=\"" << Num(w, 2)
        << "\" height=\"" << Num(kLaneH) << "\" fill=\"" << OpColour(op.type)
        << "\" stroke=\"white\" stroke-width=\"0.5\"><title>"
        << OpName(op.type) << " micro-batch " << op.microbatch
        << (lanes.t->chunks > 1 ? " chunk " + std::to_string(op.chunk) : std::string()) << ", "
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
