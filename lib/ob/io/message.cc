#include "ob/io/message.h"

#include <algorithm>
#include <memory>

#include <google/protobuf/text_format.h>
#include <google/protobuf/util/json_util.h>

#include "ob/io/file.h"
#include "ob/log.h"

namespace ob::io {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

const FieldDescriptor* Field(const Message& m, const char* name) {
  return m.GetDescriptor()->FindFieldByName(name);
}

struct Marker {
  const char* type;
  const char* name;
  uint32_t marker;
};
constexpr Marker kMarkers[] = {{"ob.pb.Profile", "Profile", kEndMarker},
                               {"ob.pb.Plan", "Plan", kPlanEndMarker},
                               {"ob.pb.Manifest", "Manifest", kManifestEndMarker}};

void SetHeader(Message* m, uint32_t version) {
  const auto* refl = m->GetReflection();
  refl->SetUInt32(m, Field(*m, "format_version"), version);
  refl->SetUInt32(m, Field(*m, "end"), EndMarkerFor(m->GetDescriptor()->full_name()));
}

}  // namespace

uint32_t EndMarkerFor(const std::string& full_type_name) {
  for (const auto& m : kMarkers)
    if (full_type_name == m.type) return m.marker;
  return 0;
}

Status ParseMessage(const std::string& bytes, const std::string& name, uint32_t max_version,
                    Message* msg) {
  const std::string type = msg->GetDescriptor()->name();
  if (bytes.empty()) return Status::DataErr(name + ": empty file, expected an ob " + type);
  const size_t first = bytes.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && bytes[first] == '{') {
    // The --json form, e.g. edited by hand or by a script.
    google::protobuf::util::JsonParseOptions opts;
    auto st = google::protobuf::util::JsonStringToMessage(bytes, msg, opts);
    if (!st.ok())
      // The parser quotes the input: printable ASCII only, so the message
      // stays one line whatever the file holds.
      return Status::DataErr(name + ": not a valid ob " + type + " in JSON: " +
                             log::Printable(std::string(st.message()), 200));
  } else if (!msg->ParseFromString(bytes)) {
    // Another type's file may not even parse as this one: its last field,
    // the end marker (tag 2047, fixed32: bytes fd 7f + 4), still names it.
    if (bytes.size() >= 6 && static_cast<uint8_t>(bytes[bytes.size() - 6]) == 0xfd &&
        static_cast<uint8_t>(bytes[bytes.size() - 5]) == 0x7f) {
      uint32_t tail = 0;
      for (int i = 0; i < 4; ++i)
        tail |= static_cast<uint32_t>(static_cast<uint8_t>(bytes[bytes.size() - 4 + i])) << (8 * i);
      for (const auto& m : kMarkers)
        if (tail == m.marker && m.type != msg->GetDescriptor()->full_name())
          return Status::DataErr(name + ": is an ob " + m.name + ", not a " + type);
    }
    return Status::DataErr(name + ": not a valid ob " + type + " (corrupt or truncated)");
  }
  const FieldDescriptor* ver = Field(*msg, "format_version");
  const FieldDescriptor* end = Field(*msg, "end");
  assert(ver && end && "top-level messages carry format_version and end");
  const auto* refl = msg->GetReflection();
  uint32_t v = refl->GetUInt32(*msg, ver);
  if (v == 0) return Status::DataErr(name + ": not an ob " + type + " (no format_version)");
  if (v > max_version)
    return Status::DataErr(name + ": format_version " + std::to_string(v) +
                           " is newer than this ob reads (" + std::to_string(max_version) +
                           "); upgrade ob");
  const uint32_t got = refl->GetUInt32(*msg, end);
  for (const auto& m : kMarkers) {
    if (got == m.marker && m.marker != EndMarkerFor(msg->GetDescriptor()->full_name()))
      return Status::DataErr(name + ": is an ob " + m.name + ", not a " + type);
  }
  if (got != EndMarkerFor(msg->GetDescriptor()->full_name()))
    return Status::DataErr(name + ": truncated " + type + " (end marker missing after " +
                           std::to_string(bytes.size()) + " bytes)");
  return Status::Ok();
}

Status LoadMessage(const std::string& path, uint32_t max_version, Message* msg) {
  OB_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
  return ParseMessage(bytes, DisplayName(path), max_version, msg);
}

std::string SerializeMessage(const Message& msg, uint32_t version) {
  std::unique_ptr<Message> copy(msg.New());
  copy->CopyFrom(msg);
  SetHeader(copy.get(), version);
  std::string out;
  copy->SerializeToString(&out);
  return out;
}

std::string ToJson(const Message& msg) {
  google::protobuf::util::JsonPrintOptions opts;
  opts.add_whitespace = true;
  opts.always_print_primitive_fields = true;
  opts.preserve_proto_field_names = true;
  std::string out;
  auto st = google::protobuf::util::MessageToJsonString(msg, &out, opts);
  assert(st.ok());
  (void)st;
  return out;
}

Status WriteMessage(const std::string& path, const Message& msg, uint32_t version, bool json) {
  if (json) {
    std::unique_ptr<Message> copy(msg.New());
    copy->CopyFrom(msg);
    SetHeader(copy.get(), version);
    return WriteFile(path, ToJson(*copy));
  }
  if ((path == "-" || path.empty()) && StdoutIsTerminal())
    return Status::Usage("refusing to write a binary " + msg.GetDescriptor()->name() +
                         " to a terminal; use -o FILE, a pipe, or --json");
  return WriteFile(path, SerializeMessage(msg, version));
}

std::vector<FieldDifference> FieldDifferences(const google::protobuf::Message& a,
                                              const google::protobuf::Message& b,
                                              std::initializer_list<int> skip) {
  const google::protobuf::Descriptor* d = a.GetDescriptor();
  const google::protobuf::Reflection* r = a.GetReflection();
  std::vector<FieldDifference> out;
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    if (std::find(skip.begin(), skip.end(), f->number()) != skip.end()) continue;
    auto text = [&](const google::protobuf::Message& m) {
      std::string t;
      if (!f->is_repeated()) {
        google::protobuf::TextFormat::PrintFieldValueToString(m, f, -1, &t);
        return t;
      }
      for (int k = 0; k < r->FieldSize(m, f); ++k) {
        std::string e;
        google::protobuf::TextFormat::PrintFieldValueToString(m, f, k, &e);
        t += (k == 0 ? "" : ",") + e;
      }
      return "[" + t + "]";
    };
    std::string x = text(a), y = text(b);
    if (x != y) out.push_back({f->name(), std::move(x), std::move(y)});
  }
  return out;
}

}  // namespace ob::io
