#include "ob/launch/inputs.h"

#include "ob/launch/store_keys.h"
#include "ob/model/data.h"

namespace ob::launch {

std::string InputMismatch(const std::string& flag, const std::string& spec, const std::string& host,
                          const std::string& mine, const std::string& stored) {
  const size_t nl = stored.find('\n');
  const std::string theirs = stored.substr(0, nl);
  if (theirs == mine) return "";
  const std::string who = nl == std::string::npos ? "another reader" : stored.substr(nl + 1);
  return flag + " " + spec + " on host " + host + " is not the file the job reads: " + mine + " here, " +
         theirs + " as " + who + " read it (every host must read the same tokens: give each the same " +
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

}  // namespace ob::launch
