// Whole-file reads and writes with `-` meaning stdin/stdout, and atomic
// replacement of output files. Every failure names the file.
#pragma once

#include <string>

#include "ob/status.h"

namespace ob::io {

// Reads all of `path`; "-" reads stdin. Missing/unreadable → kNoInput.
Result<std::string> ReadFile(const std::string& path);

// Writes `data` to `path`: "-" writes stdout; otherwise a temporary file in the
// same directory is written, fsynced and renamed over `path`, so a reader
// never sees a half-written file. Failure → kIoErr, and `path` is untouched.
Status WriteFile(const std::string& path, const std::string& data);

bool IsTerminal(int fd);
bool StdinIsTerminal();
bool StdoutIsTerminal();

// The display name of a path in messages: "<stdin>"/"<stdout>" for "-".
std::string DisplayName(const std::string& path, bool output = false);

}  // namespace ob::io
