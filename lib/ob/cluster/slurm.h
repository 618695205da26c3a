// What Slurm does with a job when one of its nodes fails (ob-launch --rsh
// slurm, design/launch.md).
//
// By default slurmctld ends (or requeues) the whole job once a node of it
// has been unresponsive for SlurmdTimeout: ob's recovery in place then
// lasts only until Slurm's verdict. A job submitted with `sbatch --no-kill`
// (or `-k`, `#SBATCH --no-kill`, SBATCH_NO_KILL; salloc's SALLOC_NO_KILL)
// loses only the failed node's steps and goes on.
//
// Slurm (22.05 at least) shows that flag in no field a job can read: not in
// `scontrol show job` (-dd included), not in the job's environment. What
// can be read is where the user may have written it: the batch script's
// #SBATCH lines (`scontrol write batch_script JOB -`) and the
// SBATCH_NO_KILL / SALLOC_NO_KILL variables sbatch and salloc read, which
// the job inherits. Precedence as sbatch's own: the environment over the
// script's directives. A --no-kill given on sbatch's command line is seen
// nowhere; the policy is then kUnknown.
//
// Thread-safety: the parsers are pure; ReadNodeFailPolicy runs scontrol.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace ob::cluster {

struct NodeFailPolicy {
  enum class Kind {
    kKeepsJob,  // --no-kill: Slurm removes the failed node, the job goes on
    kEndsJob,   // --no-kill=off: Slurm ends the job on a node failure
    kUnknown,   // no --no-kill anywhere it can be seen: Slurm's default
                // (the job ends) unless it was given on sbatch's command line
  };
  Kind kind = Kind::kUnknown;
  std::string source;  // where it was read ("#SBATCH --no-kill in the batch script"); empty for kUnknown
};

// The batch script's #SBATCH directives about --no-kill: true for
// `--no-kill`, `--no-kill=VALUE` other than off, or `-k`; false for
// `--no-kill=off`; nullopt when none says either. As sbatch does, only the
// lines before the first one that is neither blank nor a comment count, a
// later directive wins, and a word starting with '#' ends a directive line.
std::optional<bool> NoKillDirective(std::string_view script);

// The policy from an environment variable's value (nullptr: unset; any value
// but "off", in any case, means --no-kill) and the batch script (nullopt:
// none, or it could not be read).
NodeFailPolicy JudgeNodeFail(const char* sbatch_no_kill, const char* salloc_no_kill,
                             const std::optional<std::string>& batch_script);

// The policy of Slurm job `job_id`, from this process's environment and the
// job's batch script (`scontrol write batch_script JOB_ID -`, given at most
// `timeout_s` seconds; a script that cannot be read, an salloc job's
// included, counts as none).
NodeFailPolicy ReadNodeFailPolicy(const std::string& job_id, double timeout_s = 10);

// One line for ob-launch to warn with when `p` is not kKeepsJob: what Slurm
// will do with job `job_id` on a node failure and the flag that prevents it.
std::string NodeFailWarning(const NodeFailPolicy& p, const std::string& job_id);

// Ends job `job_id` (`scancel JOB`, given at most `timeout_s`): a run that
// outlived its batch host ends its allocation so (launch/master: a standby
// master that took over). False when scancel could not be run or failed.
bool EndJob(const std::string& job_id, double timeout_s = 10);

}  // namespace ob::cluster
