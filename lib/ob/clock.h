// Wall-clock time as the formats carry it: milliseconds since the Unix
// epoch, and its two printed forms; and a steady clock for durations.
// Thread-safe; no state.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace ob {

// Milliseconds since the Unix epoch (system clock: comparable across hosts
// as far as their clocks agree; use a steady clock for durations). Plus
// $OB_TEST_CLOCK_SKEW_MS, read once, for tests of hosts whose clocks
// disagree.
int64_t UnixMs();

// Milliseconds of the steady clock (std::chrono::steady_clock): only
// differences mean anything; never goes back.
int64_t SteadyMs();

// Seconds of the steady clock since `start`: how long something took.
double SecondsSince(std::chrono::steady_clock::time_point start);

// "2023-11-14T22:13:20.123Z" (RFC 3339, UTC, milliseconds): log and event lines.
std::string FormatUnixMs(int64_t unix_ms);

// "2023-11-14 22:13:20 UTC": tables for people.
std::string FormatUtcSeconds(int64_t unix_ms);

}  // namespace ob
