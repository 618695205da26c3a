// ob-plan: turn a profile and a cluster into a fault-tolerant pipeline plan.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>

#include "ob/cli/cli.h"
#include "ob/cluster/hosts.h"
#include "ob/io/file.h"
#include "ob/io/message.h"
#include "ob/io/records.h"
#include "ob/log.h"
#include "ob/plan/explain.h"
#include "ob/plan/fault_sweep.h"
#include "ob/plan/reliability.h"
#include "ob/plan/instantiation.h"
#include "ob/plan/placement.h"
#include "ob/plan/plan_io.h"
#include "ob/plan/schedule.h"
#include "ob/schedule/schedule.h"
#include "ob/plan/templates.h"
#include "failure_flags.h"
#include "plan_checks.h"

namespace {

struct Options {
  std::string input;
  std::string faults = "1";    // a count, or "auto" (from the failure model below)
  ob::plan_tool::FailureFlags failure;  // -f auto's model
  int nodes = 0;
  std::string hosts;
  int gpus_per_node = 0;       // 0: from the profile
  int tp = 0;                  // 0: chosen
  bool mixed_stages = false;   // templates may mix stage degrees
  bool always_mixed = false;   // ... and the plan keeps them even when one degree is predicted faster
  std::string recompute = "auto";  // none, selective, full, auto (each stage the fastest that fits)
  std::string schedule = "auto";   // a schedule's name, or auto (each template the fastest that fits)
  // --shard-optimizer: auto, on, off or a count. off by default until
  // ob-launch runs sharded plans (issue 69); then auto.
  std::string shard = "off";
  std::vector<std::string> template_tp;  // "NODES=T"
  std::string pipelines;       // "2,3": the instantiation, fixed; "" = chosen
  bool local = false;          // the nodes are processes of this machine
  double gpu_memory_gib = 0;   // 0: from the profile
  double host_memory_gib = 0;  // 0: not checked
  int global_batch = 256;
  int microbatch = 0;          // 0: the profile's first size
  std::string bandwidth;
  uint64_t seed = 1;
  double time_limit = 5.0;
  long moves = 20000;
  bool explain = false;
  std::string measured;        // --measured: a run's metrics, beside --explain's predictions
  std::string schedule_svg;
  double link_gbps = 12.5;
  double link_latency_us = 10;
  double intra_gbps = 0;       // 0: from the profile, else 200
  double overhead_gib = -1;    // -1: 1 GiB on GPUs, 0 on CPU
  double overhead_fraction = 0.05;
};

Options g;
// Every option that shapes a plan (all but the input, --explain and
// --measured): given with a plan as the input, which ob-plan only prints,
// each would be ignored.
std::vector<CLI::Option*> g_planning;

// --measured FILE: every record of a run's metrics (ob-launch --metrics).
ob::Result<std::vector<ob::pb::Metrics>> ReadMetrics(const std::string& path) {
  OB_ASSIGN_OR_RETURN(std::string bytes, ob::io::ReadFile(path));
  auto reader = ob::io::RecordReader::FromString(std::move(bytes), ob::io::DisplayName(path));
  std::vector<ob::pb::Metrics> records;
  for (;;) {
    ob::pb::Metrics m;
    OB_ASSIGN_OR_RETURN(bool got, reader.Next(&m));
    if (!got) break;
    records.push_back(std::move(m));
  }
  return records;
}

ob::Status Emit(const ob::cli::CommonOptions& common, const ob::pb::Plan& plan,
                const std::string& fault_table = "") {
  if (g.explain) {
    std::string text = fault_table + ob::plan::ExplainPlan(plan);
    if (!g.measured.empty()) {
      OB_ASSIGN_OR_RETURN(std::vector<ob::pb::Metrics> records, ReadMetrics(g.measured));
      OB_ASSIGN_OR_RETURN(std::string measured,
                          ob::plan::CompareMeasured(plan, records, ob::io::DisplayName(g.measured)));
      text += measured;
    }
    // Tables go to stdout; the plan itself only where -o sends it.
    if (common.output != "-") {
      OB_RETURN_IF_ERROR(ob::io::WriteMessage(common.output, plan, ob::io::kPlanFormatVersion,
                                              common.json));
    }
    return ob::io::WriteFile("-", text);
  }
  return ob::io::WriteMessage(common.output, plan, ob::io::kPlanFormatVersion, common.json);
}

std::optional<int> g_shards;  // --shard-optimizer's S, once chosen (BuildProblem)
int g_host_slots = 0;  // the hosts file's slots= (GPUs per node), when all agree

// Host names: --hosts FILE, else Slurm's allocation, else --nodes N anonymous.
ob::Result<std::vector<std::string>> ClusterHosts() {
  std::vector<ob::cluster::Host> hosts;
  if (!g.hosts.empty()) {
    OB_ASSIGN_OR_RETURN(hosts, ob::cluster::LoadHosts(g.hosts));
  } else if (g.nodes == 0 && std::getenv("SLURM_JOB_NODELIST")) {
    OB_ASSIGN_OR_RETURN(hosts, ob::cluster::HostsFromSlurm(std::getenv("SLURM_JOB_NODELIST")));
  }
  std::vector<std::string> names;
  for (const auto& h : hosts) {
    names.push_back(h.name);
    if (h.slots != hosts[0].slots)
      return ob::Status::Config(g.hosts + ":" + std::to_string(h.line) + ": host '" + h.name +
                                "' has slots=" + std::to_string(h.slots) + ", the first host " +
                                std::to_string(hosts[0].slots) + "; ob-plan plans identical nodes");
  }
  if (!hosts.empty()) g_host_slots = hosts[0].slots;
  if (!names.empty() && g.nodes > 0 && g.nodes != static_cast<int>(names.size()))
    return ob::Status::Usage("--nodes " + std::to_string(g.nodes) + " disagrees with the " +
                             std::to_string(names.size()) + " hosts of " + g.hosts);
  return names;
}

// The matrix in cluster order: rows and columns follow `hosts` by name.
ob::Result<ob::pb::NetworkMatrix> LoadMatrix(const std::vector<std::string>& hosts) {
  ob::pb::Profile net;
  OB_RETURN_IF_ERROR(ob::io::LoadMessage(g.bandwidth, ob::io::kProfileFormatVersion, &net));
  if (net.mode() != ob::pb::PROFILE_NETWORK || net.network().hosts_size() == 0)
    return ob::Status::DataErr(g.bandwidth + ": not a bandwidth matrix (make one with ob-profile --net)");
  ob::pb::NetworkMatrix m = net.network();
  if (hosts.empty()) return m;
  if (m.hosts_size() != static_cast<int>(hosts.size()))
    return ob::Status::DataErr(g.bandwidth + ": bandwidth matrix has " +
                               std::to_string(m.hosts_size()) + " hosts, the cluster " +
                               std::to_string(hosts.size()));
  std::vector<int> index_of(m.hosts_size(), -1);  // matrix index -> cluster index
  for (int i = 0; i < m.hosts_size(); ++i) {
    for (size_t j = 0; j < hosts.size(); ++j)
      if (hosts[j] == m.hosts(i)) index_of[i] = static_cast<int>(j);
    if (index_of[i] < 0)
      return ob::Status::DataErr(g.bandwidth + ": host '" + m.hosts(i) + "' is not in " + g.hosts);
  }
  ob::pb::NetworkMatrix out = m;
  for (size_t j = 0; j < hosts.size(); ++j) out.set_hosts(static_cast<int>(j), hosts[j]);
  for (auto& l : *out.mutable_links()) {
    l.set_src(index_of[l.src()]);
    l.set_dst(index_of[l.dst()]);
  }
  return out;
}

ob::Result<int> ParseFaults() {
  try {
    size_t used = 0;
    const int f = std::stoi(g.faults, &used);
    if (used == g.faults.size() && f >= 0) return f;
  } catch (const std::exception&) {
  }
  return ob::Status::Usage("-f " + g.faults + ": expected a number of node failures (0 or more) or 'auto'");
}

// --pipelines N1,N2,...: node counts, each at least 1 (ParseIntList, which
// also takes a trailing comma; this does not).
ob::Result<std::vector<int>> ParsePipelines() {
  auto sizes = ob::cli::ParseIntList(g.pipelines, "--pipelines");
  if (!sizes.ok() || g.pipelines.back() == ',')
    return ob::Status::Usage("--pipelines " + g.pipelines + ": expected node counts like 2,3");
  return sizes;
}

ob::Result<ob::plan::FailureModel> FailureModelFromOptions() { return ob::plan_tool::FailureModelOf(g.failure); }

// `made` (if given): the templates and instantiation made while choosing
// the tensor-parallel degree (tp 0: none made); `sweep` (if given) makes
// them, for one cluster planned for several f.
ob::Result<ob::plan::Problem> BuildProblem(const ob::pb::Profile& profile, const ob::plan::Cluster& c, int faults,
                                           int mb, ob::plan::TensorParallelPlan* made = nullptr,
                                           ob::plan::FaultSweep* sweep = nullptr);

ob::Status MakePlan(const ob::cli::CommonOptions& common, const ob::pb::Profile& profile) {
  OB_ASSIGN_OR_RETURN(auto hosts, ClusterHosts());
  ob::pb::NetworkMatrix matrix;
  bool have_matrix = !g.bandwidth.empty();
  if (have_matrix) {
    OB_ASSIGN_OR_RETURN(matrix, LoadMatrix(hosts));
    if (hosts.empty() && g.nodes > 0 && matrix.hosts_size() != g.nodes)
      return ob::Status::DataErr(g.bandwidth + ": bandwidth matrix has " +
                                 std::to_string(matrix.hosts_size()) + " hosts, the cluster " +
                                 std::to_string(g.nodes));
    if (hosts.empty()) hosts.assign(matrix.hosts().begin(), matrix.hosts().end());
  }
  const int nodes = !hosts.empty() ? static_cast<int>(hosts.size()) : g.nodes;
  if (nodes <= 0) return ob::Status::Usage("give the cluster: --nodes N, --hosts FILE or --bandwidth FILE");

  const auto& dev = profile.device();
  const bool gpu = dev.kind() != "cpu";
  ob::plan::Cluster c;
  c.nodes = nodes;
  c.gpus_per_node = g.gpus_per_node > 0 ? g.gpus_per_node
                    : g_host_slots > 1 ? g_host_slots
                    : (dev.devices_per_node() > 0 ? static_cast<int>(dev.devices_per_node()) : 1);
  c.gpu_memory = g.gpu_memory_gib > 0 ? static_cast<uint64_t>(g.gpu_memory_gib * (1ull << 30)) : dev.memory_bytes();
  c.link_bytes_per_s = g.link_gbps * 1e9;
  c.link_latency = g.link_latency_us * 1e-6;
  c.intra_bytes_per_s = (g.intra_gbps > 0 ? g.intra_gbps : (dev.allreduce_gbps() > 0 ? dev.allreduce_gbps() : 200)) * 1e9;
  // Unset, a GPU keeps 1 GiB for its context and buffers; a CPU worker
  // holds what the profile measured a process holds before its layers.
  c.overhead_bytes = g.overhead_gib >= 0 ? static_cast<uint64_t>(g.overhead_gib * (1ull << 30))
                     : gpu                ? uint64_t{1} << 30
                                          : dev.process_bytes();
  c.local = g.local;
  if (g.local) {
    const uint32_t workers = static_cast<uint32_t>(nodes * c.gpus_per_node);
    const uint32_t measured = std::max<uint32_t>(1, dev.concurrency());
    if (profile.mode() != ob::pb::PROFILE_MEASURED)
      return ob::Status::Usage("--local prices the run by a measured profile; " + ob::io::DisplayName(g.input) +
                               " is not one (ob-profile --model M --concurrency N)");
    if (measured != workers) {
      OB_LOG(Warn) << ob::io::DisplayName(g.input) << ": measured with " << measured
                   << " process(es) sharing the cores, this plan runs " << workers
                   << " worker(s) here (ob-profile --concurrency " << workers << ")";
    }
  }
  c.overhead_fraction = g.overhead_fraction;
  ob::plan::BandwidthMatrix bw;
  if (have_matrix) {
    OB_ASSIGN_OR_RETURN(bw, ob::plan::MatrixFromProfile(matrix, nodes));
    c.link_bytes_per_s = bw.MedianBandwidth();
    c.link_latency = bw.MedianLatency();
  }
  const int mb = g.microbatch > 0 ? g.microbatch
                                  : (profile.microbatch_sizes_size() ? static_cast<int>(profile.microbatch_sizes(0)) : 1);
  int faults = 0;
  std::string fault_table;  // -f auto's, for --explain
  // -f auto plans every f it weighs on this cluster: the chosen f's plan is
  // kept rather than made again.
  struct Planned {
    ob::plan::Problem problem;
    ob::plan::TemplateSet templates;
    ob::plan::Instantiation inst;
  };
  std::map<int, Planned> planned;  // by f
  if (g.faults == "auto") {
    OB_ASSIGN_OR_RETURN(auto model, FailureModelFromOptions());
    std::map<int, ob::plan::FaultSweep> sweeps;  // by node count
    auto iteration = [&](int f, int n) -> ob::Result<double> {
      ob::plan::Cluster cn = c;
      cn.nodes = n;
      ob::plan::TensorParallelPlan made;
      ob::plan::FaultSweep* sweep = &sweeps[n];
      OB_ASSIGN_OR_RETURN(auto pr, BuildProblem(profile, cn, f, mb, &made, sweep));
      if (made.tp == 0) {
        OB_ASSIGN_OR_RETURN(made.templates, sweep->Templates(pr));
        OB_ASSIGN_OR_RETURN(made.inst, sweep->Instantiate(pr, made.templates));
      }
      const double seconds = made.inst.iteration_seconds;
      if (n == nodes) planned[f] = {std::move(pr), std::move(made.templates), std::move(made.inst)};
      return seconds;
    };
    const double tokens = static_cast<double>(g.global_batch) * std::max<int64_t>(1, profile.sequence_length());
    auto chosen = ob::plan::ChooseFaults(nodes, tokens, model, iteration);
    if (!chosen.ok()) {  // a bad flag is the flag's, not the profile's
      return chosen.status().code() == ob::Code::kUsage ? chosen.status()
                                                          : chosen.status().WithContext(ob::io::DisplayName(g.input));
    }
    faults = chosen->f;
    fault_table = ob::plan::ExplainFaultChoice(*chosen, model, nodes);
    OB_LOG(Info) << "-f auto: f = " << faults << " (expected goodput "
                 << static_cast<long long>(chosen->options[static_cast<size_t>(faults)].goodput) << " tokens/s)";
  } else {
    OB_ASSIGN_OR_RETURN(faults, ParseFaults());
  }
  auto instantiate = [&](const ob::plan::Problem& q, const ob::plan::TemplateSet& ts) -> ob::Result<ob::plan::Instantiation> {
    if (g.pipelines.empty()) return ob::plan::Instantiate(q, ts);
    OB_ASSIGN_OR_RETURN(std::vector<int> sizes, ParsePipelines());
    return ob::plan::InstantiateGiven(q, ts, sizes);
  };
  ob::plan::Problem problem;
  ob::plan::TemplateSet templates;
  auto kept = planned.find(faults);
  if (kept == planned.end()) {  // planned now, with what choosing its degree made
    ob::plan::TensorParallelPlan made;
    OB_ASSIGN_OR_RETURN(problem, BuildProblem(profile, c, faults, mb, &made));
    if (made.tp > 0) kept = planned.emplace(faults, Planned{problem, std::move(made.templates), std::move(made.inst)}).first;
  }
  if (kept != planned.end()) {
    problem = std::move(kept->second.problem);
    templates = std::move(kept->second.templates);
  } else {
    OB_ASSIGN_OR_RETURN(templates, ob::plan::BuildTemplates(problem));
  }
  if (g.host_memory_gib > 0) OB_RETURN_IF_ERROR(ob::plan_tool::CheckHostMemory(profile, templates, g.host_memory_gib));
  ob::plan::Instantiation inst;
  if (kept != planned.end() && g.pipelines.empty()) {  // the instantiation made while choosing f or tp
    inst = std::move(kept->second.inst);
  } else {
    OB_ASSIGN_OR_RETURN(inst, instantiate(problem, templates));
  }
  planned.clear();
  const bool mixed = std::any_of(templates.templates.begin(), templates.templates.end(),
                                 [](const ob::plan::Template& t) { return t.mixed(); });
  if (mixed && !g.always_mixed) {
    // Templates are chosen by the closed form; the instantiation's
    // iteration is the plan's best prediction (on --local with a contention
    // curve, the shared-cores replay, which can disagree). Mixing stays
    // only where that prediction is faster than the one-degree plan's.
    ob::plan::Problem one = problem;
    one.mixed_stages = false;
    ob::Result<ob::plan::TensorParallelPlan> made = ob::plan::ChooseTensorParallelPlan(one);
    if (made.ok()) one.tp = made->tp;
    ob::Result<ob::plan::TemplateSet> ts =
        made.ok() ? ob::Result<ob::plan::TemplateSet>(std::move(made->templates)) : ob::plan::BuildTemplates(one);
    if (ts.ok() && (g.host_memory_gib <= 0 || ob::plan_tool::CheckHostMemory(profile, *ts, g.host_memory_gib).ok())) {
      ob::Result<ob::plan::Instantiation> in =
          made.ok() && g.pipelines.empty() ? ob::Result<ob::plan::Instantiation>(std::move(made->inst)) : instantiate(one, *ts);
      if (in.ok()) {
        const bool keep_one = in->iteration_seconds <= inst.iteration_seconds;
        if (!common.quiet) {
          std::fprintf(stderr, "ob-plan: --mixed-stages: predicted iteration %.4f s with mixed templates, %.4f s with one degree: %s\n",
                       inst.iteration_seconds, in->iteration_seconds, keep_one ? "one degree kept" : "mixed");
        }
        if (keep_one) {
          problem = std::move(one);
          templates = std::move(ts).value();
          inst = std::move(in).value();
        }
      }
    }
  }
  const auto& p = problem;
  ob::plan::PlanMeta meta;
  meta.hosts = hosts;
  meta.global_batch = g.global_batch;
  meta.seed = g.seed;
  meta.profile = &profile;
  if (have_matrix) {
    meta.bandwidth = &matrix;
    meta.identity_seconds = ob::plan::PlacedIterationSeconds(p, templates, inst, bw);
    ob::plan::PlacementOptions po;
    po.seed = g.seed;
    po.moves = g.moves;
    po.time_limit_s = g.time_limit;
    inst = ob::plan::Place(p, templates, inst, bw, po);
    meta.placed_seconds = ob::plan::PlacedIterationSeconds(p, templates, inst, bw);
  }
  if (!g.schedule_svg.empty()) {
    OB_RETURN_IF_ERROR(ob::io::WriteFile(
        g.schedule_svg, ob::plan::ScheduleSvg(p, templates, inst, have_matrix ? &bw : nullptr)));
  }
  return Emit(common, ob::plan::ToProto(p, templates, inst, meta), fault_table);
}

// The problem for `faults` failures on cluster `c`, with the tensor-parallel
// degrees asked (--tp, --template-tp) or chosen.
ob::Result<ob::plan::Problem> BuildProblem(const ob::pb::Profile& profile, const ob::plan::Cluster& c, int faults,
                                           int mb, ob::plan::TensorParallelPlan* made, ob::plan::FaultSweep* sweep) {
  auto problem = ob::plan::MakeProblem(profile, c, faults, g.global_batch, mb);
  if (!problem.ok()) return problem.status().WithContext(ob::io::DisplayName(g.input));
  if (g.recompute == "auto") {
    // Every mode where the profile prices them; none alone where it does not.
    if (problem->has_recompute_costs) problem->recompute_modes.assign(std::begin(ob::model::kRecomputeModes),
                                                                      std::end(ob::model::kRecomputeModes));
  } else {
    OB_ASSIGN_OR_RETURN(ob::model::Recompute mode, ob::model::ParseRecompute(g.recompute));
    if (mode != ob::model::Recompute::kNone && !problem->has_recompute_costs) {
      return ob::Status::DataErr(ob::io::DisplayName(g.input) + ": the profile has no recomputation costs "
                                 "(made before them): --recompute " + g.recompute + " needs a profile made again");
    }
    problem->recompute_modes = {mode};
  }
  if (g.schedule == "auto") {
    // 1F1B first: it wins ties. Not the chunked ones, planned when named:
    // the model priced interleaved at m = 8 7 points faster than it ran
    // (bench/schedules.sh, docs/benchmarks.md), and auto must not pick a
    // schedule for a saving it does not make.
    problem->schedules.clear();
    for (const ob::schedule::Schedule* s : ob::schedule::All())
      if (!s->chunked()) problem->schedules.push_back(s);
  } else {
    const ob::schedule::Schedule* s = ob::schedule::Find(g.schedule);
    if (s == nullptr) return ob::Status::Usage("--schedule " + g.schedule + ": not one of auto, " + ob::schedule::Names());
    problem->schedules = {s};
  }
  // S depends on neither f nor the node count (plan_checks.h): -f auto's
  // problems, one for each f and cluster it weighs, choose it once.
  if (!g_shards) {
    OB_ASSIGN_OR_RETURN(const int shards, ob::plan_tool::ChooseShards(*problem, g.shard));
    g_shards = shards;
  }
  problem->shards = *g_shards;
  if (g.tp > 0) {
    if (c.gpus_per_node % g.tp != 0) {
      return ob::Status::Usage("--tp " + std::to_string(g.tp) + " does not divide the " +
                               std::to_string(c.gpus_per_node) + " GPUs of a node");
    }
    problem->tp = g.tp;
    if (ob::plan::TensorParallelChoices(*problem).empty()) {
      return ob::Status::Usage("--tp " + std::to_string(g.tp) + " does not divide " + problem->SplitText());
    }
  }
  for (const std::string& spec : g.template_tp) {
    const size_t eq = spec.find('=');
    int nodes = 0, tp = 0;
    try {
      size_t used = 0;
      if (eq != std::string::npos) nodes = std::stoi(spec.substr(0, eq), &used);
      if (eq == std::string::npos || used != eq) throw std::invalid_argument(spec);
      tp = std::stoi(spec.substr(eq + 1), &used);
      if (used != spec.size() - eq - 1) throw std::invalid_argument(spec);
    } catch (const std::exception&) {
      return ob::Status::Usage("--template-tp " + spec + ": not NODES=T");
    }
    if (nodes < 1 || tp < 1 || c.gpus_per_node % tp != 0 || !problem->TpDivides(tp)) {
      return ob::Status::Usage("--template-tp " + spec + ": " + std::to_string(tp) + " does not divide the " +
                               std::to_string(c.gpus_per_node) + " GPUs of a node, or " + problem->SplitText());
    }
    problem->tp_at[nodes] = tp;
  }
  if (g.mixed_stages || g.always_mixed) {
    if (g.tp > 0) return ob::Status::Usage("--mixed-stages chooses each stage's degree; it does not go with --tp");
    problem->mixed_stages = true;
  } else if (g.tp == 0) {
    // One degree for the other templates; when none
    // instantiates alone, BuildTemplates below says why, as it always did.
    ob::Result<ob::plan::TensorParallelPlan> tp = ob::plan::ChooseTensorParallelPlan(*problem, sweep);
    if (tp.ok()) {
      problem->tp = tp->tp;
      if (made != nullptr) *made = std::move(tp).value();
    }
  }
  return problem;
}

ob::Status Run(const ob::cli::CommonOptions& common) {
  OB_ASSIGN_OR_RETURN(std::string path, ob::cli::InputPath(g.input, "profile"));
  g.input = path;
  if (!g.measured.empty() && !g.explain) return ob::Status::Usage("--measured goes with --explain");
  if (!common.json && !g.explain && common.output == "-" && ob::io::StdoutIsTerminal())
    return ob::Status::Usage("refusing to write a binary Plan to a terminal; use -o FILE, a pipe, --json or --explain");
  OB_ASSIGN_OR_RETURN(std::string bytes, ob::io::ReadFile(path));
  const std::string name = ob::io::DisplayName(path);
  ob::pb::Plan plan;
  ob::Status as_plan = ob::io::ParseMessage(bytes, name, ob::io::kPlanFormatVersion, &plan);
  if (as_plan.ok()) {  // --explain / --json of a plan
    std::string ignored;
    for (const CLI::Option* o : g_planning) {
      if (o->count() > 0) ignored += (ignored.empty() ? "" : ", ") + o->get_name();
    }
    if (!ignored.empty()) {
      // It printed the plan as it was, and exited 0, as if it had planned.
      return ob::Status::Usage(name + " is a plan, which ob-plan prints (--json, --explain, --measured) but does "
                               "not plan again: " + ignored + " would be ignored; give the profile it was made from");
    }
    return Emit(common, plan);
  }
  ob::pb::Profile profile;
  OB_RETURN_IF_ERROR(ob::io::ParseMessage(bytes, name, ob::io::kProfileFormatVersion, &profile));
  return MakePlan(common, profile);
}

void Setup(CLI::App& app) {
  app.footer(
      "Examples:\n"
      "  ob-profile --model gpt3-175b --analytic --gpu h100 | ob-plan -f 4 --nodes 1024 > plan.pb\n"
      "  ob-plan --hosts hosts.txt --bandwidth net.pb -f 1 --explain -o plan.pb profile.pb\n"
      "  ob-plan --explain plan.pb\n"
      "  ob-plan --explain --measured run.metrics plan.pb   # predicted vs measured");
  app.add_option("file", g.input, "A profile to plan from, or a plan to print (default: stdin)")
      ->option_text("FILE");
  // Every option added below is a planning option but those removed at
  // the end.
  const size_t before = app.get_options().size();
  app.add_option("-f,--faults", g.faults,
                 "Node failures the plan must survive, or 'auto': the f of the largest expected goodput "
                 "under --node-mtbf")
      ->capture_default_str();
  ob::plan_tool::AddFailureFlags(app, &g.failure);
  app.add_option("-n,--nodes", g.nodes, "Nodes in the cluster")->check(ob::cli::Positive());
  app.add_option("--hosts", g.hosts, "Hosts file (see ob-formats(5)); Slurm's nodes when absent")
      ->option_text("FILE");
  app.add_option("-g,--gpus-per-node", g.gpus_per_node,
                 "GPUs per node (default: the hosts' slots=, else the profile's)")
      ->check(ob::cli::Positive());
  app.add_option("--tp", g.tp,
                 "Tensor-parallel degree of every stage (Megatron's --tensor-model-parallel-size); "
                 "a node then runs g/tp stages (default: the fastest degree the model splits by)")
      ->check(ob::cli::Positive());
  app.add_flag("--mixed-stages", g.mixed_stages,
               "Templates may mix stages of different tensor-parallel degrees, and numbers of stages a node "
               "(e.g. 4+2+2 GPUs), where the plan is predicted faster than with one degree");
  app.add_flag("--always-mixed", g.always_mixed,
               "--mixed-stages, keeping the mixed templates even where one degree is predicted faster");
  app.add_option("--recompute", g.recompute,
                 "Activation recomputation of each stage's blocks: none, selective (the attention core and the "
                 "MLP's activation), full (each block again), or auto: each stage the fastest that fits")
      ->check(CLI::IsMember({"none", "selective", "full", "auto"}))
      ->capture_default_str();
  app.add_option("--schedule", g.schedule,
                 "Pipeline schedule of each template: 1f1b, zb-h1 (backward split, weight gradients fill the "
                 "bubbles, 1F1B's memory), zb-h2 (near-zero bubble, more memory), interleaved (v model chunks a "
                 "stage, the fill divided by v) or zb-v (two chunks in a V, the backward split), or auto: each "
                 "template the fastest that fits of 1f1b, zb-h1 and zb-h2 (design/schedule.md). The chunked ones "
                 "(interleaved, zb-v) run when named; auto leaves them out while the model prices interleaved "
                 "7 points faster than measured (docs/benchmarks.md)")
      ->capture_default_str();
  app.add_option("--shard-optimizer", g.shard,
                 "Split the optimizer state (AdamW's moments; in bf16 the fp32 master weights too) across each "
                 "layer's replicas in f+1 rows, so that any f failures leave every shard (design/shard.md): auto "
                 "(where it lets a pipeline be shorter), on, off, or a count S (each rank 1/S of it; at least "
                 "S(f+1) pipelines). Off by default: ob-launch does not run sharded plans yet (issue 69)")
      ->capture_default_str();
  app.add_option("--template-tp", g.template_tp,
                 "NODES=T: the template for NODES nodes runs degree T (g/T stages a node), the others "
                 "--tp's; replicas of different degrees sum gradients in pieces (repeatable)")
      ->option_text("NODES=T")
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--pipelines", g.pipelines,
                 "Fix the instantiation: the node count of each pipeline, e.g. 2,3 (default: the fastest)")
      ->option_text("N,N,...");
  app.add_flag("--local", g.local,
               "The hosts are processes of this machine (ob-launch --rsh local): price every collective by the profile's measured all-reduces");
  app.add_option("--gpu-memory", g.gpu_memory_gib, "GiB per GPU (default: the profile's device)")
      ->check(ob::cli::Positive());
  app.add_option("--host-memory", g.host_memory_gib,
                 "GiB of host memory per node for the workers' snapshots (36 bytes per parameter "
                 "of the node's stages); a plan that does not fit is refused (default: not checked)")
      ->check(ob::cli::Positive());
  app.add_option("-B,--global-batch", g.global_batch, "Sequences per iteration")
      ->capture_default_str()->check(ob::cli::Positive());
  app.add_option("-b,--microbatch", g.microbatch, "Sequences per micro-batch (default: the profile's first)")
      ->check(ob::cli::Positive());
  app.add_option("--bandwidth", g.bandwidth, "Measured links from ob-profile --net")->option_text("FILE");
  app.add_option("--seed", g.seed, "Seed of the placement search")->capture_default_str();
  app.add_option("--time-limit", g.time_limit, "Seconds the placement search may take at most")
      ->capture_default_str()->check(ob::cli::Positive());
  app.add_option("--moves", g.moves, "Placement search moves")->capture_default_str()->check(ob::cli::NonNegative());
  app.add_flag("--explain", g.explain, "Print the plan as human tables");
  app.add_option("--measured", g.measured,
                 "With --explain: a run's metrics (ob-launch --metrics) beside the predictions: the iteration, "
                 "and each stage's compute and memory")
      ->option_text("METRICS");
  app.add_option("--schedule-svg", g.schedule_svg, "Draw one iteration's 1F1B schedule per pipeline")
      ->option_text("FILE");
  app.add_option("--link-gbps", g.link_gbps, "Nominal node-to-node bandwidth, GB/s (without --bandwidth)")
      ->capture_default_str()->check(ob::cli::Positive());
  app.add_option("--link-latency-us", g.link_latency_us, "Nominal node-to-node latency, microseconds")
      ->capture_default_str()->check(ob::cli::NonNegative());
  app.add_option("--intra-gbps", g.intra_gbps, "Bandwidth inside a node, GB/s: tensor-parallel all-reduces and transfers between two stages "
                 "of one node (default: the profile's)")
      ->check(ob::cli::Positive());
  app.add_option("--overhead-gib", g.overhead_gib, "Memory per GPU kept for runtime and buffers (default 1, CPU 0)")
      ->check(ob::cli::NonNegative());
  app.add_option("--overhead-fraction", g.overhead_fraction, "Extra memory fraction for fragmentation")
      ->capture_default_str()->check(ob::cli::NonNegative());
  const std::vector<CLI::Option*> all = app.get_options();
  for (size_t i = before; i < all.size(); ++i) {
    if (all[i]->get_name() != "--explain" && all[i]->get_name() != "--measured") g_planning.push_back(all[i]);
  }
}

}  // namespace

int main(int argc, char** argv) {
  return ob::cli::Main(argc, argv,
                       {"plan", "Turn a profile and a cluster into a fault-tolerant pipeline plan.",
                        Setup, Run,
                        nullptr,
                        [] {
                          // No profile named: standard input (cli::InputPath).
                          return std::vector<ob::cli::NamedFile>{{"the profile", g.input.empty() ? "-" : g.input},
                                                                 {"--hosts", g.hosts},
                                                                 {"--bandwidth", g.bandwidth},
                                                                 {"--measured", g.measured}};
                        },
                        [] { return std::vector<ob::cli::NamedFile>{{"--schedule-svg", g.schedule_svg}}; }});
}
