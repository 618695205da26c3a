// The agent's life (agent.h): it reads the secret, connects to the master
// (and again, when cut off), takes the master's messages, and shuts down
// with its workers.
#include "ob/launch/agent/agent_impl.h"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ob/clock.h"
#include "ob/io/file.h"
#include "ob/log.h"

namespace ob::launch {
namespace {

constexpr int kSecretWaitMs = 30000;  // the master writes the secret right after starting us

// The first line of `fd`, read a byte at a time so nothing after it is
// consumed. Empty on end of file, timeout or error.
std::string ReadSecretLine(int fd) {
  std::string line;
  while (line.size() < 4096) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, kSecretWaitMs) <= 0) return "";
    char c;
    ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (c == '\n') return line;
    line += c;
  }
  return line;
}

}  // namespace

namespace detail {

int Agent::Run() {
  std::string& host = master_host_;
  int& port = master_port_;
  Status st = SplitHostPort(opt_.master, "--master", &host, &port);
  if (!st.ok()) {
    OB_LOG(Error) << st.message();
    return static_cast<int>(Code::kUsage);
  }
  secret_ = ReadSecretLine(opt_.secret_fd);
  if (secret_.empty()) {
    OB_LOG(Error) << "no secret on stdin: the master writes it there when it starts an agent";
    return static_cast<int>(Code::kConfig);
  }
  ::unsetenv("OB_SECRET");  // workers never see a secret
  ::signal(SIGPIPE, SIG_IGN);  // a standby that died must not take us with it
  // Standbys forked from the seed are its grandchildren; its middle
  // process exits at once, and they become ours to reap.
  if (opt_.standby_exe.empty() || !opt_.standby_seed) {
    seed_state_ = Seed::kFailed;  // none to fork from
  } else if (::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    OB_LOG(Warn) << "not a child subreaper (" << io::Errno() << "): standbys start by exec";
    seed_state_ = Seed::kFailed;
  } else {
    subreaper_ = true;
  }

  // Signals before anything can fork, so no exit goes unseen.
  uv_signal_init(&loop_, &sigchld_);
  sigchld_.data = this;
  uv_signal_start(&sigchld_, [](uv_signal_t* s, int) { static_cast<Agent*>(s->data)->ReapWorkers(); },
                  SIGCHLD);
  for (auto [h, sig] : {std::pair{&sigterm_, SIGTERM}, {&sigint_, SIGINT}, {&sighup_, SIGHUP}}) {
    uv_signal_init(&loop_, h);
    h->data = this;
    uv_signal_start(h, [](uv_signal_t* s, int signum) {
      static_cast<Agent*>(s->data)->Shutdown(128 + signum, std::string("got ") + strsignal(signum));
    }, sig);
  }
  // End of file on stdin: the master (or its ssh) is gone. A stdin that is
  // not a pipe or socket (a file, when started by hand) is not watched.
  uv_pipe_init(&loop_, &stdin_, 0);
  stdin_.data = this;
  if (uv_guess_handle(opt_.secret_fd) == UV_NAMED_PIPE && uv_pipe_open(&stdin_, opt_.secret_fd) == 0) {
    stdin_open_ = true;
    uv_read_start(reinterpret_cast<uv_stream_t*>(&stdin_),
                  [](uv_handle_t*, size_t, uv_buf_t* b) {
                    static char scratch[256];
                    *b = uv_buf_init(scratch, sizeof scratch);
                  },
                  [](uv_stream_t* s, ssize_t n, const uv_buf_t*) {
                    if (n >= 0) return;  // later lines are ignored
                    auto* a = static_cast<Agent*>(s->data);
                    uv_read_stop(s);
                    a->stdin_open_ = false;
                    if (a->failed_over_) return;  // the old master's rsh: nothing to us now
                    a->LostMaster(static_cast<int>(Code::kTempFail), "stdin closed: the master is gone");
                  });
  }
  uv_timer_init(&loop_, &heartbeat_);
  uv_timer_init(&loop_, &watchdog_);
  uv_timer_init(&loop_, &drain_);
  uv_timer_init(&loop_, &retry_);
  heartbeat_.data = watchdog_.data = drain_.data = retry_.data = this;
  Reconnect();
  uv_run(&loop_, UV_RUN_DEFAULT);
  KillWorkers();  // in case the loop ended some other way
  return exit_code_ < 0 ? 0 : exit_code_;
}

void Agent::Reconnect() {
  pb::Hello hello;
  hello.set_host(opt_.host);
  hello.set_pid(static_cast<uint32_t>(::getpid()));
  hello.set_boot_id(BootId());
  for (const std::string& id : opt_.gpu_ids) hello.add_gpus(id);
  for (uint64_t bytes : opt_.gpu_memory) hello.add_gpu_memory_bytes(bytes);
  for (const std::string& name : opt_.gpu_names) hello.add_gpu_names(name);
  hello.set_device(cuda() ? "cuda" : "cpu");
  hello.set_build(opt_.build);
  hello.set_term(term_);
  // Between the master and its standby, each is asked briefly in turn.
  const int timeout_ms = alternate_.empty() ? opt_.connect_timeout_ms
                                            : std::min(opt_.connect_timeout_ms, kFailoverConnectMs);
  Connect(&loop_, master_host_, master_port_, timeout_ms, secret_, hello,
          [this](Result<std::shared_ptr<Connection>> r) { OnConnected(std::move(r)); });
}

void Agent::LostMaster(int code, const std::string& reason, bool evicted) {
  if (exit_code_ >= 0) return;
  // Already asking the two (the master's silence, then its rsh's end of
  // file): a second round would connect twice, and the standby would count
  // the first connection's close as this host lost.
  if (!alternate_.empty()) return;
  if (standby_address_.empty()) return Shutdown(code, reason);
  std::string host;
  int port = 0;
  if (!SplitHostPort(standby_address_, "the standby master", &host, &port).ok()) return Shutdown(code, reason);
  OB_LOG(Warn) << "lost the master (" << reason << "): stopping generation " << generation_
               << "'s workers and asking the standby master on " << standby_host_ << " (" << standby_address_
               << "), and the master, to take us";
  // The standby takes us once it has lost the master too; while it hears
  // the master it refuses, and the master (which only evicted us, or
  // stalled a moment) is asked next.
  alternate_ = master_host_ + ":" + std::to_string(master_port_);
  lost_reason_ = reason;
  pending_.clear();
  Retire();
  if (probe_) probe_->SetPeers({});
  uv_timer_stop(&heartbeat_);
  uv_timer_stop(&retry_);
  if (conn_) {
    conn_->SetHandlers(nullptr, nullptr);
    conn_->Close("lost the master");
    conn_.reset();
  }
  master_host_ = host;
  master_port_ = port;
  at_standby_ = true;
  failing_over_ = true;
  // As long as a takeover takes at most (the standby hears the master's
  // silence as we did, and then its hosts come within a moment); an agent
  // the master evicted asks as long as it always has (kRejoinMs).
  rejoin_until_ms_ =
      static_cast<int64_t>(uv_now(&loop_)) + (evicted ? kRejoinMs : FailoverWindowMs(opt_.master_timeout_s));
  standby_refused_ = master_refused_ = false;
  Reconnect();
}

void Agent::Detach(const std::string& reason) {
  if (exit_code_ >= 0) return;
  if (!left_master_.empty()) {
    // The standby let us go without acting as master (the master answers
    // it again, or no takeover): the master may take us back. Asked in
    // turn with the standby, as after losing the master.
    standby_host_ = held_by_;
    standby_address_ = master_host_ + ":" + std::to_string(master_port_);
    if (!SplitHostPort(left_master_, "the master", &master_host_, &master_port_).ok()) {
      return Shutdown(static_cast<int>(Code::kTempFail), "lost the standby master: " + reason);
    }
    left_master_.clear();
    held_by_.clear();
    failed_over_ = false;
    return LostMaster(static_cast<int>(Code::kTempFail), "the standby master let this host go: " + reason,
                      /*evicted=*/true);
  }
  if (!standby_address_.empty()) {
    return LostMaster(static_cast<int>(Code::kTempFail), "connection " + reason, /*evicted=*/stdin_open_);
  }
  if (!stdin_open_ || rejoin_until_ms_ >= 0) {
    return Shutdown(static_cast<int>(Code::kTempFail), "lost the master: " + reason);
  }
  OB_LOG(Warn) << "lost the master (" << reason << "): stopping generation " << generation_
               << "'s workers and asking to rejoin";
  pending_.clear();
  Retire();
  if (probe_) probe_->SetPeers({});
  uv_timer_stop(&heartbeat_);
  conn_->SetHandlers(nullptr, nullptr);
  conn_.reset();
  rejoin_until_ms_ = static_cast<int64_t>(uv_now(&loop_)) + kRejoinMs;
  Reconnect();
}

void Agent::OnConnected(Result<std::shared_ptr<Connection>> r) {
  if (exit_code_ >= 0) return;
  if (!r.ok() && !alternate_.empty()) {
    // Refused by both, one after the other: no process listens at either
    // address, so nobody will take us (the one that took over ended the
    // run, or both are gone). A timeout or an unreachable network says
    // nothing of the kind: slow or cut off is not gone.
    (at_standby_ ? standby_refused_ : master_refused_) = NobodyListens(r.status());
    if (standby_refused_ && master_refused_) {
      return Shutdown(static_cast<int>(Code::kTempFail),
                      lost_reason_ + "; neither the master nor the standby master on " + standby_host_ +
                          " runs any more (both refused the connection): the run has ended, or both are gone");
    }
  }
  if (!r.ok() && !alternate_.empty() && static_cast<int64_t>(uv_now(&loop_)) + kRejoinRetryMs < rejoin_until_ms_ &&
      (r.status().code() != Code::kConfig || at_standby_)) {
    // The other one next: a standby that still hears the master refuses.
    std::string next = master_host_ + ":" + std::to_string(master_port_);
    std::swap(next, alternate_);
    (void)SplitHostPort(next, "the master", &master_host_, &master_port_);
    at_standby_ = !at_standby_;
    uv_timer_start(&retry_, [](uv_timer_t* t) { static_cast<Agent*>(t->data)->Reconnect(); },
                   at_standby_ ? kRejoinRetryMs : 0, 0);
    return;
  }
  if (!r.ok() && rejoin_until_ms_ >= 0 && r.status().code() != Code::kConfig &&
      static_cast<int64_t>(uv_now(&loop_)) + kRejoinRetryMs < rejoin_until_ms_) {
    uv_timer_start(&retry_, [](uv_timer_t* t) { static_cast<Agent*>(t->data)->Reconnect(); },
                   kRejoinRetryMs, 0);
    return;
  }
  if (!r.ok() && !alternate_.empty()) {  // neither the master nor its standby took us
    return Shutdown(static_cast<int>(Code::kTempFail),
                    lost_reason_ + "; neither the master nor the standby master on " + standby_host_ +
                        " took this host back (the last answer: " + r.status().message() + ")");
  }
  if (!r.ok()) {
    std::string why = r.status().message();
    // Which address it tried is in the message; the usual cause is a
    // master listening where this host cannot reach it.
    if (why.rfind("cannot connect", 0) == 0) {
      why += " (the master listens on its --bind; if this host reaches its machine at another address, "
             "give ob-launch --bind ADDR)";
    }
    return Shutdown(r.status().code() == Code::kConfig ? static_cast<int>(Code::kConfig)
                                                       : static_cast<int>(Code::kUnavailable),
                    why);
  }
  conn_ = std::move(r).value();
  OB_LOG(Info) << (rejoin_until_ms_ >= 0 ? "rejoined" : "connected to") << " the master at "
               << conn_->peer();
  rejoin_until_ms_ = -1;
  master_suspect_ = false;
  if (at_standby_) {  // the standby is our master now; the next standby is its to name
    failed_over_ = true;
    at_standby_ = false;
    left_master_ = alternate_;
    held_by_ = standby_host_;
    standby_address_.clear();
    standby_host_.clear();
  }
  alternate_.clear();
  if (failing_over_) {  // what a lost master may not have passed on
    failing_over_ = false;
    for (const auto& [rank, records] : recent_records_) {
      for (const pb::Control& m : records) conn_->Send(m);
    }
  }
  if (opt_.spare_standbys) {
    SpawnStandby(0);  // loading while the master waits for the other agents
  } else if (seed_state_ == Seed::kNone) {
    StartSeed();  // the same, for the workers to fork from
  }
  conn_->SetHandlers([this](Connection&, pb::Control& m) { OnMessage(m); },
                     [this](Connection&, const std::string& reason) { Detach(reason); });
  uv_timer_start(&heartbeat_, [](uv_timer_t* t) {
    auto* a = static_cast<Agent*>(t->data);
    pb::Control m;
    m.mutable_heartbeat()->set_sequence(++a->sequence_);
    m.mutable_heartbeat()->set_unix_ms(UnixMs());
    if (a->probe_) {
      for (const std::string& h : a->probe_->Unreachable()) m.mutable_heartbeat()->add_unreachable(h);
    }
    a->Send(m);
  }, 0, kHeartbeatMs);
  uv_timer_start(&watchdog_, [](uv_timer_t* t) {
    auto* a = static_cast<Agent*>(t->data);
    a->ReapWorkers();  // a backstop for a coalesced SIGCHLD
    if (a->seed_state_ == Seed::kLoading &&
        static_cast<int64_t>(uv_now(&a->loop_)) - a->seed_started_ms_ > kColdStartMs) {
      a->SeedFailed("not loaded after " + std::to_string(kColdStartMs / 1000) + " s");
      a->SeedSettled();
    }
    a->StartPending();  // a replaced worker past kRetireWaitMs
    a->CheckDeadlines();
    const int64_t now = static_cast<int64_t>(uv_now(&a->loop_));
    const int64_t stalled_ms = a->stalls_.Tick(now);
    if (!a->conn_) return;
    if (!a->stalls_.MayJudge(now)) {
      if (stalled_ms > 0) {
        OB_LOG(Warn) << "this agent did not run for " << stalled_ms << " ms; hearing the master out for "
                     << StallGrace::kGraceMs << " ms before it judges its silence";
      }
      a->master_suspect_ = false;
      return;
    }
    double silent_s = (now - a->conn_->last_receive_ms()) / 1e3;
    // Confirmed at the next tick, after an I/O poll: a loop that was
    // descheduled must read what waits in the socket before it judges.
    const bool silent = silent_s > a->opt_.master_timeout_s;
    const bool confirmed = silent && a->master_suspect_;
    a->master_suspect_ = silent;
    if (confirmed) {
      char text[64];
      snprintf(text, sizeof text, "%.1f s", silent_s);
      a->LostMaster(static_cast<int>(Code::kTempFail), std::string("the master has been silent for ") + text);
    }
  }, kWatchdogMs, kWatchdogMs);
}

void Agent::OnMessage(pb::Control& m) {
  switch (m.kind_case()) {
    case pb::Control::kHeartbeat: break;  // the connection noted the time
    case pb::Control::kStartWorkers:
      left_master_.clear();  // a standby that holds us acts as master now
      StartWorkers(m.start_workers());
      break;
    case pb::Control::kStoreReply: relay_->Deliver(m.store_reply()); break;
    case pb::Control::kStop: Shutdown(0, "told to stop: " + m.stop().reason()); break;
    case pb::Control::kStandbyMaster:
      left_master_.clear();
      term_ = std::max(term_, m.standby_master().term());
      standby_host_ = m.standby_master().host();
      standby_address_ = m.standby_master().address();
      break;
    default: OB_LOG(Debug) << "ignoring control message " << m.kind_case(); break;
  }
}

void Agent::Shutdown(int code, const std::string& why) {
  if (exit_code_ >= 0) return;
  exit_code_ = code;
  if (code == 0) {
    OB_LOG(Info) << "stopping: " << why;
  } else {
    OB_LOG(Warn) << "stopping: " << why;
  }
  KillWorkers();
  CloseOutputs();
  for (auto& [slot, s] : standby_) relay_->Close(s.store_client);
  standby_.clear();  // killed and reaped
  if (seed_ != nullptr) {
    StopSeed();
  }
  seed_wanted_.clear();
  uv_timer_stop(&heartbeat_);
  uv_timer_stop(&watchdog_);
  uv_timer_stop(&retry_);
  if (conn_) {
    conn_->SetHandlers(nullptr, nullptr);
    conn_->Close(why);
    conn_.reset();
  }
  for (uv_handle_t* h : {reinterpret_cast<uv_handle_t*>(&heartbeat_),
                         reinterpret_cast<uv_handle_t*>(&watchdog_),
                         reinterpret_cast<uv_handle_t*>(&retry_),
                         reinterpret_cast<uv_handle_t*>(&sigchld_),
                         reinterpret_cast<uv_handle_t*>(&sigterm_),
                         reinterpret_cast<uv_handle_t*>(&sigint_),
                         reinterpret_cast<uv_handle_t*>(&sighup_),
                         reinterpret_cast<uv_handle_t*>(&stdin_)}) {
    if (!uv_is_closing(h)) uv_close(h, nullptr);
  }
  // Give queued frames a moment to go out, but never wait on a stuck peer.
  uv_timer_start(&drain_, [](uv_timer_t* t) { uv_stop(t->loop); }, kDrainMs, 0);
  uv_unref(reinterpret_cast<uv_handle_t*>(&drain_));
}

}  // namespace detail

int RunAgent(const AgentOptions& options) {
  detail::Agent agent(options);
  return agent.Run();
}

}  // namespace ob::launch
