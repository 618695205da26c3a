// Text for people: printf into a string, fixed decimals, XML escaping and
// axis ticks for the SVG pictures (ob-plan --schedule-svg, ob-watch --plot).
// Torch-free, pure.
#pragma once

#include <string>
#include <vector>

namespace ob::io {

// printf's formatting into a string, of any length.
std::string Format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// Whether `s` ends with `suffix`.
bool EndsWith(const std::string& s, const std::string& suffix);

// `s` in single quotes, for messages: 'name'.
std::string Quote(const std::string& s);

// `s` without the spaces, tabs, carriage returns and newlines around it.
std::string Trim(const std::string& s);

// A 64-bit hash as `prefix` and 16 lowercase hex digits: HashText("xxh3:", h)
// gives "xxh3:00ab…", how manifests, plans and data fingerprints write one.
std::string HashText(const char* prefix, unsigned long long h);

// The first `shown` of `names` joined by ", ", and " and N more" for the
// rest: "node1, node2, node3 and 1021 more". A message about 1,024 hosts
// stays one line a person can read.
std::string NameSome(const std::vector<std::string>& names, size_t shown);

// `v` with `decimals` digits after the point ("%.*f").
std::string Fixed(double v, int decimals);

// Shortest decimal that reads back as `v` ("0.1", "1e-05"); "nan", "inf", "-inf".
std::string FormatDouble(double v);

// `s` as XML text or attribute value: & < > " ' escaped, control characters
// other than tab dropped (XML 1.0 has no place for them), other bytes, UTF-8
// included, as they are.
std::string XmlEscape(const std::string& s);

// A round step (1, 2 or 5 × 10^k) that cuts `span` into at most about
// `ticks` parts; 1 for a span that is not positive.
double TickStep(double span, int ticks);

}  // namespace ob::io
