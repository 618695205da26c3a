#include "failure_flags.h"

#include "ob/plan/plan_io.h"

namespace ob::plan_tool {

void AddFailureFlags(CLI::App& app, FailureFlags* f) {
  app.add_option("--node-mtbf", f->node_mtbf,
                 "With -f auto: mean time between failures of one node (a duration: 90s, 45m, 7.9h, 2000d)")
      ->option_text("DURATION");
  app.add_option("--repair-time", f->repair_time, "With -f auto: how long a failed node stays out")
      ->option_text("DURATION")->capture_default_str();
  app.add_option("--horizon", f->horizon, "With -f auto: the run's length (bounds the checkpoint interval)")
      ->option_text("DURATION")->capture_default_str();
  app.add_option("--recovery-time", f->recovery_time,
                 "With -f auto: an in-place recovery (ob-launch's events.log 'recovered' lines measure it)")
      ->option_text("DURATION")->capture_default_str();
  app.add_option("--restart-time", f->restart_time,
                 "With -f auto: a restart from a checkpoint, for failures beyond f")
      ->option_text("DURATION")->capture_default_str();
  app.add_option("--checkpoint-cost", f->checkpoint_cost, "With -f auto: training time one checkpoint costs")
      ->option_text("DURATION")->capture_default_str();
  app.add_option("--standby-master", f->standby_master,
                 "With -f auto: whether the run has a standby master (as ob-launch starts by default): on, the "
                 "master's host fails like another; off, each of its failures is a restart from a checkpoint")
      ->option_text("on|off")->check(CLI::IsMember({"on", "off"}))->capture_default_str();
  app.add_option("--takeover-time", f->takeover_time,
                 "With -f auto and a standby master: how much longer a recovery of the master's host takes "
                 "(ob-launch's master timeout)")
      ->option_text("DURATION")->capture_default_str();
}

Result<plan::FailureModel> FailureModelOf(const FailureFlags& f) {
  if (f.node_mtbf.empty()) {
    return Status::Usage("-f auto needs --node-mtbf, one node's mean time between failures (e.g. 2000d)");
  }
  plan::FailureModel m;
  OB_ASSIGN_OR_RETURN(m.node_mtbf_s, plan::ParseDuration(f.node_mtbf, "--node-mtbf"));
  OB_ASSIGN_OR_RETURN(m.repair_s, plan::ParseDuration(f.repair_time, "--repair-time"));
  OB_ASSIGN_OR_RETURN(m.horizon_s, plan::ParseDuration(f.horizon, "--horizon"));
  OB_ASSIGN_OR_RETURN(m.recovery_s, plan::ParseDuration(f.recovery_time, "--recovery-time"));
  OB_ASSIGN_OR_RETURN(m.restart_s, plan::ParseDuration(f.restart_time, "--restart-time"));
  OB_ASSIGN_OR_RETURN(m.checkpoint_s, plan::ParseDuration(f.checkpoint_cost, "--checkpoint-cost"));
  OB_ASSIGN_OR_RETURN(m.takeover_s, plan::ParseDuration(f.takeover_time, "--takeover-time"));
  m.standby_master = f.standby_master != "off";
  return m;
}

}  // namespace ob::plan_tool
