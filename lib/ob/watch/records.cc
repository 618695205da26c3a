#include "ob/watch/records.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "ob/io/json.h"

namespace ob::watch {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

std::string Double(double v, bool csv) {
  if (std::isnan(v)) return csv ? "nan" : "null";
  if (std::isinf(v)) return csv ? (v > 0 ? "inf" : "-inf") : "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::string CsvField(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::string JsonText(const std::string& s) {
  std::string out;
  io::AppendJsonString(&out, s);
  return out;
}

// Element `i` of a repeated field, or the singular field when i < 0, as
// JSON, or as a CSV cell (not for messages). A scalar declared `optional`
// and not set (eval_loss on a step without an evaluation) is null, or an
// empty cell: its default would read as a value.
std::string Value(const Message& m, const FieldDescriptor& f, int i, bool csv) {
  const Reflection& r = *m.GetReflection();
  const bool rep = i >= 0;
  if (!rep && f.cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE && f.has_presence() && !r.HasField(m, &f)) {
    return csv ? "" : "null";
  }
  switch (f.cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return std::to_string(rep ? r.GetRepeatedInt32(m, &f, i) : r.GetInt32(m, &f));
    case FieldDescriptor::CPPTYPE_INT64:
      return std::to_string(rep ? r.GetRepeatedInt64(m, &f, i) : r.GetInt64(m, &f));
    case FieldDescriptor::CPPTYPE_UINT32:
      return std::to_string(rep ? r.GetRepeatedUInt32(m, &f, i) : r.GetUInt32(m, &f));
    case FieldDescriptor::CPPTYPE_UINT64:
      return std::to_string(rep ? r.GetRepeatedUInt64(m, &f, i) : r.GetUInt64(m, &f));
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return Double(rep ? r.GetRepeatedDouble(m, &f, i) : r.GetDouble(m, &f), csv);
    case FieldDescriptor::CPPTYPE_FLOAT:
      return Double(rep ? r.GetRepeatedFloat(m, &f, i) : r.GetFloat(m, &f), csv);
    case FieldDescriptor::CPPTYPE_BOOL:
      return (rep ? r.GetRepeatedBool(m, &f, i) : r.GetBool(m, &f)) ? "true" : "false";
    case FieldDescriptor::CPPTYPE_ENUM: {
      const std::string name = (rep ? r.GetRepeatedEnum(m, &f, i) : r.GetEnum(m, &f))->name();
      return csv ? CsvField(name) : JsonText(name);
    }
    case FieldDescriptor::CPPTYPE_STRING: {
      const std::string s = rep ? r.GetRepeatedString(m, &f, i) : r.GetString(m, &f);
      return csv ? CsvField(s) : JsonText(s);
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return RecordJson(rep ? r.GetRepeatedMessage(m, &f, i) : r.GetMessage(m, &f));
  }
  return "null";
}

std::string RepeatedJson(const Message& m, const FieldDescriptor& f) {
  std::string out = "[";
  const int n = m.GetReflection()->FieldSize(m, &f);
  for (int i = 0; i < n; ++i) out += (i ? "," : "") + Value(m, f, i, false);
  return out + "]";
}

// Fields in field-number order (declaration order need not be).
std::vector<const FieldDescriptor*> Fields(const Descriptor& d) {
  std::vector<const FieldDescriptor*> fields;
  for (int i = 0; i < d.field_count(); ++i) fields.push_back(d.field(i));
  std::sort(fields.begin(), fields.end(),
            [](const FieldDescriptor* a, const FieldDescriptor* b) { return a->number() < b->number(); });
  return fields;
}

void Header(const Descriptor& d, const std::string& prefix, std::string* out) {
  for (const FieldDescriptor* f : Fields(d)) {
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !f->is_repeated()) {
      Header(*f->message_type(), prefix + f->name() + ".", out);
    } else {
      *out += (out->empty() ? "" : ",") + CsvField(prefix + f->name());
    }
  }
}

void Row(const Message& m, std::string* out, bool* first) {
  for (const FieldDescriptor* f : Fields(*m.GetDescriptor())) {
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !f->is_repeated()) {
      Row(m.GetReflection()->GetMessage(m, f), out, first);
      continue;
    }
    *out += *first ? "" : ",";
    *first = false;
    *out += f->is_repeated() ? CsvField(RepeatedJson(m, *f)) : Value(m, *f, -1, true);
  }
}

}  // namespace

std::string RecordJson(const Message& m) {
  std::string out = "{";
  bool first = true;
  for (const FieldDescriptor* f : Fields(*m.GetDescriptor())) {
    out += first ? "" : ",";
    first = false;
    out += JsonText(f->name()) + ":" + (f->is_repeated() ? RepeatedJson(m, *f) : Value(m, *f, -1, false));
  }
  return out + "}";
}

std::string RecordCsvHeader(const Descriptor& d) {
  std::string out;
  Header(d, "", &out);
  return out;
}

std::string RecordCsvRow(const Message& m) {
  std::string out;
  bool first = true;
  Row(m, &out, &first);
  return out;
}

}  // namespace ob::watch
