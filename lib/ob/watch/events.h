// Watcher events (ob.pb.Event, metrics.proto): construction, names, and the
// three ways ob-watch writes them — delimited binary records, JSON lines and
// one human line each. Every writer here is deterministic: the evidence map
// is written in key order, so the same events always give the same bytes.
// Pure functions; no shared state.
#pragma once

#include <cstdint>
#include <string>

#include "ob/clock.h"  // FormatUnixMs, for event lines
#include "ob/io/text.h"
#include "ob/metrics.pb.h"

namespace ob::watch {

// "crash", "hang", "straggler", "loss_nan", "loss_spike", "throughput_drop",
// "memory_growth", "recovery", "action"; "unspecified" otherwise.
const char* KindName(pb::EventKind kind);
// "info", "warning", "critical".
const char* SeverityName(pb::Severity severity);

// An event with format_version set; rank −1 when it is about a host or the job.
pb::Event MakeEvent(pb::EventKind kind, pb::Severity severity, const std::string& host,
                    int rank, uint64_t step, uint64_t generation, int64_t unix_ms,
                    std::string message);

// Appends `e` as one length-delimited record (io/records.h framing),
// serialised deterministically.
void AppendEventRecord(const pb::Event& e, std::string* out);

// protobuf's JSON mapping of `e` on one line without the newline: proto
// field names, every field printed, enums by name, 64-bit integers as
// strings, non-finite doubles as "NaN"/"Infinity"/"-Infinity", evidence keys
// sorted. JsonStringToMessage reads it back into an equal Event.
std::string EventJson(const pb::Event& e);

// "2024-05-01T12:00:01.250Z critical crash: MESSAGE" (UTC; no time when
// unix_ms is 0). Every message names its host, rank and step.
std::string EventLine(const pb::Event& e);

// Shortest decimal that reads back as `v` (io/text.h), as events print numbers.
using io::FormatDouble;

}  // namespace ob::watch
