#include "ob/profile/table.h"

#include <string>
#include <vector>

#include "ob/clock.h"
#include "ob/io/text.h"

namespace ob::profile {
namespace {

using io::Format;

double MiB(uint64_t b) { return static_cast<double>(b) / (1 << 20); }

std::string FormatLayers(const pb::Profile& p) {
  std::string out;
  out += Format("#\n# %-9s %5s %12s %10s %10s %9s %9s %10s %10s %11s %9s\n", "layer", "mb", "params",
                "weights", "optimizer", "fwd", "bwd", "activ", "output", "allreduce", "update");
  out += Format("# %-9s %5s %12s %10s %10s %9s %9s %10s %10s %11s %9s\n", "", "", "", "(MiB)", "(MiB)",
                "(ms)", "(ms)", "(MiB)", "(MiB)", "(ms,max g)", "(ms)");
  double fwd = 0, bwd = 0, update = 0;
  uint64_t params = 0;
  const uint32_t first_mb = p.microbatch_sizes_size() > 0 ? p.microbatch_sizes(0) : 0;
  for (const auto& l : p.layers()) {
    params += l.parameter_count() - l.tied_parameter_count();
    update += l.update_seconds();
    double ar = 0;  // the gradient's, over the largest group timed
    for (const auto& a : l.allreduce())
      if (a.bytes() == l.gradient_bytes()) ar = a.seconds() * 1e3;
    for (const auto& c : l.costs()) {
      out += Format("  %-9s %5u %12llu %10.2f %10.2f %9.3f %9.3f %10.2f %10.3f %11.3f %9.3f\n",
                    l.name().c_str(), c.microbatch(),
                    static_cast<unsigned long long>(l.parameter_count()), MiB(l.parameter_bytes()),
                    MiB(l.optimizer_state_bytes()), c.forward_seconds() * 1e3,
                    c.backward_seconds() * 1e3, MiB(c.activation_bytes()), MiB(c.output_bytes()), ar,
                    l.update_seconds() * 1e3);
      if (c.microbatch() == first_mb) {
        fwd += c.forward_seconds();
        bwd += c.backward_seconds();
      }
    }
  }
  out += Format("# total parameters: %llu (tied embedding counted once)\n",
                static_cast<unsigned long long>(params));
  out += Format("# one micro-batch of %u through all layers: forward %.3f ms, backward %.3f ms; "
                "the update of all layers once a step: %.3f ms\n",
                first_mb, fwd * 1e3, bwd * 1e3, update * 1e3);
  return out;
}

std::string FormatNetwork(const pb::NetworkMatrix& n) {
  std::string out = Format("#\n# bandwidth (MB/s), row = from, column = to; %u parallel rounds\n",
                           n.rounds());
  out += Format("# %-14s", "");
  for (const auto& h : n.hosts()) out += Format(" %12.12s", h.c_str());
  out += "\n";
  const int hosts = n.hosts_size();
  std::vector<double> bw(hosts * hosts, 0), lat(hosts * hosts, 0);
  for (const auto& l : n.links()) {
    bw[l.src() * hosts + l.dst()] = l.bandwidth_bytes_per_s();
    lat[l.src() * hosts + l.dst()] = l.latency_seconds();
  }
  for (int i = 0; i < hosts; ++i) {
    out += Format("  %-14.14s", n.hosts(i).c_str());
    for (int j = 0; j < hosts; ++j)
      out += i == j ? Format(" %12s", "-") : Format(" %12.1f", bw[i * hosts + j] / 1e6);
    out += "\n";
  }
  out += "#\n# latency (us), one way\n";
  for (int i = 0; i < hosts; ++i) {
    out += Format("  %-14.14s", n.hosts(i).c_str());
    for (int j = 0; j < hosts; ++j)
      out += i == j ? Format(" %12s", "-") : Format(" %12.1f", lat[i * hosts + j] * 1e6);
    out += "\n";
  }
  out += "# measured " + FormatUtcSeconds(static_cast<int64_t>(n.measured_unix_ms())) + "\n";
  return out;
}

}  // namespace

std::string FormatProfile(const pb::Profile& p) {
  std::string out;
  const auto& m = p.model();
  const char* mode = p.mode() == pb::PROFILE_MEASURED   ? "measured"
                     : p.mode() == pb::PROFILE_ANALYTIC ? "analytic"
                                                        : "network";
  out += Format("# ob profile (%s), format %u\n", mode, p.format_version());
  if (p.mode() == pb::PROFILE_NETWORK) return out + FormatNetwork(p.network());
  out += Format("# model %s: %u blocks, hidden %u, %u heads, context %u, vocabulary %u\n",
                m.name().c_str(), m.n_layer(), m.n_embd(), m.n_head(), m.n_positions(),
                m.vocab_size());
  out += Format("# device %s (%s), dtype %s, sequence %u", p.device().kind().c_str(),
                p.device().name().c_str(), p.dtype().c_str(), p.sequence_length());
  if (p.mode() == pb::PROFILE_MEASURED)
    out += Format(", %u warm-ups, %s of %u", p.warmup(), p.device().kind() == "cuda" ? "median" : "mean",
                  p.repeats());  // measured.cc keeps the mean on the CPU
  else
    out += Format(", %.0f TFLOP/s x %.2f", p.device().peak_tflops(), p.device().efficiency());
  out += "\n";
  if (p.device().concurrency() > 1) {
    out += Format("# timed with %u processes computing at once", p.device().concurrency());
    if (p.device().contention_size() > 0) {
      out += "; slowdown with 1.." + std::to_string(p.device().contention_size()) + " computing:";
      for (double x : p.device().contention()) out += Format(" %.2f", x);
    }
    out += "\n";
  }
  if (p.mode() == pb::PROFILE_MEASURED && p.warmup() == 0)
    out += "# WARNING: no warm-up runs; the first repetitions include one-time costs\n";
  if (p.mode() == pb::PROFILE_MEASURED && p.repeats() < 3)
    out += "# WARNING: fewer than 3 repetitions; medians are not robust\n";
  return out + FormatLayers(p);
}

}  // namespace ob::profile
