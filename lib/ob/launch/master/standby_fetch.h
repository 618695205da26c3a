// What a standby master starts from (design/master.md): main.cc connects to
// the master once, as the standby of `host`, and gets the master's command
// line, working and run directories, plan and hosts file, before it parses
// any option of its own; then it runs as the master's follower (master.h
// MasterOptions::standby_of), which connects again.
#pragma once

#include <string>

#include "ob/control.pb.h"
#include "ob/status.h"

namespace ob::launch {

struct StandbyStart {
  pb::MasterSync sync;   // full
  std::string local_ip;  // where this host meets the master: the standby listens there
};

// kUnavailable when the master cannot be reached or says nothing within
// `timeout_ms`; kConfig when it refuses us.
Result<StandbyStart> FetchStandbyStart(const std::string& master, const std::string& host,
                                       const std::string& secret, int timeout_ms);

}  // namespace ob::launch
