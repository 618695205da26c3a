#include "ob/launch/inputs.h"

#include <chrono>
#include <thread>

#include "ob/io/file.h"
#include "ob/io/text.h"
#include "ob/launch/store_keys.h"
#include "ob/log.h"
#include "ob/model/data.h"

namespace ob::launch {

std::string InputMismatch(const std::string& flag, const std::string& spec, const std::string& host,
                          const std::string& mine, const std::string& stored, bool sums) {
  const size_t nl = stored.find('\n');
  const std::string theirs = stored.substr(0, nl);
  if (theirs == mine) return "";
  const std::string who = nl == std::string::npos ? "another reader" : stored.substr(nl + 1);
  const std::string what = sums ? " over every byte" : "";
  return flag + " " + spec + " on host " + host + " is not the file the job reads: " +
         (sums ? "its bytes differ, though its size and ends may agree: " : "") + mine + what + " here, " +
         theirs + what + " as " + who + " read it (every host must read the same tokens: give each the same " +
         "file, or put it on a shared file system)";
}

Status AgreeOnInput(Store& store, const std::string& flag, const std::string& spec, const std::string& host,
                    const std::string& who) {
  if (spec.empty() || spec == "synthetic") return Status::Ok();
  const std::string mine = model::DataFingerprint(spec);
  if (mine.empty()) return Status::Ok();
  OB_ASSIGN_OR_RETURN(std::string stored, store.CompareSet(InputKey(flag), "", InputValue(mine, who)));
  const std::string why = InputMismatch(flag, spec, host, mine, stored);
  return why.empty() ? Status::Ok() : Status::DataErr(why);
}

Status AgreeOnContent(Store& store, const std::string& flag, const std::string& spec, const std::string& host,
                      const std::string& who, const std::string& sum) {
  if (sum.empty()) return Status::Ok();
  OB_ASSIGN_OR_RETURN(std::string stored, store.CompareSet(InputSumKey(flag), "", InputValue(sum, who)));
  const std::string why = InputMismatch(flag, spec, host, sum, stored, /*sums=*/true);
  return why.empty() ? Status::Ok() : Status::DataErr(why);
}

Status SameCheckpointDir(Store& store, const std::string& dir, const std::string& host, int patience_ms) {
  if (dir.empty()) return Status::Ok();
  OB_ASSIGN_OR_RETURN(bool published, store.Check({CheckpointDirKey()}));
  if (!published) return Status::Ok();
  OB_ASSIGN_OR_RETURN(std::string want, store.Get(CheckpointDirKey(), std::chrono::milliseconds(10000)));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(patience_ms);
  for (;;) {
    Result<std::string> read = io::ReadFile(dir + "/.lock");
    const std::string seen = read.ok() ? io::Trim(*read) : "";
    if (read.ok() && seen == want) return Status::Ok();
    if (std::chrono::steady_clock::now() >= deadline) {
      const std::string what =
          read.ok() ? "its .lock says \"" + log::Printable(seen, 200) + "\", the master's \"" + want + "\""
                    : "no .lock of the master's there (" + read.status().message() + ")";
      return Status::Config("--ckpt-dir " + dir + " on host " + host +
                            " is not the directory the master saves into: " + what +
                            " (checkpoints need one directory that every host and the master share: NFS, "
                            "Lustre, ...)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
}

}  // namespace ob::launch
