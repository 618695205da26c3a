#include "ob/cluster/hosts.h"

#include <cstdio>
#include <map>
#include <sstream>

#include "ob/io/file.h"

namespace ob::cluster {
namespace {

constexpr size_t kMaxSlurmHosts = 100000;  // a node list larger than any cluster is a typo

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         c == '.' || c == '_' || c == '-';
}

// Addresses: IPv4, IPv6 (hex, ':', '.', '%' zone) or a DNS name.
bool IsValidAddr(std::string_view a) {
  if (a.empty() || a.front() == '-') return false;
  for (char c : a) {
    if (!IsNameChar(c) && c != ':' && c != '%') return false;
  }
  return true;
}

// Parses a whole decimal integer in [lo, hi]; false on anything else.
bool ParseInt(std::string_view s, long lo, long hi, long* out) {
  if (s.empty() || s.size() > 12) return false;
  long v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  if (v < lo || v > hi) return false;
  *out = v;
  return true;
}

std::vector<std::string_view> SplitWords(std::string_view line) {
  std::vector<std::string_view> words;
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
    size_t start = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t' && line[i] != '\r') ++i;
    if (i > start) words.push_back(line.substr(start, i - start));
  }
  return words;
}

std::string Quoted(std::string_view s) {
  std::string out = "'";
  for (char c : s) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned char>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "'";
}

// Pieces of `text` between separators, empty pieces kept ("a,,b" has three).
std::vector<std::string_view> Split(std::string_view text, char sep) {
  std::vector<std::string_view> pieces;
  size_t pos = 0;
  for (;;) {
    size_t end = text.find(sep, pos);
    if (end == std::string_view::npos) {
      pieces.push_back(text.substr(pos));
      return pieces;
    }
    pieces.push_back(text.substr(pos, end - pos));
    pos = end + 1;
  }
}

}  // namespace

bool IsValidHostName(std::string_view name) {
  if (name.empty() || name.front() == '-') return false;
  for (char c : name) {
    if (!IsNameChar(c)) return false;
  }
  return true;
}

Result<std::vector<Host>> ParseHosts(std::string_view text, const std::string& filename) {
  std::vector<Host> hosts;
  std::map<std::string, int> first_line;  // name -> line it was first seen on
  int line_no = 0;
  for (std::string_view line : Split(text, '\n')) {
    ++line_no;
    auto fail = [&](const std::string& what) {
      return Status::Config(filename + ":" + std::to_string(line_no) + ": " + what);
    };
    if (size_t hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    std::vector<std::string_view> words = SplitWords(line);
    if (words.empty()) continue;

    Host host;
    host.line = line_no;
    if (words[0].find('=') != std::string_view::npos) {
      return fail("expected a host name first, got " + Quoted(words[0]));
    }
    if (!IsValidHostName(words[0])) {
      return fail("bad host name " + Quoted(words[0]) +
                  " (use letters, digits, '.', '_' and '-', not starting with '-')");
    }
    host.name = std::string(words[0]);
    bool seen_slots = false, seen_port = false, seen_addr = false;
    for (size_t i = 1; i < words.size(); ++i) {
      std::string_view w = words[i];
      size_t eq = w.find('=');
      if (eq == std::string_view::npos) {
        return fail("host '" + host.name + "': expected key=value, got " + Quoted(w));
      }
      std::string_view key = w.substr(0, eq), value = w.substr(eq + 1);
      auto repeated = [&](bool* seen) {
        if (*seen) return true;
        *seen = true;
        return false;
      };
      long v = 0;
      if (key == "slots") {
        if (repeated(&seen_slots)) return fail("host '" + host.name + "': slots given twice");
        if (!ParseInt(value, 1, 1 << 20, &v)) {
          return fail("host '" + host.name + "': bad slots " + Quoted(value) +
                      " (a whole number >= 1)");
        }
        host.slots = static_cast<int>(v);
      } else if (key == "port") {
        if (repeated(&seen_port)) return fail("host '" + host.name + "': port given twice");
        if (!ParseInt(value, 0, 65535, &v)) {
          return fail("host '" + host.name + "': bad port " + Quoted(value) + " (0..65535)");
        }
        host.port = static_cast<int>(v);
      } else if (key == "addr") {
        if (repeated(&seen_addr)) return fail("host '" + host.name + "': addr given twice");
        if (!IsValidAddr(value)) {
          return fail("host '" + host.name + "': bad addr " + Quoted(value));
        }
        host.addr = std::string(value);
      } else {
        return fail("host '" + host.name + "': unknown key " + Quoted(key) +
                    " (known: slots, port, addr)");
      }
    }
    auto [it, inserted] = first_line.emplace(host.name, line_no);
    if (!inserted) {
      return fail("duplicate host '" + host.name + "' (first on line " +
                  std::to_string(it->second) + ")");
    }
    hosts.push_back(std::move(host));
  }
  if (hosts.empty()) return Status::Config(filename + ": no hosts");
  return hosts;
}

Result<std::vector<Host>> LoadHosts(const std::string& path) {
  // io::ReadFile: "-" is standard input, and a directory is said to be one
  // (an ifstream read it as an empty file: "/tmp: no hosts").
  OB_ASSIGN_OR_RETURN(const std::string text, io::ReadFile(path));
  return ParseHosts(text, io::DisplayName(path));
}

namespace {

// Expands one node-list item (no top-level commas) into `out`.
Status ExpandItem(std::string_view item, std::vector<std::string>* out) {
  std::vector<std::string> partial = {""};
  size_t i = 0;
  while (i < item.size()) {
    if (item[i] == ']') return Status::Config("unmatched ']'");
    if (item[i] != '[') {
      size_t next = item.find_first_of("[]", i);
      if (next == std::string_view::npos) next = item.size();
      for (auto& p : partial) p += item.substr(i, next - i);
      i = next;
      continue;
    }
    size_t close = item.find(']', i);
    if (close == std::string_view::npos) return Status::Config("unmatched '['");
    std::string_view body = item.substr(i + 1, close - i - 1);
    if (body.empty() || body.find('[') != std::string_view::npos) {
      return Status::Config("bad range '[" + std::string(body) + "]'");
    }
    std::vector<std::string> suffixes;
    for (std::string_view r : Split(body, ',')) {
      size_t dash = r.find('-');
      std::string_view a = r.substr(0, dash);
      std::string_view b = dash == std::string_view::npos ? a : r.substr(dash + 1);
      long lo = 0, hi = 0;
      if (!ParseInt(a, 0, 999999999, &lo) || !ParseInt(b, 0, 999999999, &hi)) {
        return Status::Config("bad range '" + std::string(r) + "'");
      }
      if (hi < lo) return Status::Config("reversed range '" + std::string(r) + "'");
      if (static_cast<size_t>(hi - lo) >= kMaxSlurmHosts) {
        return Status::Config("range '" + std::string(r) + "' is too large");
      }
      size_t width = a.size();
      for (long v = lo; v <= hi; ++v) {
        std::string digits = std::to_string(v);
        if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
        suffixes.push_back(std::move(digits));
      }
    }
    if (partial.size() * suffixes.size() > kMaxSlurmHosts) {
      return Status::Config("more than " + std::to_string(kMaxSlurmHosts) + " hosts");
    }
    std::vector<std::string> next;
    next.reserve(partial.size() * suffixes.size());
    for (const auto& pre : partial) {
      for (const auto& s : suffixes) next.push_back(pre + s);
    }
    partial = std::move(next);
    i = close + 1;
  }
  for (auto& p : partial) out->push_back(std::move(p));
  return Status::Ok();
}

}  // namespace

Result<std::vector<Host>> HostsFromSlurm(std::string_view nodelist) {
  auto fail = [&](const Status& s) {
    return Status::Config("slurm node list '" + std::string(nodelist) + "': " + s.message());
  };
  std::vector<std::string> names;
  size_t start = 0;
  int depth = 0;
  for (size_t i = 0; i <= nodelist.size(); ++i) {
    char c = i < nodelist.size() ? nodelist[i] : ',';
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0) return fail(Status::Config("unmatched ']'"));
    if (c == ',' && depth == 0) {
      std::string_view item = nodelist.substr(start, i - start);
      while (!item.empty() && (item.front() == ' ' || item.front() == '\n')) item.remove_prefix(1);
      while (!item.empty() && (item.back() == ' ' || item.back() == '\n')) item.remove_suffix(1);
      if (item.empty()) return fail(Status::Config("empty entry"));
      if (Status s = ExpandItem(item, &names); !s.ok()) return fail(s);
      if (names.size() > kMaxSlurmHosts) {
        return fail(Status::Config("more than " + std::to_string(kMaxSlurmHosts) + " hosts"));
      }
      start = i + 1;
    }
  }
  if (depth != 0) return fail(Status::Config("unmatched '['"));
  std::vector<Host> hosts;
  std::map<std::string, bool> seen;
  for (auto& n : names) {
    if (!IsValidHostName(n)) return fail(Status::Config("bad host name " + Quoted(n)));
    if (!seen.emplace(n, true).second) return fail(Status::Config("duplicate host '" + n + "'"));
    Host h;
    h.name = std::move(n);
    hosts.push_back(std::move(h));
  }
  return hosts;
}

}  // namespace ob::cluster
