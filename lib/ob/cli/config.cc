#include "ob/cli/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <set>

#include "ob/io/file.h"

namespace ob::cli {
namespace {

// What a key's scalar must spell, from its option.
enum class ValueType { kText, kInteger, kUnsigned, kNumber, kFlag, kCount };

ValueType TypeOf(const CLI::Option& o) {
  if (o.get_expected_max() == 0) {
    // A flag: -v counts, --resume-from-other is true or false. A counting
    // flag keeps every result: TakeAll in CLI11 2.1 (bookworm), Sum since
    // 2.2 (trixie's 2.4); a true-or-false one keeps one (TakeLast).
    const CLI::MultiOptionPolicy p = o.get_multi_option_policy();
    const bool keeps_one = p == CLI::MultiOptionPolicy::TakeLast || p == CLI::MultiOptionPolicy::TakeFirst ||
                           p == CLI::MultiOptionPolicy::Throw;
    return keeps_one ? ValueType::kFlag : ValueType::kCount;
  }
  // "INT:NONNEGATIVE": the type, then the validators'.
  const std::string type = o.get_type_name().substr(0, o.get_type_name().find(':'));
  if (type == "INT") return ValueType::kInteger;
  if (type == "UINT") return ValueType::kUnsigned;
  if (type == "FLOAT") return ValueType::kNumber;
  if (type == "BOOLEAN") return ValueType::kFlag;
  return ValueType::kText;
}

bool IsList(const CLI::Option& o) { return o.get_expected_max() > 1; }

// Whether the command line gave `o`. CLI11 2.2 and later give a counting
// flag its default ("0") as a result after a parse without it.
bool GivenOnCommandLine(const CLI::Option& o, ValueType type) {
  if (type == ValueType::kCount && o.count() == 1 && o.results()[0] == o.get_default_str()) return false;
  return o.count() > 0;
}

std::string Expected(ValueType t, bool list) {
  if (list) return "a list";
  switch (t) {
    case ValueType::kInteger: return "an integer";
    case ValueType::kUnsigned: return "an integer, 0 or more";
    case ValueType::kNumber: return "a number";
    case ValueType::kFlag: return "true or false";
    case ValueType::kCount: return "a count";
    case ValueType::kText: break;
  }
  return "a value";
}

bool AllDigits(const std::string& s, size_t from) {
  return s.size() > from && std::all_of(s.begin() + from, s.end(), [](unsigned char c) { return std::isdigit(c); });
}

// "" when `v` spells a `t`, else why not. Ranges are the option's checks'.
std::string SyntaxError(ValueType t, const std::string& v) {
  const std::string quoted = "'" + v + "'";
  switch (t) {
    case ValueType::kInteger:
      return AllDigits(v, v[0] == '-' || v[0] == '+' ? 1 : 0) ? "" : quoted + " is not an integer";
    case ValueType::kUnsigned:
    case ValueType::kCount:
      return AllDigits(v, v[0] == '+' ? 1 : 0) ? "" : quoted + " is not " + Expected(t, false);
    case ValueType::kNumber: {
      char* end = nullptr;
      std::strtod(v.c_str(), &end);
      return !v.empty() && end == v.c_str() + v.size() ? "" : quoted + " is not a number";
    }
    case ValueType::kFlag:
      return v == "true" || v == "false" ? "" : quoted + " is not true or false";
    case ValueType::kText: break;
  }
  return "";
}

// Edits from `a` to `b` (Levenshtein), for "did you mean".
size_t Distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

std::string LongName(const CLI::Option& o) {
  return o.get_lnames().empty() ? o.get_name() : o.get_lnames().front();
}

// The key meant by unknown `key`: the key of the option named so
// ("eval-every" is eval.every), else the nearest within two edits.
std::string Suggest(const std::string& key, const std::vector<ConfigKey>& keys) {
  std::string best;
  size_t best_distance = 3;
  for (const ConfigKey& k : keys) {
    if (LongName(*k.option) == key) return k.Path();
    const size_t d = Distance(key, k.Path());
    if (d < best_distance) best = k.Path(), best_distance = d;
  }
  return best;
}

Status AtLine(const std::string& path, int line, const std::string& message) {
  return Status::Config(io::DisplayName(path) + ":" + std::to_string(line) + ": " + message);
}

int LineOf(const YAML::Node& n, int otherwise) { return n.Mark().is_null() ? otherwise : n.Mark().line + 1; }

// One key's value, for ReadConfig.
Result<ConfigValue> ReadValue(const std::string& key, int line, const YAML::Node& n, const std::string& path) {
  ConfigValue v;
  v.key = key;
  v.line = line;
  if (n.IsNull()) return v;
  if (n.IsMap()) {
    v.kind = ConfigValue::Kind::kMap;
  } else if (n.IsScalar()) {
    v.kind = ConfigValue::Kind::kScalar;
    v.items.push_back(n.Scalar());
    v.item_lines.push_back(LineOf(n, line));
  } else {
    v.kind = ConfigValue::Kind::kList;
    for (const YAML::Node& item : n) {
      if (!item.IsScalar()) {
        return AtLine(path, LineOf(item, line), key + ": expected a list of values, not of " +
                                                    (item.IsMap() ? "mappings" : item.IsNull() ? "empty items" : "lists"));
      }
      v.items.push_back(item.Scalar());
      v.item_lines.push_back(LineOf(item, line));
    }
  }
  return v;
}

// The values of mapping `map`, whose keys are under `section` ("" at the
// top), appended to `out`.
Status ReadMapping(const YAML::Node& map, const std::string& section, const std::string& path,
                   const ConfigSpec& spec, std::vector<ConfigValue>* out) {
  std::map<std::string, int> line_of;
  for (const auto& kv : map) {
    const int line = LineOf(kv.first, 1);
    if (!kv.first.IsScalar() || kv.first.Scalar().empty()) {
      return AtLine(path, line, "a key must be a name (an option's, e.g. steps)");
    }
    const std::string key = (section.empty() ? "" : section + ".") + kv.first.Scalar();
    // yaml-cpp keeps both of a key given twice and reads the first.
    if (auto [it, fresh] = line_of.emplace(key, line); !fresh) {
      return AtLine(path, line, key + " is given twice (line " + std::to_string(it->second) + " too)");
    }
    const bool is_section =
        section.empty() && std::any_of(spec.sections.begin(), spec.sections.end(),
                                       [&](const ConfigSection& s) { return s.name == key; });
    if (is_section && kv.second.IsMap()) {
      OB_RETURN_IF_ERROR(ReadMapping(kv.second, key, path, spec, out));
    } else if (is_section && !kv.second.IsNull()) {
      return AtLine(path, line, key + ": expected a mapping of its options (" + key + ":, then indented keys), not " +
                                    (kv.second.IsScalar() ? "a value" : "a list"));
    } else if (!is_section) {
      OB_ASSIGN_OR_RETURN(ConfigValue v, ReadValue(key, line, kv.second, path));
      out->push_back(std::move(v));
    }
  }
  return Status::Ok();
}

// Gives `o` the items of `v`, checked by the option as on the command line.
Status SetOption(const ConfigValue& v, ValueType type, CLI::Option* o, const std::string& path) {
  for (size_t i = 0; i < v.items.size(); ++i) {
    std::string item = v.items[i];
    if (type == ValueType::kCount) {
      // CLI11 reads a flag's "0" as false, -1: a count of 0 adds nothing.
      item = std::to_string(std::strtoll(item.c_str(), nullptr, 10));
      if (item == "0") continue;
    }
    o->add_result(item);
    try {
      // Every item so far again: a list's error is at the item that caused it.
      o->run_callback();
    } catch (const CLI::ValidationError& e) {
      // "--steps: '-3' must not be negative", the option's name ours to say.
      std::string why = e.what();
      if (const std::string name = o->get_name() + ": "; why.rfind(name, 0) == 0) why.erase(0, name.size());
      return AtLine(path, v.item_lines[i], v.key + ": " + why);
    } catch (const CLI::Error&) {
      // The syntax is checked: what CLI11 cannot convert is too large for its type.
      return AtLine(path, v.item_lines[i], v.key + ": '" + v.items[i] + "' is out of range");
    }
  }
  return Status::Ok();
}

// The value of `o` in ConfigText.
void EmitValue(YAML::Emitter& out, CLI::Option& o) {
  const ValueType type = TypeOf(o);
  const CLI::results_t& given = o.results();
  if (type == ValueType::kFlag || type == ValueType::kCount) {
    // As CLI11 reads them: "true" 1, "false" -1, "3" 3; a count's "0" (CLI11
    // 2.2 and later: its default, as a result) adds nothing, not -1.
    long long sum = 0;
    for (const std::string& r : given) {
      if (type == ValueType::kCount && r == "0") continue;
      sum += CLI::detail::to_flag_value(r);
    }
    if (type == ValueType::kCount) {
      out << std::max(0LL, sum);
    } else {
      out << (!given.empty() && CLI::detail::to_flag_value(given.back()) > 0);
    }
    return;
  }
  if (IsList(o)) {
    out << YAML::BeginSeq;
    for (const std::string& r : given) out << r;
    out << YAML::EndSeq;
    return;
  }
  if (!given.empty()) {
    out << given.back();
    return;
  }
  // The bound variable, untouched by the command line and the file. CLI11
  // writes a double with a stream's 6 significant digits, exact for every
  // default ob has (1e-3, 0.95, 1e-08, ...); an option whose default needs
  // more sets its default_str, which stands.
  if (o.get_default_str().empty()) o.capture_default_str();
  if (o.get_default_str().empty()) {
    out << YAML::Null;
  } else {
    out << o.get_default_str();
  }
}

}  // namespace

std::vector<ConfigKey> ConfigKeys(CLI::App& app, const ConfigSpec& spec) {
  static const std::set<std::string> kNotKeys{"help", "help-all", "version", "config", "print-config"};
  std::vector<ConfigKey> keys;
  for (CLI::Option* o : app.get_options()) {
    if (o->get_group().empty()) continue;  // hidden: for the tool's own processes
    std::string name = o->get_lnames().empty() ? o->get_name() : o->get_lnames().front();
    if (o->get_positional()) std::transform(name.begin(), name.end(), name.begin(), ::tolower);
    if (name.empty() || name[0] == '-' || kNotKeys.count(name) > 0 ||
        std::count(spec.omit.begin(), spec.omit.end(), name) > 0) {
      continue;
    }
    ConfigKey k{o, "", name};
    for (const ConfigSection& s : spec.sections) {
      if (std::count(s.options.begin(), s.options.end(), name) > 0) {
        k.section = s.name;
      } else if (!s.prefix.empty() && name.size() > s.prefix.size() && name.rfind(s.prefix, 0) == 0) {
        k.section = s.name;
        k.name = name.substr(s.prefix.size());
      }
    }
    keys.push_back(k);
  }
  // What a run is of first (plan:, hosts:), then the options.
  std::stable_partition(keys.begin(), keys.end(), [](const ConfigKey& k) { return k.option->get_positional(); });
  return keys;
}

Result<std::vector<ConfigValue>> ReadConfig(const std::string& text, const std::string& path,
                                            const ConfigSpec& spec) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return AtLine(path, e.mark.is_null() ? 1 : e.mark.line + 1, e.msg);
  }
  std::vector<ConfigValue> values;
  if (root.IsNull()) return values;  // an empty file
  if (!root.IsMap()) {
    return AtLine(path, LineOf(root, 1), "expected a mapping of options (steps: 200, ...), not " +
                                             std::string(root.IsScalar() ? "a value" : "a list"));
  }
  try {
    OB_RETURN_IF_ERROR(ReadMapping(root, "", path, spec, &values));
  } catch (const YAML::Exception& e) {
    return AtLine(path, e.mark.is_null() ? 1 : e.mark.line + 1, e.msg);
  }
  return values;
}

Status ApplyConfig(const std::vector<ConfigValue>& values, const std::vector<ConfigKey>& keys,
                   const std::string& path, ConfigOrigins* origins) {
  for (const ConfigValue& v : values) {
    auto k = std::find_if(keys.begin(), keys.end(), [&](const ConfigKey& c) { return c.Path() == v.key; });
    if (k == keys.end()) {
      const std::string near = Suggest(v.key, keys);
      return AtLine(path, v.line, "unknown key '" + v.key + "' (" +
                                      (near.empty() ? "--print-config lists the keys" : "did you mean '" + near + "'?") +
                                      ")");
    }
    CLI::Option* o = k->option;
    const ValueType type = TypeOf(*o);
    const bool list = IsList(*o);
    if (v.kind == ConfigValue::Kind::kMap || (v.kind == ConfigValue::Kind::kList && !list)) {
      return AtLine(path, v.line, v.key + ": expected " + Expected(type, list) + ", not " +
                                      (v.kind == ConfigValue::Kind::kMap ? "a mapping" : "a list"));
    }
    for (size_t i = 0; i < v.items.size(); ++i) {
      if (std::string why = SyntaxError(type, v.items[i]); !why.empty()) {
        return AtLine(path, v.item_lines[i], v.key + ": " + why);
      }
    }
    // The command line's value stands (and its list replaces the file's).
    if (v.kind == ConfigValue::Kind::kNull || GivenOnCommandLine(*o, type)) continue;
    OB_RETURN_IF_ERROR(SetOption(v, type, o, path));
    if (origins != nullptr) (*origins)[LongName(*o)] = io::DisplayName(path) + ":" + std::to_string(v.line);
  }
  return Status::Ok();
}

Status LoadConfig(const std::string& path, const ConfigSpec& spec, const std::vector<ConfigKey>& keys,
                  ConfigOrigins* origins) {
  OB_ASSIGN_OR_RETURN(const std::string text, io::ReadFile(path));
  OB_ASSIGN_OR_RETURN(const std::vector<ConfigValue> values, ReadConfig(text, path, spec));
  return ApplyConfig(values, keys, path, origins);
}

std::string ConfigText(const std::vector<ConfigKey>& keys) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  std::set<std::string> sections_done;
  for (const ConfigKey& k : keys) {
    if (k.section.empty()) {
      out << YAML::Key << k.name << YAML::Value;
      EmitValue(out, *k.option);
      continue;
    }
    // A section where its first option is, with all of its options.
    if (!sections_done.insert(k.section).second) continue;
    out << YAML::Key << k.section << YAML::Value << YAML::BeginMap;
    for (const ConfigKey& in : keys) {
      if (in.section != k.section) continue;
      out << YAML::Key << in.name << YAML::Value;
      EmitValue(out, *in.option);
    }
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

std::string ConfigOriginOf(const std::string& message, const ConfigOrigins& origins) {
  if (message.rfind("--", 0) != 0) return "";
  size_t end = 2;
  while (end < message.size() && (std::isalnum(static_cast<unsigned char>(message[end])) || message[end] == '-')) ++end;
  const auto it = origins.find(message.substr(2, end - 2));
  return it == origins.end() ? "" : it->second;
}

}  // namespace ob::cli
