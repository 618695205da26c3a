// Hosts: the machines a run or a network profile uses (design/launch.md).
//
// A hosts file has one host per line, `name [slots=N] [port=P] [addr=IP]`,
// with `#` comments (whole-line or trailing) and blank lines. Under Slurm the
// allocation's node list (`node[01-03,7],gpu5`) gives the same list without a
// file. Names are limited to [A-Za-z0-9._-]: they are never passed through a
// shell, but a name that would need quoting is refused anyway.
//
// Failure: a malformed file is refused with kConfig and one line naming the
// file and line ("hosts.txt:3: duplicate host 'a' (first on line 1)"); an
// unreadable file is kNoInput. Thread-safety: pure functions over values.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "ob/status.h"

namespace ob::cluster {

struct Host {
  std::string name;   // unique within the list; what --rsh connects to
  int slots = 1;      // workers on this host, >= 1
  int port = 0;       // port for this host's listener; 0 = let the OS choose
  std::string addr;   // address to bind and reach; empty = resolve `name`
  int line = 0;       // line in the hosts file (0 when not from a file)
};

// Parses hosts-file text; `filename` is used in messages only.
// Refuses: no hosts, a duplicate name, an unknown key, a bad or out-of-range
// number (slots < 1, port outside 0..65535), a name outside [A-Za-z0-9._-],
// an empty or repeated key, an address with spaces or shell characters.
Result<std::vector<Host>> ParseHosts(std::string_view text, const std::string& filename);

// Reads and parses the file at `path` ("-": standard input); kNoInput
// naming it when it cannot be read or is a directory.
Result<std::vector<Host>> LoadHosts(const std::string& path);

// Expands a Slurm node list ("node[01-03,7],gpu5", "r[1-2]-n[1-2]"): ranges
// keep the zero padding of their first bound; several bracket groups in one
// name expand as a product in order. Every host gets slots = 1 and line = 0.
// kConfig on malformed lists, reversed ranges, duplicates or more than
// 100000 hosts.
Result<std::vector<Host>> HostsFromSlurm(std::string_view nodelist);

// True when `name` is a non-empty string of [A-Za-z0-9._-] not starting with '-'.
bool IsValidHostName(std::string_view name);

}  // namespace ob::cluster
