// The master's side of its standby master (design/master.md): where it
// runs, starting it (and a replacement when it is lost), mirroring every
// change to it, and the fence: a master that hears neither the standby nor
// enough hosts to stop a takeover makes no more decisions and exits.
#include "ob/launch/master/master_impl.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "ob/cluster/rsh.h"
#include "ob/io/text.h"
#include "ob/log.h"

namespace ob::launch {

using io::Fixed;

namespace detail {

namespace {

constexpr int kStandbyRetryMs = 2000;  // a lost standby's replacement starts this much later
constexpr int kStandbyStarts = 16;     // the most standbys one master starts
constexpr size_t kMetricsSoFarBytes = size_t{64} << 20;  // --metrics sent to a new standby, at most

}  // namespace

std::string Master::ChooseMasterHost() const {
  if (!opt_.master_host.empty()) return opt_.master_host;
  if (opt_.rsh == "local") return hosts_.empty() ? "" : hosts_.front().name;
  std::string here;
  if (const char* s = std::getenv("SLURMD_NODENAME"); opt_.rsh == "slurm" && s != nullptr) here = s;
  if (here.empty()) {
    char buf[256] = {};
    if (::gethostname(buf, sizeof buf - 1) == 0) here = buf;
  }
  for (const cluster::Host& h : hosts_) {
    if (h.name == here || h.name == here.substr(0, here.find('.'))) return h.name;
  }
  return "";
}

// The first live host that is not the master's, after the last one tried.
std::string Master::ChooseStandbyHost() const {
  if (opt_.standby_master == "off") return "";
  auto usable = [&](const AgentState& a) {
    return a.host.name != master_host_ && a.state != AgentState::State::kLost && a.excluded.empty();
  };
  if (opt_.standby_master != "auto") {  // the host named, while it is usable
    const AgentState* a = agents_.Find(opt_.standby_master);
    if (a != nullptr && usable(*a) && (standby_.starts == 0 || a->host.name != standby_.host)) return a->host.name;
  }
  // Else the first usable host after the last one tried, round the list.
  const auto& all = agents_.all();
  size_t from = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i]->host.name == standby_.host) from = i + 1;
  }
  for (size_t k = 0; k < all.size(); ++k) {
    const AgentState& a = *all[(from + k) % all.size()];
    if (usable(a) && (a.host.name != standby_.host || all.size() <= 2)) return a.host.name;
  }
  return "";
}

void Master::StartStandby() {
  standby_retry_ms_ = -1;
  const std::string host = ChooseStandbyHost();
  if (host.empty() || standby_.starts >= kStandbyStarts) {
    if (standby_wanted_) {
      OB_LOG(Warn) << "no host left for a standby master: the master's host is a single point of failure now";
      events_.Write("standby-master", "none: no host left");
    }
    standby_.host.clear();
    return;
  }
  const cluster::Host* h = nullptr;
  for (const cluster::Host& x : hosts_) {
    if (x.name == host) h = &x;
  }
  if (h == nullptr) {
    OB_LOG(Warn) << "--standby-master " << host << ": not a host of " << hosts_name_ << "; no standby master";
    return;
  }
  // Its options are the master's own command line, which it fetches.
  std::vector<std::string> cmd = {opt_.self_exe.empty() ? io::SelfExe("ob-launch") : opt_.self_exe,
                                  "--standby-master-of",
                                  AdvertisedHost(bind_addr_) + ":" + std::to_string(server_.port()),
                                  "--host", host};
  Result<cluster::ChildProcess> child = cluster::SpawnWithPipes(cluster::RshArgv(opt_.rsh, *h, cmd));
  ++standby_.starts;
  if (!child.ok()) {
    OB_LOG(Warn) << "cannot start the standby master on " << host << ": " << child.status().message();
    standby_retry_ms_ = Now() + kStandbyRetryMs;
    return;
  }
  standby_.host = host;
  standby_.rsh = std::move(child).value();
  standby_.rsh_done = false;
  standby_.conn.reset();
  standby_.address.clear();
  const std::string line = secret_ + "\n";
  if (::write(standby_.rsh.stdin_fd(), line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    OB_LOG(Debug) << "cannot hand the secret to the standby master: " << std::strerror(errno);
  }
  events_.Write("standby-master-start", "host=" + host + " pid=" + std::to_string(standby_.rsh.pid()) +
                                            " term=" + std::to_string(term_));
}

// The standby's first connection fetches what it starts from (its
// options, the plan, the hosts: main.cc) and ends; its second follows.
void Master::OnStandbyReady(std::shared_ptr<Connection> conn, const pb::Hello& hello) {
  if (hello.host() != standby_.host || state_ == State::kStopping || state_ == State::kDone) {
    conn->Close("not this run's standby master");
    return;
  }
  const bool fetch = hello.address().empty();  // its first connection: what it starts from
  if (!fetch) {
    if (standby_.conn) {
      standby_.conn->SetHandlers(nullptr, nullptr);
      standby_.conn->Close("replaced");
    }
    standby_.conn = conn;
    standby_.suspect = false;
    standby_synced_ = false;
    standby_.conn->SetHandlers([](Connection&, pb::Control&) {},  // heartbeats: the connection notes the time
                               [this](Connection&, const std::string& why) { StandbyLost("connection " + why); });
  } else {
    standby_fetches_.push_back(conn);  // held until it hangs up
    Connection* raw = conn.get();
    conn->SetHandlers([](Connection&, pb::Control&) {}, [this, raw](Connection&, const std::string&) {
      standby_fetches_.erase(std::remove_if(standby_fetches_.begin(), standby_fetches_.end(),
                                    [raw](const std::shared_ptr<Connection>& c) { return c.get() == raw; }),
                     standby_fetches_.end());
    });
  }
  // Everything at once: the options and files for its start, and the state.
  pb::Control m;
  pb::MasterSync& s = *m.mutable_master_sync();
  s = StateSync();
  s.set_full(true);
  *s.mutable_plan() = plan_;
  s.set_master_host(master_host_);
  s.set_start_unix_ms(events_.start_ms());
  Result<std::string> hosts_text = opt_.hosts_path.empty() ? Result<std::string>(std::string())
                                                           : io::ReadFile(opt_.hosts_path);
  if (hosts_text.ok()) s.set_hosts(*hosts_text);
  for (const std::string& a : opt_.argv) s.add_argv(a);
  s.set_cwd(opt_.cwd);
  s.set_run_dir(run_dir_);
  // The records so far, from --metrics (a standby that came late, or the
  // standby of a master that took over, lacks them).
  if (!opt_.metrics.empty() && opt_.metrics != "-") {
    if (Result<std::string> so_far = io::ReadFile(opt_.metrics); so_far.ok() && so_far->size() <= kMetricsSoFarBytes) {
      s.set_metrics_so_far(std::move(so_far).value());
    } else if (so_far.ok()) {
      OB_LOG(Warn) << "--metrics " << opt_.metrics << " holds " << so_far->size() / (1 << 20)
                   << " MiB, more than a standby is sent: a takeover's --metrics starts with its arrival";
    }
  }
  for (const auto& [key, value] : store_.data()) {
    pb::StoreEntry& e = *s.add_store();
    e.set_key(key);
    e.set_value(value);
  }
  conn->Send(m);
  if (fetch) return;
  last_state_.clear();
  synced_plan_generation_ = generation_;
  delta_.Clear();
  standby_synced_ = true;
  standby_.address = hello.address();
  {
    events_.Write("standby-master", "host=" + standby_.host + " address=" + standby_.address +
                                        " term=" + std::to_string(term_));
    OB_LOG(Info) << "standby master on " << standby_.host << " (" << standby_.address << ") follows term "
                 << term_;
    TellStandby(nullptr);
  }
}

void Master::StandbyLost(const std::string& why) {
  if (standby_.host.empty()) return;
  const std::string host = standby_.host;
  events_.Write("standby-master-lost", "host=" + host + " " + why);
  if (state_ == State::kRunning || state_ == State::kStarting) {
    OB_LOG(Warn) << "lost the standby master on " << host << " (" << why << "); starting another";
  }
  if (standby_.conn) {
    standby_.conn->SetHandlers(nullptr, nullptr);
    standby_.conn->Close("lost");
    standby_.conn.reset();
  }
  if (!standby_.rsh_done) {
    standby_.rsh.CloseStdin();
    standby_.rsh.Kill();
  }
  standby_.address.clear();
  standby_synced_ = false;
  // (The agents keep its address until the next one is in: a master cut
  // off from it is about to be replaced by it, and its own host's agent
  // must find it then.)
  if (state_ == State::kRunning || state_ == State::kStarting) standby_retry_ms_ = Now() + kStandbyRetryMs;
}

// Each tick: its process and its silence judged, a replacement started
// when due, the changes since the last tick sent.
void Master::CheckStandby() {
  if (!standby_wanted_) return;
  if (!standby_.rsh_done) {
    standby_.rsh.WaitFor(0);
    if (!standby_.rsh.running()) {
      standby_.rsh_done = true;
      if (state_ == State::kRunning || state_ == State::kStarting) {
        StandbyLost("its process " + standby_.rsh.DescribeExit());
      }
    }
  }
  const int64_t now = Now();
  // Replaced only after a long silence (as long as agents give the master,
  // or three agent timeouts): a standby starved for a moment on a loaded
  // host is no lost host, and each new one loads what the master loaded.
  // (The fence does not wait for that: Fenced.)
  if (standby_.conn && standby_synced_ && grace_.MayJudge(now)) {
    const int64_t silent = now - standby_.conn->last_receive_ms();
    const int64_t limit = static_cast<int64_t>(1e3 * std::max(opt_.master_timeout_s, 3 * opt_.agent_timeout_s));
    const bool over = silent > limit;
    if (over && standby_.suspect) {
      StandbyLost("silent for " + std::to_string(silent) + " ms");
    } else {
      standby_.suspect = over;
    }
  }
  if (standby_.conn && standby_synced_) {
    // The base a takeover's majority counts from, taken only while the
    // standby is heard from right now: a master cut off does not shrink
    // it by the hosts it loses on its side of the cut.
    if (StandbyHeard(2 * kHeartbeatMs)) quorum_base_ = HostsHeard(-1);
    SyncStandby();
  } else if (standby_retry_ms_ >= 0 && now >= standby_retry_ms_ && state_ == State::kRunning) {
    StartStandby();
  } else if (standby_.conn == nullptr && standby_.rsh_done && standby_retry_ms_ < 0 && !standby_.host.empty() &&
             state_ == State::kRunning) {
    standby_retry_ms_ = now + kStandbyRetryMs;
  }
}

// The state fields, as the standby takes over with them.
pb::MasterSync Master::StateSync() const {
  pb::MasterSync s;
  s.set_term(term_);
  s.set_generation(generation_);
  pb::Plan holding = plan_;
  plan::SetInstantiation(loaded_.problem, loaded_.templates, holding_, &holding);
  *s.mutable_holding() = std::move(holding);
  for (int n : lost_since_holding_) s.add_lost_since_holding(static_cast<uint32_t>(n));
  for (int n : idle_) s.add_idle(static_cast<uint32_t>(n));
  for (const std::string& h : lost_hosts_) s.add_lost_hosts(h);
  for (const auto& a : agents_.all()) {
    if (!a->excluded.empty()) s.add_excluded(a->host.name + "\t" + a->excluded);
    if (a->connected()) s.add_connected(a->host.name);
  }
  *s.mutable_lineage_start() = lineage_.start();
  s.set_lineage_has_steps(lineage_.has_steps());
  s.set_fruitless(fruitless_);
  s.set_run_id(run_id_);
  s.set_master_host(master_host_);
  return s;
}

void Master::SyncStandby() {
  pb::MasterSync state = StateSync();
  std::string bytes = state.SerializeAsString();
  const bool plan_changed = synced_plan_generation_ != generation_;
  const bool state_changed = bytes != last_state_ || plan_changed;
  if (!state_changed && delta_.store_size() == 0 && delta_.events_size() == 0 && delta_.metrics_size() == 0) {
    return;
  }
  pb::Control m;
  pb::MasterSync& s = *m.mutable_master_sync();
  if (state_changed) s = std::move(state);  // else only what was added (term 0: no state)
  if (plan_changed) *s.mutable_plan() = plan_;
  s.mutable_store()->Swap(delta_.mutable_store());
  s.mutable_events()->Swap(delta_.mutable_events());
  s.mutable_metrics()->Swap(delta_.mutable_metrics());
  delta_.Clear();
  standby_.conn->Send(m);
  last_state_ = std::move(bytes);
  synced_plan_generation_ = generation_;
}

// Where the standby listens, to every connected agent (or one): an agent
// that loses this master goes there.
void Master::TellStandby(AgentState* only) {
  if (!standby_.conn || standby_.address.empty()) return;
  pb::Control m;
  pb::StandbyMaster& t = *m.mutable_standby_master();
  t.set_term(term_);
  t.set_host(standby_.host);
  t.set_address(standby_.address);
  if (only != nullptr) {
    if (only->conn && only->connected()) only->conn->Send(m);
    return;
  }
  agents_.Send(m);
}

// A master that hears neither its standby nor more than the members a
// takeover leaves out may have been replaced: it makes no more decisions.
// The standby takes over only with a majority of the members, each of
// which stopped hearing this master and left it first; those this master
// still hears cannot be among them.
bool Master::Fenced() {
  if (!standby_wanted_ || quorum_base_ == 0 || state_ != State::kRunning) return false;
  // Heard within an agent timeout: not replaced (it takes over only once
  // it has lost us for --master-timeout).
  if (StandbyHeard(static_cast<int64_t>(opt_.agent_timeout_s * 1e3))) return false;
  const size_t heard = HostsHeard(-1);
  if (heard > quorum_base_ - Quorum(quorum_base_)) return false;
  const std::string msg = "this master (term " + std::to_string(term_) + ") hears neither its standby nor more than " +
                          std::to_string(heard) + " of the " + std::to_string(quorum_base_) +
                          " hosts: the standby master may have taken over; making no more decisions, stopping";
  events_.Write("fenced", msg);
  OB_LOG(Error) << msg;
  outcome_ = Status::TempFail(msg);
  agents_.Close();  // no Stop: the agents go to the standby, and keep their hosts' state
  state_ = State::kDone;
  uv_stop(&loop_);
  return true;
}

// Before a decision: whether this master, its standby not heard right now
// (within two heartbeats, as quorum_base_ counts), hears right now no more
// hosts than Fenced stops at. A cut loses every agent beyond it within one
// heartbeat's spread, each found lost at its own tick: a decision between
// the first finding and the last counted the others as heard and acted on
// the cut-off side (launch_standby_split, once in a suite under load: the
// old master decided on 2 of 3 lost hosts 50 ms before finding the third).
// Such a decision waits: the next ticks judge the silent agents and Fenced
// stops us, or they are heard again and it goes on; slow is not lost.
bool Master::QuorumInDoubt() {
  if (!standby_wanted_ || quorum_base_ == 0 || StandbyHeard(2 * kHeartbeatMs)) return false;
  return HostsHeard(2 * kHeartbeatMs) <= quorum_base_ - Quorum(quorum_base_);
}

bool Master::StandbyHeard(int64_t within_ms) {
  return standby_.conn && Now() - standby_.conn->last_receive_ms() <= within_ms;
}

size_t Master::HostsHeard(int64_t within_ms) {
  const int64_t now = Now();
  size_t heard = 0;
  for (const auto& a : agents_.all()) {
    heard += a->connected() && (within_ms < 0 || (a->conn && now - a->conn->last_receive_ms() <= within_ms)) ? 1 : 0;
  }
  return heard;
}

}  // namespace detail

}  // namespace ob::launch
