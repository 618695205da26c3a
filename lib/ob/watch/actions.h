// --act: what ob-watch asks the master for, when, and how.
//
// ActionPolicy turns events into requests for the master's control socket
// (one text line each, answered by one JSON line):
//   EVENT_HANG of a rank            → "exclude HOST hang: …"  (the timeout
//                                      is the confirmation)
//   EVENT_STRAGGLER                 → "exclude HOST straggler: …" once the
//                                      host has `confirm` straggler events
//                                      in the current generation
//   EVENT_CRASH                     → "exclude HOST crash loop: …" once the
//                                      host's workers crashed in `confirm`
//                                      distinct generations
//   EVENT_LOSS_NAN                  → "rollback loss …": restore the last
//                                      checkpoint
//   EVENT_MEMORY_GROWTH             → "checkpoint memory …": save before the
//                                      rank runs out
// Each line starts "run=ID " when the event names its run (Event.run), so
// that the master acts only on evidence from its own run.
// Nothing else acts. Each target (a host for exclude; the job for
// checkpoint and rollback) then rests for `cooldown_s`, whatever the answer,
// so one bad reading never evicts a healthy host and a flapping one is not
// excluded twice in a row. Times are the watcher's clock.
//
// ControlClient sends one request on a fresh connection to the socket and
// reads the one-line answer. Thread-safety: none; one caller.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ob/metrics.pb.h"
#include "ob/status.h"

namespace ob::watch {

struct ActionOptions {
  int confirm = 3;         // straggler events / crash generations before exclude
  double cooldown_s = 30;  // per host (exclude) and per job (checkpoint, rollback)
};

struct ActionRequest {
  std::string verb;        // "exclude", "checkpoint", "rollback"
  std::string target;      // the host for exclude, "" for the job
  std::string line;        // what is sent, without the newline
  pb::Event cause;         // the event that made it
  int confirmations = 1;   // events behind it
};

class ActionPolicy {
 public:
  explicit ActionPolicy(const ActionOptions& o) : o_(o) {}
  // The request `e` calls for at `now_ms`, if any; starts the target's
  // cool-down when it returns one.
  std::optional<ActionRequest> Consider(const pb::Event& e, int64_t now_ms);
  // Why the last Consider returned nothing ("" when the event never acts).
  const std::string& why_not() const { return why_not_; }

 private:
  bool Cooling(const std::string& target, int64_t now_ms);

  ActionOptions o_;
  std::map<std::string, int64_t> last_action_ms_;      // target → when
  std::map<std::string, std::vector<uint64_t>> straggles_;  // host → steps of its events
  uint64_t straggle_generation_ = 0;
  std::string why_not_;
};

// The answer to one request.
struct ActionAnswer {
  bool ok = false;
  std::string error;       // the master's, when !ok
  std::string line;        // the raw JSON line
};

// Sends `line` + "\n" to the unix socket at `path` and reads one answer
// line within `timeout_s`. kUnavailable when the socket cannot be reached
// or does not answer; an answer with "ok":false is a value, not an error.
Result<ActionAnswer> SendControlRequest(const std::string& path, const std::string& line,
                                        double timeout_s);

// The EVENT_ACTION that records `request` and its answer (`answer` null in a
// dry run): the cause's host, rank, step and evidence, plus "ok".
pb::Event ActionEvent(const ActionRequest& request, const ActionAnswer* answer, int64_t now_ms);

}  // namespace ob::watch
