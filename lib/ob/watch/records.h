// Metrics records as text that tools without our .proto read (ob-watch
// --records): one JSON object per line, or CSV with a header line. Every
// field of the message is written, defaults included, in field-number
// order, so each line has the same keys and every row the same columns.
//
// JSON: field names as in metrics.proto; integers (64-bit too) and finite
// doubles as JSON numbers (doubles round-trip: 17 significant digits);
// NaN and ±infinity as null (a rank that is not the last stage has no
// loss); enums by name; nested messages as nested objects. CSV (RFC 4180):
// nested fields flattened to "checkpoint.step"; NaN as "nan" and
// infinities as "inf"/"-inf" (pandas reads them as floats); a string field
// quoted when it holds a comma, a quote or a line break. Repeated fields
// (Metrics has none) are JSON arrays, and their JSON text in CSV.
//
// Torch-free, pure.
#pragma once

#include <google/protobuf/message.h>

#include <string>

namespace ob::watch {

std::string RecordJson(const google::protobuf::Message& m);
std::string RecordCsvHeader(const google::protobuf::Descriptor& d);
std::string RecordCsvRow(const google::protobuf::Message& m);

}  // namespace ob::watch
