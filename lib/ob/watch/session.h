// One run of ob-watch: read a metrics stream (a file, stdin, or a live
// master's control socket), feed the Watcher, write events, act on them,
// serve Prometheus, draw the plot, and say how it went.
//
// Threads: a reader thread owns the input descriptor and hands records to
// the session's thread through a queue; the session's thread owns the
// Watcher, the outputs and the actions; the Prometheus server thread reads
// the Watcher's state under the same mutex the session's thread holds while
// it feeds records.
#pragma once

#include <string>

#include "ob/status.h"
#include "ob/watch/actions.h"
#include "ob/watch/state.h"

namespace ob::watch {

struct SessionOptions {
  std::string input;           // a file, "-" for stdin; "" with attach_dir
  std::string attach_dir;      // RUN_DIR: stream from RUN_DIR/control.sock
  std::string control;         // socket for --act ("" = RUN_DIR/control.sock)
  bool act = false;
  bool dry_run = false;        // --act decides and records, sends nothing
  ActionOptions actions;
  DetectorOptions detectors;
  std::string clock;           // "wall", "stream", "" (wall when attached)
  std::string metrics_addr;    // HOST:PORT for Prometheus, "" for none
  std::string plot;            // SVG file, "" for none
  std::string output = "-";    // events: "-" stdout, else a file
  bool json = false;           // JSON lines instead of delimited records
  // "json" or "csv" (the caller checks): write every metrics record as
  // text (records.h) instead of events; no detector runs. "" = events.
  std::string records;
  bool terminal = false;       // stdout is a terminal: a human summary there
  double answer_timeout_s = 5; // the master's answer to one request
};

// The socket the master listens on in `run_dir`.
std::string ControlSocketPath(const std::string& run_dir);

// Runs to the end of the stream (or SIGINT/SIGTERM). With `records`, Ok
// unless the stream or the output fails. Otherwise Ok when no anomaly
// (warning or critical event from a detector) was raised; kNo naming the
// counts when some were; the stream's own error (kDataErr naming the file,
// record and byte offset; kUnavailable when the master cannot be reached)
// after writing every event found before the damage.
Status RunSession(const SessionOptions& options);

}  // namespace ob::watch
