#include "ob/launch/worker.h"

#include <unistd.h>

#include <chrono>

#include "ob/io/message.h"
#include "ob/io/records.h"
#include "ob/log.h"
#include "ob/metrics.pb.h"
#include "ob/model/data.h"
#include "ob/plan/plan_io.h"
#include "ob/profile/profile.h"
#include "ob/runtime/stage_worker.h"
#include "ob/torch_compat.h"

namespace ob::launch {
namespace {

struct PlanData {
  pb::Plan plan;
  plan::LoadedPlan loaded;
  model::GptConfig cfg;
};

Result<PlanData> LoadPlanData(const std::string& path) {
  PlanData out;
  OB_RETURN_IF_ERROR(io::LoadMessage(path, io::kPlanFormatVersion, &out.plan));
  auto loaded = plan::FromProto(out.plan);
  if (!loaded.ok()) return loaded.status().WithContext(path);
  out.loaded = std::move(loaded).value();
  out.cfg = model::GptConfig::FromProto(out.plan.model());
  OB_RETURN_IF_ERROR(out.cfg.Validate().WithContext(path));
  return out;
}

Result<model::TokenSource> OpenData(const std::string& spec, const model::GptConfig& cfg,
                                    uint64_t seed) {
  if (spec == "synthetic") return model::TokenSource::Synthetic(cfg.vocab_size, seed);
  return model::TokenSource::Open(spec);
}

}  // namespace

struct RendezvousStore::Impl {
  c10::intrusive_ptr<c10d::Store> store;
};

RendezvousStore::~RendezvousStore() = default;

Result<std::unique_ptr<RendezvousStore>> RendezvousStore::Start(const std::string& host) {
  std::unique_ptr<RendezvousStore> rs(new RendezvousStore());
  rs->impl_ = std::make_unique<Impl>();
  try {
    rs->impl_->store = compat::MakeTcpStore(host, 0, /*is_server=*/true, std::chrono::seconds(60));
    rs->address_ = host + ":" + std::to_string(compat::StorePort(rs->impl_->store));
  } catch (const std::exception& e) {
    return Status::Unavailable("cannot start the rendezvous store on " + host + ": " +
                               FirstLine(e.what()));
  }
  return rs;
}

Status CheckDataForPlan(const std::string& data, const std::string& plan_path) {
  OB_ASSIGN_OR_RETURN(PlanData pd, LoadPlanData(plan_path));
  if (data == "synthetic") return Status::Ok();
  if (access(data.c_str(), R_OK) != 0) return Status::Ok();  // only on the hosts: they check
  OB_ASSIGN_OR_RETURN(model::TokenSource src, model::TokenSource::Open(data));
  const int seq = static_cast<int>(pd.plan.sequence_length());
  Status st = src.Check(seq > 0 ? seq : pd.cfg.n_positions, pd.cfg.vocab_size);
  if (!st.ok())
    return Status::DataErr(st.message() + " (the plan's model is " + pd.cfg.name + ")");
  return Status::Ok();
}

Status RunWorker(const WorkerOptions& o) {
  OB_ASSIGN_OR_RETURN(PlanData pd, LoadPlanData(o.plan));
  const auto& lp = pd.loaded;
  OB_ASSIGN_OR_RETURN(runtime::Topology topo,
                      runtime::BuildTopology(lp.templates, lp.instantiation, lp.problem.microbatch_size));
  if (o.world != topo.world_size())
    return Status::Config("worker started for a world of " + std::to_string(o.world) +
                          ", the plan has " + std::to_string(topo.world_size()) + " ranks");
  if (o.rank < 0 || o.rank >= topo.world_size())
    return Status::Config("rank " + std::to_string(o.rank) + " out of range");
  OB_ASSIGN_OR_RETURN(model::TokenSource data, OpenData(o.data, pd.cfg, o.seed));

  model::TrainOptions t;
  t.steps = o.steps;
  t.global_batch = topo.global_batch();
  t.microbatch = topo.microbatch_size;
  t.seq_len = static_cast<int>(pd.plan.sequence_length());
  t.lr = o.lr;
  t.warmup_steps = o.warmup_steps;
  t.seed = o.seed;

  const auto colon = o.store.rfind(':');
  if (colon == std::string::npos) return Status::Usage("--store must be HOST:PORT");
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = compat::MakeTcpStore(o.store.substr(0, colon), std::stoi(o.store.substr(colon + 1)),
                                 /*is_server=*/false, timeout);
  } catch (const std::exception& e) {
    return Status::Unavailable("cannot reach the rendezvous store " + o.store + ": " +
                               FirstLine(e.what()));
  }
  OB_ASSIGN_OR_RETURN(auto worker, runtime::StageWorker::Create(pd.cfg, topo, o.rank, store, t, data, timeout));
  const auto& me = worker->info();
  OB_LOG(Info) << "pipeline " << me.pipeline << " stage " << me.stage << " layers "
               << me.first_layer << "-" << me.last_layer << ", " << me.num_microbatches
               << " micro-batches per step";

  io::RecordWriter out(STDOUT_FILENO, "<stdout>");
  for (int64_t step = 0; step < o.steps; ++step) {
    OB_ASSIGN_OR_RETURN(runtime::StepResult r, worker->Step(step));
    pb::Metrics m;
    m.set_format_version(io::kMetricsFormatVersion);
    m.set_host(o.host);
    m.set_rank(o.rank);
    m.set_pipeline(me.pipeline);
    m.set_stage(me.stage);
    m.set_step(static_cast<uint64_t>(step));
    m.set_unix_ms(profile::NowUnixMs());
    m.set_step_seconds(r.seconds);
    m.set_forward_seconds(r.forward_seconds);
    m.set_backward_seconds(r.backward_seconds);
    m.set_communication_seconds(r.comm_seconds);
    m.set_loss(r.loss);
    m.set_grad_norm(r.grad_norm);
    m.set_tokens_per_second(r.tokens_per_second);
    m.set_memory_bytes(static_cast<uint64_t>(r.memory_bytes));
    OB_RETURN_IF_ERROR(out.Write(m));
  }
  return Status::Ok();
}

}  // namespace ob::launch
