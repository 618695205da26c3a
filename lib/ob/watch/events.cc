#include "ob/watch/events.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include "ob/io/json.h"

namespace ob::watch {
namespace {

void JsonString(const std::string& s, std::string* out) { io::AppendJsonString(out, s); }

std::string JsonDouble(double v) {
  if (std::isnan(v)) return "\"NaN\"";
  if (std::isinf(v)) return v > 0 ? "\"Infinity\"" : "\"-Infinity\"";
  return FormatDouble(v);
}

}  // namespace

const char* KindName(pb::EventKind kind) {
  switch (kind) {
    case pb::EVENT_CRASH: return "crash";
    case pb::EVENT_HANG: return "hang";
    case pb::EVENT_STRAGGLER: return "straggler";
    case pb::EVENT_LOSS_NAN: return "loss_nan";
    case pb::EVENT_LOSS_SPIKE: return "loss_spike";
    case pb::EVENT_THROUGHPUT_DROP: return "throughput_drop";
    case pb::EVENT_MEMORY_GROWTH: return "memory_growth";
    case pb::EVENT_RECOVERY: return "recovery";
    case pb::EVENT_ACTION: return "action";
    default: return "unspecified";
  }
}

const char* SeverityName(pb::Severity severity) {
  switch (severity) {
    case pb::SEVERITY_INFO: return "info";
    case pb::SEVERITY_WARNING: return "warning";
    case pb::SEVERITY_CRITICAL: return "critical";
    default: return "unspecified";
  }
}

pb::Event MakeEvent(pb::EventKind kind, pb::Severity severity, const std::string& host,
                    int rank, uint64_t step, uint64_t generation, int64_t unix_ms,
                    std::string message) {
  pb::Event e;
  e.set_format_version(1);
  e.set_kind(kind);
  e.set_severity(severity);
  e.set_host(host);
  e.set_rank(rank);
  e.set_step(step);
  e.set_generation(generation);
  e.set_unix_ms(unix_ms);
  e.set_message(std::move(message));
  return e;
}

void AppendEventRecord(const pb::Event& e, std::string* out) {
  std::string body;
  {
    google::protobuf::io::StringOutputStream s(&body);
    google::protobuf::io::CodedOutputStream c(&s);
    c.SetSerializationDeterministic(true);
    e.SerializeToCodedStream(&c);
  }
  uint64_t n = body.size();
  while (n >= 0x80) {
    out->push_back(static_cast<char>((n & 0x7f) | 0x80));
    n >>= 7;
  }
  out->push_back(static_cast<char>(n));
  *out += body;
}

std::string EventJson(const pb::Event& e) {
  std::string o = "{\"format_version\":" + std::to_string(e.format_version());
  o += ",\"kind\":\"" + pb::EventKind_Name(e.kind()) + "\"";
  o += ",\"severity\":\"" + pb::Severity_Name(e.severity()) + "\"";
  o += ",\"host\":";
  JsonString(e.host(), &o);
  o += ",\"rank\":" + std::to_string(e.rank());
  o += ",\"step\":\"" + std::to_string(e.step()) + "\"";
  o += ",\"unix_ms\":\"" + std::to_string(e.unix_ms()) + "\"";
  o += ",\"message\":";
  JsonString(e.message(), &o);
  o += ",\"evidence\":{";
  const std::map<std::string, double> sorted(e.evidence().begin(), e.evidence().end());
  bool first = true;
  for (const auto& [k, v] : sorted) {
    if (!first) o += ",";
    first = false;
    JsonString(k, &o);
    o += ":" + JsonDouble(v);
  }
  o += "},\"generation\":\"" + std::to_string(e.generation()) + "\"";
  o += ",\"request\":";
  JsonString(e.request(), &o);
  o += ",\"response\":";
  JsonString(e.response(), &o);
  o += ",\"run\":";
  JsonString(e.run(), &o);
  o += "}";
  return o;
}

std::string EventLine(const pb::Event& e) {
  std::string o;
  if (e.unix_ms() != 0) o = FormatUnixMs(e.unix_ms()) + " ";
  // The message names host, rank and step itself.
  o += std::string(SeverityName(e.severity())) + " " + KindName(e.kind()) + ": " + e.message();
  return o;
}

}  // namespace ob::watch
