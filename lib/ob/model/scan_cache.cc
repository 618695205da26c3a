#include "ob/model/scan_cache.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "ob/io/file.h"
#include "ob/log.h"

namespace ob::model {
namespace {

std::string EntryName(const struct stat& st) {
  return std::to_string(static_cast<uint64_t>(st.st_dev)) + "-" + std::to_string(static_cast<uint64_t>(st.st_ino));
}

// The directory the environment names, made and checked; "" with one
// warning when it cannot be used.
std::string DefaultDir() {
  std::string dir;
  // A directory the user named that cannot be used is worth a warning; a
  // home directory that cannot take one (read-only, or none, on many
  // compute nodes) is not: each of thousands of workers would say it.
  bool named = false;
  if (const char* d = std::getenv("OB_CACHE_DIR")) {
    dir = d;
    if (dir.empty() || dir == "off") return "";
    named = true;
  } else if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && x[0] == '/') {
    dir = io::JoinPath(x, "ob");
  } else if (const char* h = std::getenv("HOME"); h != nullptr && h[0] == '/') {
    dir = io::JoinPath(io::JoinPath(h, ".cache"), "ob");
  } else {
    return "";
  }
  const log::Level level = named ? log::Level::kWarn : log::Level::kDebug;
  if (Status st = io::MakeDirs(dir, "scan cache", 0700); !st.ok()) {
    OB_LOG_AT(level) << "not keeping what reading the data learned (OB_CACHE_DIR=off to say so): "
                     << st.message();
    return "";
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    OB_LOG_AT(level) << "not keeping what reading the data learned: " << dir << " is not a directory";
    return "";
  }
  if (st.st_uid != ::geteuid() || (st.st_mode & 022) != 0) {
    OB_LOG(Warn) << "not using the scan cache " << dir << ": another user may write to it (owner uid "
                 << st.st_uid << ", mode " << std::oct << (st.st_mode & 07777) << std::dec
                 << "), so its entries could vouch for files they never read; give OB_CACHE_DIR a directory of "
                 << "your own";
    return "";
  }
  return dir;
}

}  // namespace

std::string IdentityOf(const struct stat& st) {
  return std::to_string(static_cast<uint64_t>(st.st_dev)) + ":" + std::to_string(static_cast<uint64_t>(st.st_ino)) +
         ":" + std::to_string(static_cast<uint64_t>(st.st_size)) + ":" + std::to_string(TimeNs(st.st_mtim)) + ":" +
         std::to_string(TimeNs(st.st_ctim));
}

ScanCache ScanCache::FromEnvironment() { return ScanCache(DefaultDir()); }

const ScanCache& ScanCache::Default() {
  static const ScanCache cache = FromEnvironment();
  return cache;
}

std::optional<ScanEntry> ScanCache::Find(const struct stat& st) const {
  if (dir_.empty()) return std::nullopt;
  Result<std::string> text = io::ReadFile(io::JoinPath(dir_, EntryName(st)));
  if (!text.ok()) return std::nullopt;
  ScanEntry e;
  std::istringstream in(*text);
  std::string line, magic;
  std::getline(in, magic);
  if (magic != "ob scan 1") return std::nullopt;
  bool have_max = false;
  while (std::getline(in, line)) {
    const size_t sp = line.find(' ');
    if (sp == std::string::npos) return std::nullopt;
    const std::string key = line.substr(0, sp), value = line.substr(sp + 1);
    if (key == "identity") {
      e.identity = value;
    } else if (key == "format") {
      e.format = value;
    } else if (key == "max_token") {
      char* end = nullptr;
      const long v = std::strtol(value.c_str(), &end, 10);
      if (end == value.c_str() || *end != '\0' || v < 0 || v > 0x7fffffffL) return std::nullopt;
      e.max_token = static_cast<int>(v);
      have_max = true;
    } else if (key == "sum") {
      e.sum = value;
    }
  }
  if (e.identity != IdentityOf(st) || e.sum.rfind("xxh3=", 0) != 0 || e.sum.size() != 5 + 16) return std::nullopt;
  if (have_max == e.format.empty()) return std::nullopt;  // a count needs its format, and the reverse
  return e;
}

void ScanCache::Remember(const struct stat& st, ScanEntry e, int64_t pass_start_ns) const {
  if (dir_.empty()) return;
  if (TimeNs(st.st_ctim) > pass_start_ns - kQuietNs || TimeNs(st.st_mtim) > pass_start_ns - kQuietNs) return;
  if (e.format.empty()) {  // a pass that only summed keeps the count of one that counted too
    if (std::optional<ScanEntry> had = Find(st); had && had->sum == e.sum) {
      e.format = had->format;
      e.max_token = had->max_token;
    }
  }
  e.identity = IdentityOf(st);
  std::string text = "ob scan 1\nidentity " + e.identity + "\n";
  if (!e.format.empty()) text += "format " + e.format + "\nmax_token " + std::to_string(e.max_token) + "\n";
  text += "sum " + e.sum + "\n";
  if (Status s = io::WriteFile(io::JoinPath(dir_, EntryName(st)), text); !s.ok()) {
    OB_LOG(Debug) << "scan cache: " << s.message();
  }
}

}  // namespace ob::model
