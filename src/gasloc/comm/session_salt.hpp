// The session salt of a job with a secret (../shared design section 13, docs/communication.md
// "Authenticated jobs"): 32 random bytes that gasloc's store server draws when it starts, under
// the job's secret, so that the data plane's channel keys, HKDF(secret, salt, channel), are new at
// every start of the store even where channel names and message counters start over (a resumed
// run, a restarted launcher). A client reads it through the authenticated store (its reply is
// MAC'd), under a key outside every job attempt's prefix; no client can write or delete it, and
// it is not one of the store's keys (getNumKeys does not count it). Without a secret there is no
// salt.
#pragma once
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <string>

namespace gasloc::comm {

inline constexpr const char* kSessionSaltKey = "gasloc/session_salt";
inline constexpr size_t kSessionSaltBytes = 32;

// The salt of the store `raw` connects to (a store client without job_keys' prefix). Throws
// CommError when the store has none (it was started without the job's secret) or it has another
// size.
std::string read_session_salt(c10d::Store& raw);
// The same through a job's keys (job_keys' prefix store) or a raw client.
std::string read_session_salt(const c10::intrusive_ptr<c10d::Store>& store);

}  // namespace gasloc::comm
