#include "ob/io/message.h"

#include <memory>

#include <google/protobuf/util/json_util.h>

#include "ob/io/file.h"

namespace ob::io {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

const FieldDescriptor* Field(const Message& m, const char* name) {
  return m.GetDescriptor()->FindFieldByName(name);
}

}  // namespace

Status ParseMessage(const std::string& bytes, const std::string& name, uint32_t max_version,
                    Message* msg) {
  const std::string type = msg->GetDescriptor()->name();
  if (bytes.empty()) return Status::DataErr(name + ": empty file, expected an ob " + type);
  if (!msg->ParseFromString(bytes))
    return Status::DataErr(name + ": not a valid ob " + type + " (corrupt or truncated)");
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
  if (refl->GetUInt32(*msg, end) != kEndMarker)
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
  const auto* refl = copy->GetReflection();
  refl->SetUInt32(copy.get(), Field(*copy, "format_version"), version);
  refl->SetUInt32(copy.get(), Field(*copy, "end"), kEndMarker);
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
    const auto* refl = copy->GetReflection();
    refl->SetUInt32(copy.get(), Field(*copy, "format_version"), version);
    refl->SetUInt32(copy.get(), Field(*copy, "end"), kEndMarker);
    return WriteFile(path, ToJson(*copy));
  }
  if ((path == "-" || path.empty()) && StdoutIsTerminal())
    return Status::Usage("refusing to write a binary " + msg.GetDescriptor()->name() +
                         " to a terminal; use -o FILE, a pipe, or --json");
  return WriteFile(path, SerializeMessage(msg, version));
}

}  // namespace ob::io
