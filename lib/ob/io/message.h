// Reading and writing ob's top-level protobuf files (Profile, Plan, Manifest).
//
// Every top-level message has `format_version` (field 1) and `end` (field
// 2047, the type's end marker). Field 2047 is serialised last, so a file that was
// cut short lacks it even when the cut falls between two fields, which plain
// protobuf parsing cannot notice. Readers refuse versions newer than theirs.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include <google/protobuf/message.h>

#include "ob/status.h"

namespace ob::io {

// Each file type ends with its own marker, so a Plan given where a Profile
// is expected is named for what it is rather than misread.
inline constexpr uint32_t kEndMarker = 0x0b0b0b0b;         // Profile
inline constexpr uint32_t kPlanEndMarker = 0x0b0b0b0c;
inline constexpr uint32_t kManifestEndMarker = 0x0b0b0b0d;
// The marker of a top-level message type ("ob.pb.Plan"), 0 if it has none.
uint32_t EndMarkerFor(const std::string& full_type_name);

// Current versions written by this build; readers accept 1..current.
inline constexpr uint32_t kProfileFormatVersion = 1;
inline constexpr uint32_t kPlanFormatVersion = 1;
inline constexpr uint32_t kMetricsFormatVersion = 1;
inline constexpr uint32_t kEventFormatVersion = 1;
inline constexpr uint32_t kManifestFormatVersion = 1;

// Parses `bytes` (read from `name`) into `msg` and checks version and end
// marker. Bytes that start with '{' are read as the --json form. kDataErr: "NAME: truncated ...", "NAME: not an ob Profile ...",
// "NAME: format_version 9 is newer than this ob reads (1) ...".
Status ParseMessage(const std::string& bytes, const std::string& name, uint32_t max_version,
                    google::protobuf::Message* msg);

// Reads `path` ("-" = stdin) and parses it as above; kNoInput if unreadable.
Status LoadMessage(const std::string& path, uint32_t max_version, google::protobuf::Message* msg);

// Serialises with format_version set to `version` and the end marker set.
std::string SerializeMessage(const google::protobuf::Message& msg, uint32_t version);

// protobuf's JSON mapping: proto field names, defaults printed, indented.
std::string ToJson(const google::protobuf::Message& msg);

// A field whose value differs between two messages of one type, as
// protobuf's text format prints it (a repeated field as "[x,y]").
struct FieldDifference {
  std::string name, a, b;
};
// The fields of `a` and `b` (one type) that differ, in declaration order,
// those numbered in `skip` left out. A field added to the type later is
// compared without a change in the callers.
std::vector<FieldDifference> FieldDifferences(const google::protobuf::Message& a,
                                              const google::protobuf::Message& b,
                                              std::initializer_list<int> skip = {});

// Writes `msg` to `path` ("-" = stdout): JSON when `json`, else binary.
// Binary to a terminal is refused (kUsage) with a message naming -o and --json.
Status WriteMessage(const std::string& path, const google::protobuf::Message& msg,
                    uint32_t version, bool json);

}  // namespace ob::io
